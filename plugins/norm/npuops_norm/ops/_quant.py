"""A row-wise norm followed by per-token dynamic symmetric int8 quantization, as vLLM's
``rms_norm_dynamic_per_token_quant``."""

import dataclasses
import math

import torch
from npuops import Param, Tolerance

from ._rowwise import RowwiseNormOp, at_least_f32

INT8_MAX = 127

QUANT_PARAMS = {
    # vLLM's min_scaling_factor<int8_t>: float epsilon, so an all-zero row gives scale eps, not 0.
    "min_scale": Param(float(torch.finfo(torch.float32).eps), "lower bound of each row's scale", types=(float,)),
}


def per_token_int8(y: torch.Tensor, min_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """scale = max(max|y| / 127, min_scale) per row (last dim); q = clamp(round_half_even(y / scale),
    -128, 127) as int8. Returns (q, scale [..., 1] in y's dtype)."""
    scale = y.abs().amax(-1, keepdim=True).div(INT8_MAX).clamp_min(min_scale)
    return y.div(scale).round().clamp(-INT8_MAX - 1, INT8_MAX).to(torch.int8), scale


class NormQuantOp(RowwiseNormOp):
    """The kind mixin's norm computed in fp32 (never rounded to the input dtype), then
    :func:`per_token_int8`. Outputs (q int8 [rows, hidden], scale f32 [rows, 1])."""

    # Where y / scale lands next to a .5 boundary, another accumulation order may round the other way.
    tolerances = {"i8": Tolerance(1, 0)}

    def flops(self, w):
        return super().flops(w) + 3 * math.prod(w.shapes["x"])  # |y| max, divide, round

    def row_norm(self, w):
        return dataclasses.replace(super().row_norm(w), quant_min_scale=self.config(w)["min_scale"])

    def torch_impl(self, w):
        cfg = self.config(w)
        eps, min_scale, normalize = cfg["eps"], cfg["min_scale"], self.normalize

        def norm_quant(x, weight, bias=None):
            y = normalize(at_least_f32(x), at_least_f32(weight), None if bias is None else at_least_f32(bias), eps)
            return per_token_int8(y, min_scale)

        return norm_quant
