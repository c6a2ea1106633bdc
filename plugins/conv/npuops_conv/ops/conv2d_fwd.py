"""Conv2dFwd."""

from ._forward import ForwardConvOp
from ._geometry import LAYOUT_2D, conv_params


class Conv2dFwd(ForwardConvOp):
    """y = F.conv2d(input, weight, bias, stride, padding, dilation, groups): input [N, C_in, H, W],
    weight [C_out, C_in/groups, kH, kW], optional bias [C_out], output [N, C_out, H_out, W_out]
    with H_out = (H + 2*padding - dilation*(kH-1) - 1) // stride + 1; accumulation in fp32
    (the reference), output in the input dtype. stride/padding/dilation are an int or a pair."""

    name = "Conv2dFwd"
    summary = "2-d convolution (PyTorch F.conv2d), NCHW"
    layout = LAYOUT_2D
    params = conv_params(LAYOUT_2D)
