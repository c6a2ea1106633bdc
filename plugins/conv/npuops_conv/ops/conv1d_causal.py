"""Conv1dCausal."""

import torch.nn.functional as F

from ._forward import ForwardConvOp
from ._geometry import BIAS, DILATION, GROUPS, LAYOUT_1D, STRIDE, forward_geometry, kernel_params, size_params


class Conv1dCausal(ForwardConvOp):
    """Causal 1-d convolution: y = F.conv1d(F.pad(input, (P, 0)), weight, bias, stride, 0,
    dilation, groups) with P = (kW-1)*dilation zeros on the left and none on the right: output t
    depends only on inputs at positions <= t*stride, and L_out = ceil(L_in / stride).

    At stride 1 this is EnCodec's causal SConv1d with zero padding (EnCodec defaults to reflect
    padding). At stride > 1 EnCodec pads (kW-1)*dilation - (stride-1) on the left and the rest on
    the right; both give ceil(L_in / stride) outputs, ours with every window ending exactly at
    t*stride, the strictly causal choice. Input [N, C_in, L_in], weight [C_out, C_in/groups, kW],
    optional bias [C_out], output in the input dtype."""

    name = "Conv1dCausal"
    summary = "causal 1-d convolution: left pad (kW-1)*dilation, then F.conv1d"
    layout = LAYOUT_1D
    params = {
        **size_params(LAYOUT_1D), **kernel_params(LAYOUT_1D),
        "stride": STRIDE, "dilation": DILATION, "groups": GROUPS, "bias": BIAS,
    }

    def resolve_geometry(self, where, w, cfg):
        return forward_geometry(where, w, cfg, self.layout, causal=True)

    def torch_impl(self, w):
        g = self.geometry(w)
        (left_pad,), stride, dilation, groups = g.pad_before, g.stride, g.dilation, g.groups

        def causal_conv1d(input, weight, bias=None):
            return F.conv1d(F.pad(input, (left_pad, 0)), weight, bias, stride, 0, dilation, groups)

        return causal_conv1d
