"""The base of every convolution op: tensors described once, inputs, cost and memory derived."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from npuops import Cost, InputRNG, Op, Workload, dtype_name, tensor_bytes

from ..layouts import CHANNELS_LAST
from ._geometry import LAYOUT_2D, ConvGeometry, Layout

_WORKSPACE_SLACK = 64 << 20
BIAS_STD = 0.1  # small but non-zero, as trained biases are


@dataclass(frozen=True)
class TensorSpec:
    """One input or output tensor; inputs are drawn from N(0, std²), or U(low, high) if ``uniform``."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    std: float = 1.0
    uniform: tuple[float, float] | None = None

    @property
    def nbytes(self) -> int:
        return tensor_bytes(self.shape, self.dtype)

    def sample(self, rng: InputRNG) -> torch.Tensor:
        if self.uniform is not None:
            return rng.uniform(self.shape, self.dtype, *self.uniform)
        return rng.normal(self.shape, self.dtype, std=self.std)


def kaiming_std(fan_in: int) -> float:
    """Weights ~ N(0, 1/fan_in) keep unit-variance activations at unit variance."""
    return 1.0 / math.sqrt(fan_in)


class ConvOp(Op):
    """A convolution op. Subclasses define :meth:`resolve_geometry` (the forward convolution
    involved), :meth:`input_specs` and :meth:`output_specs`; checks, data, output dtypes, cost and
    memory follow from them."""

    family = "conv"
    layout: ClassVar[Layout] = LAYOUT_2D

    def geometry(self, w: Workload, cfg: Mapping[str, Any] | None = None) -> ConvGeometry:
        return self.resolve_geometry(f"{self.name} {w.id}", w, self.config(w) if cfg is None else cfg)

    def output_layout(self, w: Workload) -> str:
        """The layout our kernel writes ``w``'s output in: its param ``output_layout``
        (``_forward.OUTPUT_LAYOUT``), channels last for an op without one (the weight gradient)."""
        return self.config(w).get("output_layout", CHANNELS_LAST)

    def resolve_geometry(self, where: str, w: Workload, cfg: Mapping[str, Any]) -> ConvGeometry:
        """The forward convolution ``w`` computes, differentiates or transposes; WorkloadError
        (prefixed with ``where``) when its statements disagree."""
        raise NotImplementedError

    def input_specs(self, w: Workload) -> dict[str, TensorSpec]:
        raise NotImplementedError

    def output_specs(self, w: Workload) -> tuple[TensorSpec, ...]:
        raise NotImplementedError

    def check_workload(self, w, cfg):
        self.geometry(w, cfg)

    def make_inputs(self, w, rng):
        return {name: spec.sample(rng) for name, spec in self.input_specs(w).items()}

    def output_dtypes(self, w):
        return tuple(dtype_name(spec.dtype) for spec in self.output_specs(w))

    def _moved_bytes(self, w: Workload) -> int:
        specs = [*self.input_specs(w).values(), *self.output_specs(w)]
        return sum(spec.nbytes for spec in specs)

    def cost(self, w):
        """Every input read once, every output written once; FLOPs of the convolution involved."""
        return Cost(bytes=self._moved_bytes(w), flops=self.geometry(w).flops)

    def memory_bytes(self, w):
        # The default counts only the tensors named in ``shapes``, which for most conv workloads
        # leaves out the weight and the output.
        return 6 * self._moved_bytes(w) + _WORKSPACE_SLACK
