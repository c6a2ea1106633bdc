"""Shared spec pieces of the row-wise norms' backward ops (x: [*rows, *normalized_shape])."""

import math

from npuops import Param, WorkloadError

from ._stat_norm import StatNormOp, activations, affine_weight, gradients


class RowwiseBackwardOp(StatNormOp):
    required_tensors = ("x",)
    stat = ""  # the backward kernel's statistic: "rms" or "meanvar" (backward_kernel.RowBackward)
    kernel_description = ("TileLang backward row kernel: grad x one pass a row, weight (and bias) "
                          "gradients as per-block column sums, then a fixed-order sum")
    params = {
        "normalized_shape": Param(None, "the normalized trailing dims of x (default: the last dim)", types=(tuple,)),
    }

    def check_workload(self, w, cfg):
        x_shape, shape = w.shapes["x"], cfg["normalized_shape"]
        if shape is not None and (len(shape) >= len(x_shape) or tuple(shape) != tuple(x_shape[-len(shape):])):
            raise WorkloadError(
                f"{self.name} {w.id}: param 'normalized_shape' {list(shape)} must equal trailing dims of x "
                f"{list(x_shape)}, leaving at least one row dim"
            )

    def normalized_shape(self, w) -> list[int]:
        shape = self.config(w)["normalized_shape"]
        return list(shape) if shape is not None else list(w.shapes["x"][-1:])

    def normalized_dims(self, w) -> tuple[int, ...]:
        rank = len(w.shapes["x"])
        return tuple(range(rank - len(self.normalized_shape(w)), rank))

    def grad_x_weight(self, w, rng) -> dict:
        """grad_out and x of x's shape and dtype, weight of normalized_shape in x's dtype."""
        x_shape, dtype = w.shapes["x"], w.dtype_of("x")
        return {
            "grad_out": gradients(rng, x_shape, dtype),
            "x": activations(rng, x_shape, dtype),
            "weight": affine_weight(rng, self.normalized_shape(w), dtype),
        }

    def row_backward(self, w):
        from ..backward_kernel import RowBackward

        hidden = math.prod(self.normalized_shape(w))
        return RowBackward(self.stat, math.prod(w.shapes["x"]) // hidden, hidden, w.dtype_of("x"))

    def kernel_unsupported(self, w):
        from ..backward_kernel import unsupported

        return unsupported(self.row_backward(w))

    def kernel_key(self, w):
        return self.row_backward(w)

    def tilelang_variants(self, w):
        from ..backward_kernel import launch_variants

        return launch_variants(self.row_backward(w))

    def kernel_callable(self, w, device, config=None, target=None):
        """fn(**inputs) -> the op's outputs, from the kernels built for ``target`` (the GPU's by default)."""
        from ..backward_kernel import build_row_backward

        return build_row_backward(self.row_backward(w), self.normalized_shape(w), device, target=target,
                                  **(config or {}))

    def tilelang_build(self, w, device, config=None):
        return self.kernel_callable(w, device, config)
