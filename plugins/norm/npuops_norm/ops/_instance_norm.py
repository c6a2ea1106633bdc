"""Shared spec pieces of the instance norms (x: [N, C, *spatial], statistics per (n, c))."""

from npuops import Param

import torch

from ._stat_norm import EPS, ChannelKernelOp, check_optional_pair, check_x_rank, optional_dtype, spatial_size


def as_batch_norm_shape(shape) -> tuple[int, ...]:
    """Instance norm is batch norm of x viewed as [1, N*C, *spatial]."""
    n, c, *spatial = shape
    return (1, n * c, *spatial)


class InstanceNormOp(ChannelKernelOp):
    required_tensors = ("x",)
    optional_tensors = ("weight", "bias", "running_mean", "running_var")
    params = {
        "affine": Param(False, "weight and bias [C] present (in the workload's dtype unless shape_dtypes says)",
                        types=(bool,)),
        "running_stats": Param(False, "running_mean and running_var [C] present (f32 in the catalog) and updated",
                               types=(bool,)),
        "eps": EPS,
    }

    def check_workload(self, w, cfg):
        check_x_rank(self, w, 3, "[N, C, *spatial]")
        check_optional_pair(self, w, ("weight", "bias"), "affine", cfg["affine"], self.affine_needed)
        check_optional_pair(self, w, ("running_mean", "running_var"), "running_stats", cfg["running_stats"])

    def channel_norm(self, w):
        from ..channel_kernel import ChannelNorm

        cfg = self.config(w)
        n, c = w.shapes["x"][:2]
        x_dtype = w.dtype_of("x")
        backward = self.name.endswith("Bwd")
        return ChannelNorm("instance", "backward" if backward else "train", n, c, spatial_size(w), x_dtype,
                           affine=cfg["affine"], param_dtype=optional_dtype(w, "weight", x_dtype),
                           stat_dtype=torch.float32, running=cfg["running_stats"] and not backward,
                           running_dtype=optional_dtype(w, "running_mean", torch.float32), eps=cfg["eps"],
                           momentum=cfg.get("momentum", 0.1))
