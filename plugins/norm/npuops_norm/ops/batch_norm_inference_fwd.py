"""BatchNormInferenceFwd."""

import torch.nn.functional as F

from ._batch_norm import PARAM_DTYPE, BatchNormOp
from ._stat_norm import EPS, channels, running_stats


class BatchNormInferenceFwd(BatchNormOp):
    """Inference-mode batch norm, ``F.batch_norm(x, running_mean, running_var, weight, bias,
    training=False, eps=eps)``: y = (x - running_mean) / sqrt(running_var + eps) * weight + bias
    per channel (dim 1), in x's dtype.

    x: [N, C] or [N, C, *spatial]; weight, bias, running_mean, running_var: [C] f32 (as in
    BatchNormFwd: PyTorch's mixed precision keeps them in f32). Nothing is updated.

    FLOPs: 2 per element (y = x * scale + shift with per-channel scale and shift).
    """

    name = "BatchNormInferenceFwd"
    summary = "Inference-mode batch norm with running statistics"
    params = {"eps": EPS}
    flops_per_element = 2
    kernel_mode = "eval"

    def make_inputs(self, w, rng):
        return {**self.affine_inputs(w, rng), **running_stats(rng, channels(w), PARAM_DTYPE)}

    def torch_impl(self, w):
        eps = self.config(w)["eps"]

        def batch_norm_eval(x, weight, bias, running_mean, running_var):
            return F.batch_norm(x, running_mean, running_var, weight, bias, training=False, eps=eps)

        return batch_norm_eval
