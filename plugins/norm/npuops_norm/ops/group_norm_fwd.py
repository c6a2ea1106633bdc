"""GroupNormFwd."""

import torch

from ._group_norm import GroupNormOp, group_norm_dims
from ._stat_norm import activations, affine_bias, affine_weight, channels


class GroupNormFwd(GroupNormOp):
    """``F.group_norm(x, num_groups, weight, bias, eps)`` with its saved statistics.

    x: [N, C, *spatial]; the C channels form ``num_groups`` groups of C/num_groups consecutive
    channels. Per (n, group), over its C/num_groups * prod(spatial) elements: mean, biased variance
    var, rstd = 1/sqrt(var + eps); y = (x - mean) * rstd, then * weight[c] + bias[c] when ``affine``
    (weight, bias: [C] in the workload's dtype); y in x's dtype.

    Returns (y, mean, rstd) with mean, rstd: [N, num_groups] in x's dtype: what
    ``aten::native_group_norm``, the one kernel F.group_norm runs, returns and autograd saves for
    GroupNormBwd (f32 only for f32 parameters beside 16-bit x, on CPU and CUDA alike).

    FLOPs: 5 per element: 3 for the statistics, 2 for y = x * scale + shift per (n, c).
    """

    name = "GroupNormFwd"
    summary = "Group norm, optional affine, with saved mean and rstd"
    flops_per_element = 5

    def kernel_outputs(self, w, run):
        n, groups = w.shapes["x"][0], self.config(w)["num_groups"]

        def group_norm(x, weight=None, bias=None):
            y, mean, rstd = run(x, weight, bias)
            return y, mean.view(n, groups), rstd.view(n, groups)

        group_norm.config = run.config
        return group_norm

    def make_inputs(self, w, rng):
        c = channels(w)
        inputs = {"x": activations(rng, w.shapes["x"], w.dtype_of("x"))}
        if self.config(w)["affine"]:
            inputs["weight"] = affine_weight(rng, (c,), w.dtype_of("weight"))
            inputs["bias"] = affine_bias(rng, (c,), w.dtype_of("bias"))
        return inputs

    def torch_impl(self, w):
        cfg = self.config(w)
        groups, eps = cfg["num_groups"], cfg["eps"]

        def group_norm(x, weight=None, bias=None):
            return torch.ops.aten.native_group_norm(x, weight, bias, *group_norm_dims(x.shape), groups, eps)

        return group_norm
