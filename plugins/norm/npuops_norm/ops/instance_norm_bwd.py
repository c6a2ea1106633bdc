"""InstanceNormBwd."""

import torch

from ._instance_norm import InstanceNormOp, as_batch_norm_shape
from ._stat_norm import activations, affine_weight, channels, gradients, mean_invstd, stats_for_aten


class InstanceNormBwd(InstanceNormOp):
    """Backward of InstanceNormFwd (use_input_stats=True), as autograd of ``F.instance_norm`` runs it.

    Inputs: grad_out (x's shape and dtype), x: [N, C, *spatial], weight: [C] in the workload's dtype
    when ``affine``, and the statistics the forward saved, save_mean and save_invstd: [N*C] f32 (the
    biased mean and 1/sqrt(var + eps) of each x[n, c], flattened n-major). Running statistics do not
    enter the backward, nor does the bias: workloads name them only to describe the forward.
    Per (n, c), with m = prod(spatial), x_hat = (x - save_mean) * save_invstd, g = weight[c] (1
    without affine) and sums over spatial: sum_dy = sum(grad_out), sum_dy_xhat = sum(grad_out * x_hat);
    grad_input = g * save_invstd * (grad_out - sum_dy / m - x_hat * sum_dy_xhat / m) in x's dtype;
    with ``affine`` also grad_weight[c] = sum over n of sum_dy_xhat, grad_bias[c] = sum over n of
    sum_dy, in the weight's dtype.

    Returns grad_input, or (grad_input, grad_weight, grad_bias) with ``affine``. The formulation is
    autograd's: ``aten::native_batch_norm_backward`` on x viewed as [1, N*C, *spatial] with the weight
    repeated N times, then the per-instance weight and bias gradients summed over n.

    FLOPs: 7 per element: 3 for the two sums, 4 for grad_input = grad_out * a + x * b + c per (n, c).
    """

    name = "InstanceNormBwd"
    summary = "Backward of instance norm: grad input (and weight, bias when affine)"
    flops_per_element = 7
    affine_needed = ("weight",)

    def kernel_outputs(self, w, run):
        def instance_norm_backward(grad_out, x, save_mean, save_invstd, weight=None):
            return run(grad_out, x, save_mean, save_invstd, weight)

        instance_norm_backward.config = run.config
        return instance_norm_backward

    def make_inputs(self, w, rng):
        cfg = self.config(w)
        x_shape, dtype = w.shapes["x"], w.dtype_of("x")
        x = activations(rng, x_shape, dtype)
        inputs = {"grad_out": gradients(rng, x_shape, dtype), "x": x}
        if cfg["affine"]:
            inputs["weight"] = affine_weight(rng, (channels(w),), w.dtype_of("weight"))
        save_mean, save_invstd = mean_invstd(x.reshape(x_shape[0] * x_shape[1], -1), 1, cfg["eps"])
        return {**inputs, "save_mean": save_mean, "save_invstd": save_invstd}

    def torch_impl(self, w):
        cfg = self.config(w)
        eps, affine = cfg["eps"], cfg["affine"]

        def instance_norm_backward(grad_out, x, save_mean, save_invstd, weight=None):
            n, c = x.shape[:2]
            batch_shape = as_batch_norm_shape(x.shape)
            weight_per_instance = None if weight is None else weight.repeat(n)
            save_mean, save_invstd = stats_for_aten(x, weight_per_instance, save_mean, save_invstd)
            grad_input, grad_weight, grad_bias = torch.ops.aten.native_batch_norm_backward(
                grad_out.reshape(batch_shape), x.reshape(batch_shape), weight_per_instance, None, None,
                save_mean, save_invstd, True, eps, [True, affine, affine],
            )
            grad_input = grad_input.view(x.shape)
            if not affine:
                return grad_input
            return grad_input, grad_weight.view(n, c).sum(0), grad_bias.view(n, c).sum(0)

        return instance_norm_backward
