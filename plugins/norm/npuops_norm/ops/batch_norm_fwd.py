"""BatchNormFwd."""

import torch

from ._batch_norm import PARAM_DTYPE, BatchNormOp
from ._stat_norm import EPS, MOMENTUM, channels, running_stats


class BatchNormFwd(BatchNormOp):
    """Training-mode batch norm, ``F.batch_norm(x, running_mean, running_var, weight, bias,
    training=True, momentum, eps)``, as one step of training runs it.

    x: [N, C] or [N, C, *spatial] (16-bit or f32); weight, bias, running_mean, running_var: [C] f32
    (PyTorch's mixed precision keeps BatchNorm's parameters and buffers in f32). Per channel c, over
    the n = N * prod(spatial) elements of x[:, c]: mean, biased variance var;
    save_invstd = 1 / sqrt(var + eps); y = (x - mean) * save_invstd * weight + bias in x's dtype.
    running_mean and running_var are updated in place, the variance unbiased:
    running_mean = (1 - momentum) * running_mean + momentum * mean,
    running_var = (1 - momentum) * running_var + momentum * var * n / (n - 1).

    Returns (y, save_mean, save_invstd, running_mean, running_var): y, the statistics a training
    step saves for BatchNormBwd ([C] f32, computed by the same kernel that makes y: cuDNN's or
    ATen's), and the two updated buffers. The formulation calls ``aten::_batch_norm_with_update``,
    the op ``aten::batch_norm`` runs in training with running statistics, which picks cuDNN or
    ATen's kernel exactly as ``F.batch_norm`` does and, unlike it, returns the saved statistics.

    FLOPs: 5 per element: 3 for the statistics (sum, square, sum of squares) and 2 for
    y = x * scale + shift with per-channel scale and shift.
    """

    name = "BatchNormFwd"
    summary = "Training-mode batch norm: y, saved mean/invstd, updated running stats"
    params = {"eps": EPS, "momentum": MOMENTUM}
    flops_per_element = 5
    kernel_mode = "train"

    def kernel_outputs(self, w, run):
        def batch_norm_train(x, weight, bias, running_mean, running_var):
            y, save_mean, save_invstd = run(x, weight, bias, running_mean, running_var)
            return y, save_mean, save_invstd, running_mean, running_var

        batch_norm_train.config = run.config
        return batch_norm_train

    def make_inputs(self, w, rng):
        return {**self.affine_inputs(w, rng), **running_stats(rng, channels(w), PARAM_DTYPE)}

    def torch_impl(self, w):
        cfg = self.config(w)
        momentum, eps = cfg["momentum"], cfg["eps"]

        def batch_norm_train(x, weight, bias, running_mean, running_var):
            y, save_mean, save_invstd, _reserve = torch.ops.aten._batch_norm_with_update(
                x, weight, bias, running_mean, running_var, momentum, eps
            )
            return y, save_mean, save_invstd, running_mean, running_var

        return batch_norm_train
