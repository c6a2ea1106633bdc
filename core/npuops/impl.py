"""Implementations: one way to compute an op (our kernel, a baseline), registered by any plugin."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .devices import Device
    from .op import Op
    from .workload import Workload

TIERS = ("ours", "torch_eager", "torch_compile", "vendor", "open-source")

BuildFn = Callable[["Op", "Workload", torch.device], Callable[..., Any]]
SupportsFn = Callable[["Op", "Workload", "Device"], "str | None"]


@dataclass(frozen=True)
class Implementation:
    """How to build one implementation of ``op``.

    ``build(op, workload, device)`` does all compilation and returns the callable that is checked
    and timed, called as ``fn(**inputs)``; a ``config`` attribute on it (a kernel's launch
    configuration) is recorded with its rows. ``supports(op, workload, device)`` returns None or the
    reason it cannot run that workload there.
    """

    op: str
    name: str
    tier: str
    build: BuildFn
    devices: tuple[str, ...] = ("cuda", "cpu", "npu")
    supports: SupportsFn | None = None
    # False for callables that already replay a device graph (torch.compile reduce-overhead): the
    # graph regime times them as they are instead of capturing them again.
    graph_capturable: bool = True
    # False where the check cannot NaN-fill outputs without changing what is timed (torch.compile
    # guards on the deterministic-mode flag that NaN-filling needs, and would recompile).
    nan_fill: bool = True
    description: str = ""
    plugin: str = ""

    def __post_init__(self) -> None:
        if self.tier not in TIERS:
            raise ValueError(f"implementation {self.name!r} of {self.op}: tier {self.tier!r} is not one of {', '.join(TIERS)}")
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"implementation of {self.op}: name must be a non-empty string")

    def why_not(self, op: Op, w: Workload, device: Device) -> str | None:
        """None when this implementation can run ``w`` on ``device``; else the reason."""
        if device.name not in self.devices:
            return f"{self.name} runs on {', '.join(self.devices)}, not {device.name}"
        if self.supports is not None:
            return self.supports(op, w, device)
        return None
