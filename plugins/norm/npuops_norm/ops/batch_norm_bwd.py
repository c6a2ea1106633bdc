"""BatchNormBwd."""

import torch

from ._batch_norm import BatchNormOp, reduced_dims
from ._stat_norm import EPS, gradients, mean_invstd


class BatchNormBwd(BatchNormOp):
    """Backward of training-mode batch norm (BatchNormFwd), as autograd runs it.

    Inputs: grad_out (x's shape and dtype), x: [N, C] or [N, C, *spatial], weight: [C] f32, and the
    statistics the forward saved, save_mean and save_invstd: [C] f32 (the biased mean and
    1/sqrt(var + eps) of x per channel). With n = N * prod(spatial), x_hat = (x - save_mean) *
    save_invstd and sums over every dim but 1:
    grad_bias = sum(grad_out); grad_weight = sum(grad_out * x_hat);
    grad_input = weight * save_invstd * (grad_out - grad_bias / n - x_hat * grad_weight / n),
    in x's dtype; grad_weight and grad_bias in f32.

    Returns (grad_input, grad_weight, grad_bias). The formulation calls ``aten::batch_norm_backward``
    (the backward of ``aten::_batch_norm_with_update``), which picks cuDNN's or ATen's kernel as
    autograd of ``F.batch_norm`` does; the empty reserve is what cuDNN's forward leaves for
    NCHW inputs.

    FLOPs: 7 per element: 3 for the sums of grad_out and grad_out * x, 4 for
    grad_input = grad_out * a + x * b + c with per-channel a, b, c.
    """

    name = "BatchNormBwd"
    summary = "Backward of training-mode batch norm: grad input, weight and bias"
    params = {"eps": EPS}
    flops_per_element = 7
    kernel_mode = "backward"

    def kernel_outputs(self, w, run):
        def batch_norm_backward(grad_out, x, weight, save_mean, save_invstd):
            return run(grad_out, x, save_mean, save_invstd, weight)

        batch_norm_backward.config = run.config
        return batch_norm_backward

    def make_inputs(self, w, rng):
        inputs = self.affine_inputs(w, rng, with_bias=False)
        x = inputs["x"]
        save_mean, save_invstd = mean_invstd(x, reduced_dims(x.dim()), self.config(w)["eps"])
        return {"grad_out": gradients(rng, x.shape, x.dtype), **inputs,
                "save_mean": save_mean, "save_invstd": save_invstd}

    def torch_impl(self, w):
        eps = self.config(w)["eps"]

        def batch_norm_backward(grad_out, x, weight, save_mean, save_invstd):
            no_reserve = x.new_empty(0, dtype=torch.uint8)
            return torch.ops.aten.batch_norm_backward(
                grad_out, x, weight, None, None, save_mean, save_invstd, True, eps, [True, True, True], no_reserve
            )

        return batch_norm_backward
