"""WeightNormFwd."""


import torch
from npuops import WorkloadError

from ..rowwise_kernel import RowNorm
from ._rowwise import NORMALIZED_SHAPE, RowwiseNormOp


class WeightNormFwd(RowwiseNormOp):
    """w = g * v / ||v||₂ per output row: ``torch.nn.utils.weight_norm(module, dim=0)``'s weight,
    i.e. ``torch._weight_norm(v, g, 0)``. The workload's x is v [out_rows, in_features]; g is
    [out_rows, 1] (positive gains around 1). The norm accumulated in fp32 (f64 for the f32
    reference), no eps (as PyTorch), output in the input dtype."""

    name = "WeightNormFwd"
    summary = "weight norm g * v / ||v|| per output row (torch._weight_norm, dim 0)"
    params = {"normalized_shape": NORMALIZED_SHAPE}
    flops_per_element = 3  # square-accumulate, scale

    def check_workload(self, w, cfg):
        super().check_workload(w, cfg)
        if len(w.shapes["x"]) != 2:
            raise WorkloadError(f"{self.name} {w.id}: 'x' (v) must be 2-D [out_rows, in_features], got {list(w.shapes['x'])}")

    def make_inputs(self, w, rng):
        v_shape, dtype = w.shapes["x"], w.dtype_of("x")
        return {"v": rng.normal(v_shape, dtype), "g": rng.normal((v_shape[0], 1), dtype, mean=1.0, std=0.1)}

    def row_norm(self, w):
        return RowNorm("l2_gain", input_name="v")

    def torch_impl(self, w):
        def weight_norm(v, g):
            return torch._weight_norm(v, g, 0)

        return weight_norm
