"""Shared spec pieces of the batch norms (x: [N, C, *spatial], statistics per channel)."""

import torch

from ._stat_norm import ChannelKernelOp, activations, affine_bias, affine_weight, channels, check_x_rank, spatial_size

# Mixed precision as PyTorch trains it: autocast leaves BatchNorm's weight, bias and running
# statistics in f32 beside 16-bit activations (cuDNN's batch norm requires f32 parameters then).
PARAM_DTYPE = torch.float32


def reduced_dims(x_rank: int) -> tuple[int, ...]:
    """Every dim but the channel dim 1."""
    return (0, *range(2, x_rank))


class BatchNormOp(ChannelKernelOp):
    required_tensors = ("x",)
    kernel_mode = ""  # channel_kernel.ChannelNorm's mode: "train", "eval" or "backward"

    def channel_norm(self, w):
        from ..channel_kernel import ChannelNorm

        cfg = self.config(w)
        n, c = w.shapes["x"][:2]
        return ChannelNorm("batch", self.kernel_mode, n, c, spatial_size(w), w.dtype_of("x"), affine=True,
                           param_dtype=PARAM_DTYPE, stat_dtype=PARAM_DTYPE, running=self.kernel_mode != "backward",
                           eps=cfg["eps"], momentum=cfg.get("momentum", 0.1))

    def check_workload(self, w, cfg):
        check_x_rank(self, w, 2, "[N, C] or [N, C, *spatial]")

    def affine_inputs(self, w, rng, with_bias: bool = True) -> dict[str, torch.Tensor]:
        """x and the f32 weight (and bias): workloads state only x; the rest follows from its C."""
        c = channels(w)
        inputs = {
            "x": activations(rng, w.shapes["x"], w.dtype_of("x")),
            "weight": affine_weight(rng, (c,), PARAM_DTYPE),
        }
        if with_bias:
            inputs["bias"] = affine_bias(rng, (c,), PARAM_DTYPE)
        return inputs
