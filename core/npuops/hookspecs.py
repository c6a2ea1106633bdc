"""The hooks a plugin may implement (pluggy project ``npuops``).

A plugin is a module (or object) registered under the ``npuops`` entry-point group::

    [project.entry-points.npuops]
    norm = "npuops_norm.plugin"

and decorated with :data:`npuops.hookimpl`. Every hook is optional.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from .devices import Device
    from .impl import Implementation
    from .op import Op

PROJECT = "npuops"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def npuops_ops() -> Iterable[Op]:
    """Ops this plugin defines, each carrying its workloads."""


@hookspec
def npuops_implementations(ops: Mapping[str, Op]) -> Iterable[Implementation]:
    """Implementations for any registered op (``ops`` holds every op of every plugin)."""


@hookspec
def npuops_devices() -> Iterable[Device]:
    """Devices (backends) this plugin makes available."""
