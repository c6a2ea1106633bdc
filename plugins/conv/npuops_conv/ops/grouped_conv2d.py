"""GroupedConv2d."""

from ._forward import ForwardConvOp
from ._geometry import LAYOUT_2D, conv_params


class GroupedConv2d(ForwardConvOp):
    """Grouped 2-d convolution (ResNeXt): F.conv2d with ``groups`` > 1, input channels split into
    groups each convolved with its own C_out/groups filters. Input [N, C_in, H, W], weight
    [C_out, C_in/groups, kH, kW], optional bias [C_out], output in the input dtype."""

    name = "GroupedConv2d"
    summary = "grouped 2-d convolution (ResNeXt-style)"
    layout = LAYOUT_2D
    params = conv_params(LAYOUT_2D)
