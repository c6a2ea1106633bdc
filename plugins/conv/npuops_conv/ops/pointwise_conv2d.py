"""PointwiseConv2d."""

from ._forward import ForwardConvOp
from ._geometry import LAYOUT_2D, conv_params, forward_geometry

_EXCLUDED = {"kH", "kW", "dilation", "groups"}  # fixed by the definition: 1x1, undilated, dense


class PointwiseConv2d(ForwardConvOp):
    """Pointwise (1x1) 2-d convolution: F.conv2d with a 1x1 kernel and groups = 1, i.e. a matmul
    over channels at every (strided) pixel. Input [N, C_in, H, W], weight [C_out, C_in, 1, 1],
    optional bias [C_out], output [N, C_out, H_out, W_out] in the input dtype."""

    name = "PointwiseConv2d"
    summary = "1x1 convolution (channel mixing per pixel)"
    layout = LAYOUT_2D
    params = {k: v for k, v in conv_params(LAYOUT_2D).items() if k not in _EXCLUDED}

    def resolve_geometry(self, where, w, cfg):
        return forward_geometry(where, w, cfg, self.layout, kernel=(1, 1))
