"""Built-in plugin: the PyTorch baselines every op with a torch formulation gets.

- ``torch_eager``: the formulation as written, on any device;
- ``torch_compile``: ``torch.compile`` with inductor's default mode, on devices that declare
  ``compiles``;
- ``torch_compile_reduce_overhead``: ``mode="reduce-overhead"``, inductor plus CUDA graphs (the CUDA
  analogue of torch_npu's ``torch_compile_aclgraph``), on devices that declare ``compile_graphs``.

Which baselines a device gets comes from its capabilities (:class:`npuops.Device`), never its name:
a third-party device gets them without a change here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from .hookspecs import hookimpl
from .impl import Implementation
from .op import Op

# One compiled artifact per workload: dynamo's default limit (8 per code object) would otherwise
# make later workloads of an op silently fall back to eager.
_DYNAMO_CACHE_LIMIT = 4096


def has_torch_formulation(op: Op) -> bool:
    return type(op).torch_impl is not Op.torch_impl


def _build_eager(op: Op, w, device: torch.device) -> Callable[..., Any]:
    return op.torch_impl(w)


def _compiler(mode: str | None) -> Callable[..., Callable[..., Any]]:
    def build(op: Op, w, device: torch.device) -> Callable[..., Any]:
        import torch._dynamo

        torch._dynamo.config.cache_size_limit = _DYNAMO_CACHE_LIMIT
        torch._dynamo.config.accumulated_cache_size_limit = _DYNAMO_CACHE_LIMIT
        return torch.compile(op.torch_impl(w), mode=mode, dynamic=False)

    return build


def _needs_compile(op: Op, w, device) -> str | None:
    if not device.compiles:
        return f"torch.compile has no backend for {device.name}"
    return None


def _needs_compile_graphs(op: Op, w, device) -> str | None:
    if not device.compile_graphs:
        return f"reduce-overhead mode replays inductor's CUDA graphs, which {device.name} lacks"
    return None


@hookimpl
def npuops_implementations(ops: Mapping[str, Op]) -> list[Implementation]:
    impls = []
    for op in ops.values():
        if not has_torch_formulation(op):
            continue
        impls += [
            Implementation(op.name, "torch_eager", "torch_eager", _build_eager,
                           description="the torch formulation, eager"),
            Implementation(op.name, "torch_compile", "torch_compile", _compiler(None), supports=_needs_compile,
                           nan_fill=False,
                           description="torch.compile, inductor default mode"),
            Implementation(op.name, "torch_compile_reduce_overhead", "torch_compile", _compiler("reduce-overhead"),
                           supports=_needs_compile_graphs, graph_capturable=False, nan_fill=False,
                           description="torch.compile(mode='reduce-overhead'): inductor + CUDA graphs"),
        ]
    return impls
