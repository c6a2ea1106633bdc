"""GroupNormBwd."""

import torch

from ._group_norm import GroupNormOp, group_norm_dims
from ._stat_norm import activations, affine_weight, channels, gradients, mean_invstd


class GroupNormBwd(GroupNormOp):
    """Backward of GroupNormFwd, as autograd of ``F.group_norm`` runs it
    (``aten::native_group_norm_backward``).

    Inputs: grad_out (x's shape and dtype), x: [N, C, *spatial], the saved mean and rstd:
    [N, num_groups] in x's dtype (f32 for an f32 weight beside 16-bit x) as GroupNormFwd returns
    them, and weight: [C] in the workload's
    dtype when ``affine``; the bias does not enter the backward (workloads name it to describe the
    forward). With x_hat = (x - mean) * rstd per (n, group), w = weight[c] (1 without affine) and
    M = C/num_groups * prod(spatial) elements per group:
    grad_input = rstd * (w * grad_out - mean_group(w * grad_out) - x_hat * mean_group(w * grad_out * x_hat))
    in x's dtype; with ``affine`` also grad_weight[c] = sum over n, spatial of grad_out * x_hat and
    grad_bias[c] = sum over n, spatial of grad_out, in the weight's dtype.

    Returns grad_input, or (grad_input, grad_weight, grad_bias) with ``affine``.

    FLOPs: 7 per element: 3 for the per-(n, c) sums of grad_out and grad_out * x, 4 for
    grad_input = grad_out * a + x * b + c with a per (n, c) and b, c per (n, group).
    """

    name = "GroupNormBwd"
    summary = "Backward of group norm: grad input (and weight, bias when affine)"
    flops_per_element = 7
    affine_needed = ("weight",)

    def kernel_outputs(self, w, run):
        def group_norm_backward(grad_out, x, mean, rstd, weight=None):
            return run(grad_out, x, mean, rstd, weight)

        group_norm_backward.config = run.config
        return group_norm_backward

    def make_inputs(self, w, rng):
        cfg = self.config(w)
        x_shape, dtype = w.shapes["x"], w.dtype_of("x")
        x = activations(rng, x_shape, dtype)
        mean, rstd = mean_invstd(x.reshape(x_shape[0], cfg["num_groups"], -1), 2, cfg["eps"])
        # native_group_norm saves them in f32 only for f32 weights beside 16-bit x.
        stats_dtype = w.dtype_of("weight") if cfg["affine"] else dtype
        inputs = {"grad_out": gradients(rng, x_shape, dtype), "x": x,
                  "mean": mean.to(stats_dtype), "rstd": rstd.to(stats_dtype)}
        if cfg["affine"]:
            inputs["weight"] = affine_weight(rng, (channels(w),), w.dtype_of("weight"))
        return inputs

    def torch_impl(self, w):
        cfg = self.config(w)
        groups, affine = cfg["num_groups"], cfg["affine"]

        def group_norm_backward(grad_out, x, mean, rstd, weight=None):
            grads = torch.ops.aten.native_group_norm_backward(
                grad_out, x, mean, rstd, weight, *group_norm_dims(x.shape), groups, [True, affine, affine]
            )
            return grads if affine else grads[0]

        return group_norm_backward
