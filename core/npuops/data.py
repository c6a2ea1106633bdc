"""Input data and numerics helpers shared by every op.

Inputs are generated on the target device from a seeded generator, so the same seed gives the same
data and no host-to-device copy is needed. On the ``meta`` device only shapes and dtypes exist,
which lets tests build every workload's inputs without allocating.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Sequence

import torch


class InputRNG:
    """Seeded random tensors on one device. Never returns all-zero data."""

    def __init__(self, device: torch.device | str, seed: int = 0):
        self.device = torch.device(device)
        self.seed = seed
        self._gen = None if self.device.type == "meta" else torch.Generator(self.device).manual_seed(seed)

    def _empty(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(tuple(shape), dtype=dtype, device=self.device)

    def _float(self, shape: Sequence[int]) -> torch.Tensor:
        return torch.empty(tuple(shape), dtype=torch.float32, device=self.device)

    def normal(self, shape: Sequence[int], dtype: torch.dtype, mean: float = 0.0, std: float = 1.0) -> torch.Tensor:
        if self._gen is None:
            return self._empty(shape, dtype)
        return self._float(shape).normal_(mean, std, generator=self._gen).to(dtype)

    def uniform(self, shape: Sequence[int], dtype: torch.dtype, low: float = 0.0, high: float = 1.0) -> torch.Tensor:
        if self._gen is None:
            return self._empty(shape, dtype)
        return self._float(shape).uniform_(low, high, generator=self._gen).to(dtype)

    def integers(self, shape: Sequence[int], dtype: torch.dtype, low: int, high: int) -> torch.Tensor:
        """Uniform integers in [low, high)."""
        if self._gen is None:
            return self._empty(shape, dtype)
        return torch.randint(low, high, tuple(shape), generator=self._gen, device=self.device, dtype=dtype)


def high_precision(t: torch.Tensor) -> torch.Tensor:
    """The dtype a reference computes in: f64 for f32/f64, f32 for narrower floats; others as is."""
    if not t.is_floating_point():
        return t
    if t.dtype in (torch.float32, torch.float64):
        return t.to(torch.float64)
    return t.to(torch.float32)


@contextlib.contextmanager
def reference_math() -> Iterator[None]:
    """No TF32 and no reduced-precision reductions while a reference runs."""
    saved = (
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
    )
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    try:
        yield
    finally:
        (
            torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32,
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
            torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
        ) = saved


@contextlib.contextmanager
def nan_filled_allocations() -> Iterator[None]:
    """Every ``torch.empty`` inside fills floats with NaN (integers with their maximum), so an
    implementation that leaves an output element unwritten fails its check.

    PyTorch does this only in deterministic mode; ``warn_only`` keeps ops without a deterministic
    variant working, and their warnings are silenced because they say nothing about correctness.
    """
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    was_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    was_fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            yield
    finally:
        torch.use_deterministic_algorithms(was_deterministic, warn_only=was_warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = was_fill
