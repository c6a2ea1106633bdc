"""DilatedConv2d."""

from ._forward import ForwardConvOp
from ._geometry import LAYOUT_2D, conv_params


class DilatedConv2d(ForwardConvOp):
    """Dilated (atrous) 2-d convolution (DeepLab ASPP): F.conv2d with kernel taps ``dilation``
    apart, H_out = (H + 2*padding - dilation*(kH-1) - 1) // stride + 1. Input [N, C_in, H, W],
    weight [C_out, C_in/groups, kH, kW], optional bias [C_out], output in the input dtype."""

    name = "DilatedConv2d"
    summary = "dilated (atrous) 2-d convolution"
    layout = LAYOUT_2D
    params = conv_params(LAYOUT_2D)
