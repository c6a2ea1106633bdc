"""Shared spec pieces of the group norms (x: [N, C, *spatial], statistics per (n, group))."""

import math

from npuops import Param, WorkloadError

from ._stat_norm import EPS, StatNormOp, check_optional_pair, check_x_rank


def group_norm_dims(shape) -> tuple[int, int, int]:
    """N, C and HxW, the sizes ``aten::native_group_norm`` takes."""
    return shape[0], shape[1], math.prod(shape[2:])


class GroupNormOp(StatNormOp):
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
        check_optional_pair(self, w, ("weight", "bias"), "affine", cfg["affine"])
