"""The hooks a plugin may implement (pluggy project ``npuops``).

A plugin is a module (or object) registered under the ``npuops`` entry-point group::

    [project.entry-points.npuops]
    norm = "npuops_norm.plugin"

and decorated with :data:`npuops.hookimpl`. Every hook is optional.

A plugin runs arbitrary code in the process that loads it: ``npuops``'s CLI, and the user's own
process on its first call of one of our functions. Whatever its import or a hook raises
(``SystemExit`` included) is recorded as that plugin's load error and the plugin skipped.

Names are first come, first served, and the project's own plugins (the core's built-ins and the
``npuops-norm``/``-conv``/``-pool``/``-topk`` distributions) come first, then third-party plugins in
entry-point name order; ``tryfirst``/``trylast`` change nothing here. An op, an implementation name
of an op or a device that an earlier plugin registered is refused for the later one, and a
third-party plugin may not add a tier-``ours`` implementation to an op of the project's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import torch

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


@hookspec
def npuops_module_forwards() -> Iterable[Callable[[torch.nn.Module], Callable[..., Any] | None]]:
    """Forward finders for :func:`npuops.patch`: each, given a model's module, returns a Python
    function ``forward(module, *args, **kwargs)`` computing what the module's own forward computes, with this
    plugin's functions, or None for a module it does not recognize (or cannot vouch for). The core
    binds it to that one instance; the function should read the module's attributes at each call
    (so later changes to them apply) and may call ``type(module).forward`` for calls it does not
    cover."""
