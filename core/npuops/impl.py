"""Implementations: one way to compute an op (our kernel, a baseline), registered by any plugin."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

if TYPE_CHECKING:
    from .devices import Device
    from .op import Op
    from .workload import Workload

TIERS = ("ours", "torch_eager", "torch_compile", "vendor", "open-source")

BuildFn = Callable[["Op", "Workload", torch.device], Callable[..., Any]]
SupportsFn = Callable[["Op", "Workload", "Device"], "str | None"]
VariantsFn = Callable[["Op", "Workload"], "Sequence[Mapping[str, Any]]"]
KeyFn = Callable[["Op", "Workload"], Hashable]
LaunchClassesFn = Callable[["Op", "Workload"], "Iterable[Workload]"]


class KernelKey(NamedTuple):
    """A build key in two parts. The kernels of one ``shared`` part compute every workload of any
    of its keys correctly; ``launch`` (a launch class) only tunes them. So while the build of a
    new launch class runs, another of the same ``shared`` can stand in."""

    shared: Hashable
    launch: Hashable


@dataclass(frozen=True)
class Implementation:
    """How to build one implementation of ``op``.

    ``build(op, workload, device)`` does all compilation and returns the callable that is checked
    and timed, called as ``fn(**inputs)``; a ``config`` attribute on it (a kernel's launch
    configuration) is recorded with its rows. ``supports(op, workload, device)`` returns None or the
    reason it cannot run that workload there.

    ``variants(op, workload)``, where given, lists launch configurations to choose among, the
    default first (none: the default build only); ``build(op, workload, device, config=c)`` builds one. A plain run builds the
    default; a tuning run (``npuops run --tune``) checks every variant, times each and measures the
    fastest (near ties broken by the graph regime, see ``RunOptions.tuning_tie``), recording what it
    tried.

    ``key(op, workload)``, where given, says which workloads one build serves: those of equal keys
    (a kernel that takes sizes at launch serves every size whose launch it does not change; a
    :class:`KernelKey` says which builds may stand in for one another). The functions for model
    code build once per key; without it, once per workload. ``launch_classes(op, workload)``,
    where given, lists workloads of the same key's other launch classes: the functions build them
    in the background after the key's first build.
    """

    op: str
    name: str
    tier: str
    build: BuildFn
    # The names of the devices it runs on; None: any device (``supports`` may still refuse one,
    # asking the device what it can do rather than checking its name).
    devices: tuple[str, ...] | None = None
    supports: SupportsFn | None = None
    # False for callables that already replay a device graph (torch.compile reduce-overhead): the
    # graph regime times them as they are instead of capturing them again.
    graph_capturable: bool = True
    # False where the check cannot NaN-fill outputs without changing what is timed (torch.compile
    # guards on the deterministic-mode flag that NaN-filling needs, and would recompile).
    nan_fill: bool = True
    description: str = ""
    plugin: str = ""
    variants: VariantsFn | None = None
    key: KeyFn | None = None
    launch_classes: LaunchClassesFn | None = None

    def __post_init__(self) -> None:
        if self.tier not in TIERS:
            raise ValueError(f"implementation {self.name!r} of {self.op}: tier {self.tier!r} is not one of {', '.join(TIERS)}")
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"implementation of {self.op}: name must be a non-empty string")

    def builds(self, op: Op, w: Workload, device: torch.device, tune: bool) -> list[Callable[..., Any]]:
        """The callables to check (and, several, to choose among by time): the default build, or
        with ``tune`` one per variant."""
        configs = self.variants(op, w) if tune and self.variants else ()
        if not configs:
            return [self.build(op, w, device)]
        return [self.build(op, w, device, config=config) for config in configs]

    def build_key(self, op: Op, w: Workload) -> Hashable:
        return self.key(op, w) if self.key is not None else w.fingerprint

    def why_not(self, op: Op, w: Workload, device: Device) -> str | None:
        """None when this implementation can run ``w`` on ``device``; else the reason."""
        if self.devices is not None and device.name not in self.devices:
            return f"{self.name} runs on {', '.join(self.devices)}, not {device.name}"
        if self.supports is not None:
            return self.supports(op, w, device)
        return None
