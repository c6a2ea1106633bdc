"""Shared spec pieces of the row-wise norms: workloads shaped ``x: [rows, hidden]`` (any leading dims
count as rows), normalized over the last dim, with a per-hidden weight (and bias where ``has_bias``)."""

from collections.abc import Callable
from typing import ClassVar

import torch
from npuops import Param, WorkloadError

from ..rowwise_kernel import RowNorm
from ._single_pass import SinglePassNormOp

NORMALIZED_SHAPE = Param(None, "the normalized trailing shape; must be [x's last dim]", types=(tuple,))


def eps_param(default: float) -> Param:
    return Param(default, "added to the mean square (or variance) before the square root", types=(float,))


def at_least_f32(t: torch.Tensor) -> torch.Tensor:
    """``t`` in f32, or in f64 when it already is (as references are)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


class RowwiseNormOp(SinglePassNormOp):
    """Base for norms over the last dimension of ``x`` with a per-hidden weight."""

    required_tensors = ("x",)
    params = {"eps": eps_param(1e-6), "normalized_shape": NORMALIZED_SHAPE}
    has_bias: ClassVar[bool] = False
    stat: ClassVar[str | None] = None  # the kind mixin's statistic in the row kernel
    weight_form: ClassVar[str] = "w"  # how the row kernel applies the weight
    weight_mean: ClassVar[float] = 1.0  # trained norm weights sit around 1

    def check_workload(self, w, cfg):
        x_shape = w.shapes["x"]
        if not x_shape:
            raise WorkloadError(f"{self.name} {w.id}: 'x' must have at least one dim (the normalized one)")
        shape = cfg["normalized_shape"]
        if shape is not None and tuple(shape) != x_shape[-1:]:
            raise WorkloadError(
                f"{self.name} {w.id}: param 'normalized_shape' {list(shape)} must be [x's last dim], "
                f"i.e. {list(x_shape[-1:])}"
            )

    def make_inputs(self, w, rng):
        x_shape, dtype = w.shapes["x"], w.dtype_of("x")
        inputs = {
            "x": rng.normal(x_shape, dtype),
            "weight": rng.normal(x_shape[-1:], dtype, mean=self.weight_mean, std=0.1),
        }
        if self.has_bias:
            inputs["bias"] = rng.normal(x_shape[-1:], dtype, std=0.1)
        return inputs


    def row_norm(self, w):
        if self.stat is None:
            return None
        return RowNorm(self.stat, self.config(w)["eps"], weight=self.weight_form, bias=self.has_bias)


class RMSKind:
    """Mixin: y = x / sqrt(mean(x², last dim) + eps) * weight (``F.rms_norm``)."""

    params = {"eps": eps_param(1e-6), "normalized_shape": NORMALIZED_SHAPE}
    has_bias = False
    flops_per_element = 4  # square-accumulate, scale, weight

    stat = "rms"

    @staticmethod
    def normalize(x, weight, bias, eps):
        return torch.nn.functional.rms_norm(x, x.shape[-1:], weight, eps)


class LayerKind:
    """Mixin: y = (x - mean) / sqrt(var + eps) * weight + bias over the last dim, biased variance
    (``F.layer_norm``)."""

    params = {"eps": eps_param(1e-5), "normalized_shape": NORMALIZED_SHAPE}
    has_bias = True
    flops_per_element = 8  # mean, centered square-accumulate, center, scale, weight, bias

    stat = "meanvar"

    @staticmethod
    def normalize(x, weight, bias, eps):
        return torch.nn.functional.layer_norm(x, x.shape[-1:], weight, bias, eps)


class PlainNormOp(RowwiseNormOp):
    """The norm of a kind mixin (``RMSKind``/``LayerKind``) as is: inputs x, weight(, bias)."""

    normalize: ClassVar[Callable]

    def torch_impl(self, w):
        eps, normalize = self.config(w)["eps"], self.normalize

        def norm(x, weight, bias=None):
            return normalize(x, weight, bias, eps)

        return norm
