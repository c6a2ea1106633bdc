"""Shared spec pieces of the group norms (x: [N, C, *spatial], statistics per (n, group))."""

import math

from npuops import Param, WorkloadError

import torch

from ._stat_norm import EPS, ChannelKernelOp, check_optional_pair, check_x_rank, optional_dtype, spatial_size


def group_norm_dims(shape) -> tuple[int, int, int]:
    """N, C and HxW, the sizes ``aten::native_group_norm`` takes."""
    return shape[0], shape[1], math.prod(shape[2:])


class GroupNormOp(ChannelKernelOp):
    required_tensors = ("x",)
    optional_tensors = ("weight", "bias")
    params = {
        "num_groups": Param(32, "channel groups; must divide C", types=(int,)),
        "affine": Param(True, "weight and bias [C] present (in the workload's dtype unless shape_dtypes says)",
                        types=(bool,)),
        "eps": EPS,
    }

    def check_workload(self, w, cfg):
        check_x_rank(self, w, 2, "[N, C] or [N, C, *spatial]")
        groups, c = cfg["num_groups"], w.shapes["x"][1]
        if groups < 1 or c % groups:
            raise WorkloadError(f"{self.name} {w.id}: param 'num_groups' = {groups} must be >= 1 and divide C = {c}")
        check_optional_pair(self, w, ("weight", "bias"), "affine", cfg["affine"], self.affine_needed)

    def channel_norm(self, w):
        from ..channel_kernel import ChannelNorm

        cfg = self.config(w)
        n, c = w.shapes["x"][:2]
        x_dtype = w.dtype_of("x")
        weight_dtype = optional_dtype(w, "weight", x_dtype)
        # native_group_norm's saved statistics: f32 only for f32 parameters beside 16-bit x.
        stat_dtype = torch.float32 if cfg["affine"] and weight_dtype == torch.float32 else x_dtype
        return ChannelNorm("group", "backward" if self.name.endswith("Bwd") else "train", n, c, spatial_size(w),
                           x_dtype, groups=cfg["num_groups"], affine=cfg["affine"], param_dtype=weight_dtype,
                           stat_dtype=stat_dtype, eps=cfg["eps"])
