"""DepthwiseConv2d."""

from ._forward import ForwardConvOp
from ._geometry import LAYOUT_2D, conv_params, forward_geometry


class DepthwiseConv2d(ForwardConvOp):
    """Depthwise 2-d convolution: F.conv2d with groups = C_in, each input channel convolved with
    its own C_out/C_in filters (C_out = C_in in MobileNet; any multiple is allowed). Input
    [N, C_in, H, W], weight [C_out, 1, kH, kW], optional bias [C_out], output in the input dtype."""

    name = "DepthwiseConv2d"
    summary = "depthwise 2-d convolution (groups = C_in)"
    layout = LAYOUT_2D
    params = {k: v for k, v in conv_params(LAYOUT_2D).items() if k != "groups"}

    def resolve_geometry(self, where, w, cfg):
        return forward_geometry(where, w, cfg, self.layout, depthwise=True)
