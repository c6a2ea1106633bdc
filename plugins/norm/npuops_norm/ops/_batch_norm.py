"""Shared spec pieces of the batch norms (x: [N, C, *spatial], statistics per channel)."""

import torch

from ._stat_norm import StatNormOp, activations, affine_bias, affine_weight, channels, check_x_rank

# Mixed precision as PyTorch trains it: autocast leaves BatchNorm's weight, bias and running
# statistics in f32 beside 16-bit activations (cuDNN's batch norm requires f32 parameters then).
PARAM_DTYPE = torch.float32


def reduced_dims(x_rank: int) -> tuple[int, ...]:
    """Every dim but the channel dim 1."""
    return (0, *range(2, x_rank))


class BatchNormOp(StatNormOp):
    required_tensors = ("x",)

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
