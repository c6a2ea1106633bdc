"""Residual add fused with a row-wise norm, as vLLM's ``fused_add_rms_norm``."""

import dataclasses
import math

from ._rowwise import RowwiseNormOp


class FusedAddNormOp(RowwiseNormOp):
    """residual += x (in place, returned), then the kind mixin's norm of the updated residual.
    Inputs x, residual (both x's shape), weight(, bias); outputs (normed, residual)."""

    def make_inputs(self, w, rng):
        inputs = super().make_inputs(w, rng)
        inputs["residual"] = rng.normal(w.shapes["x"], w.dtype_of("x"))
        return inputs

    def flops(self, w):
        return super().flops(w) + math.prod(w.shapes["x"])  # the add

    def row_norm(self, w):
        return dataclasses.replace(super().row_norm(w), residual=True)

    def torch_impl(self, w):
        eps, normalize = self.config(w)["eps"], self.normalize

        def fused_add_norm(x, residual, weight, bias=None):
            residual.add_(x)
            return normalize(residual, weight, bias, eps), residual

        return fused_add_norm
