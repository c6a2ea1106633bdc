"""Conv1dFwd."""

from ._forward import ForwardConvOp
from ._geometry import LAYOUT_1D, conv_params


class Conv1dFwd(ForwardConvOp):
    """y = F.conv1d(input, weight, bias, stride, padding, dilation, groups): input [N, C_in, L_in],
    weight [C_out, C_in/groups, kW], optional bias [C_out], output [N, C_out, L_out] with
    L_out = (L_in + 2*padding - dilation*(kW-1) - 1) // stride + 1; output in the input dtype.
    stride/padding/dilation are ints (a one-element list is accepted too)."""

    name = "Conv1dFwd"
    summary = "1-d convolution (PyTorch F.conv1d), NCL"
    layout = LAYOUT_1D
    params = conv_params(LAYOUT_1D)
