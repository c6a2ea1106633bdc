"""The correctness gate: an implementation is compared with the op's reference before it is timed."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from .data import InputRNG, nan_filled_allocations
from .devices import Device
from .op import CheckResult, Op
from .workload import Workload


def clone_inputs(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in inputs.items()}


def check(op: Op, w: Workload, fn: Callable[..., Any], device: Device, seed: int, nan_fill: bool = True) -> CheckResult:
    """Run ``fn`` on fresh random inputs and compare with the reference.

    The reference sees its own copy of the inputs (implementations may update inputs in place, as
    fused residual adds do). With ``nan_fill`` every allocation inside ``fn`` starts as NaN.
    """
    inputs = op.make_inputs(w, InputRNG(device.torch_device(), seed))
    expected = op.reference(clone_inputs(inputs), w)
    with nan_filled_allocations() if nan_fill else contextlib.nullcontext():
        out = fn(**inputs)
        device.synchronize()
    result = op.compare(out, expected, w)
    del inputs, expected, out
    return result
