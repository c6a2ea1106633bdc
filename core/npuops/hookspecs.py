"""The hooks a plugin may implement (pluggy project ``npuops``): the plugin contract.

A plugin is a module (or object) registered under the ``npuops`` entry-point group::

    [project.entry-points.npuops]
    norm = "npuops_norm.plugin"

and decorated with :data:`npuops.hookimpl`. Every hook is optional. Import what a plugin needs from
``npuops`` itself (``npuops.__all__``), not from its modules.

**When hooks run.** :func:`npuops.load_registry` imports the plugins and calls their hooks: each
CLI command does, each runner worker process does, the functions for model code do on their first
call (once per process), and each :func:`npuops.patch` does. A hook may therefore be called several
times in one process: return new objects each time and keep side effects out. The order:

1. every plugin's module is imported: the project's own plugins (the core's built-ins, then the
   ``npuops-norm``/``-conv``/``-pool``/``-topk`` distributions), then third-party plugins in
   entry-point name order; those named in ``NPUOPS_DISABLE_PLUGINS`` are skipped;
2. :func:`npuops_devices` of every plugin, in that order;
3. :func:`npuops_ops` of every plugin;
4. :func:`npuops_implementations` of every plugin, given every op of every plugin;
5. :func:`npuops_module_forwards` only when :func:`npuops.patch` runs, never at load, and
   :func:`npuops_module_workloads` only when it warms (``warm=True``).

**What hooks return.** An iterable (a list, a tuple, a generator) of items; ``None`` counts as
nothing. Each item is checked on its own: one of the wrong type, or an op or device without a
name, is refused and the plugin's other items are kept.

**Errors.** Whatever a plugin's import or a hook raises (any exception but ``KeyboardInterrupt``,
``SystemExit`` included) is recorded as a load error of that plugin, naming the stage (``import``
or the hook) and the exception with the file and line it came from; a generator is consumed inside
that guard, so a hook that raises part-way contributes nothing. The plugin's other hooks still run
and the other plugins are unaffected: one broken plugin never takes the CLI, or the process
calling our functions, down. Load errors (refused items included) are listed by
``npuops plugins`` (which then exits 1) and warned about by ``npuops list``, ``run`` and ``warm``;
``NPUOPS_STRICT=1`` (or ``load_registry(strict=True)``) turns them into
:class:`npuops.PluginLoadError` once loading is done.

**Duplicate names.** First come, first served, in the order above; ``tryfirst``/``trylast``
change nothing here. A plugin name, an op, an implementation name of an op or a device name that
an earlier plugin registered is refused for the later one (its error names the plugin that keeps
the name), and a third-party plugin may not add a tier-``ours`` implementation to an op of the
project's (our functions launch an op's first ``ours`` kernel). So a third-party plugin can add
to the project's ops but never replace what the project defines.
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
    from .workload import Workload

PROJECT = "npuops"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def npuops_ops() -> Iterable[Op]:
    """The ops this plugin defines (:class:`npuops.Op` instances, each carrying its workloads;
    :func:`npuops.package_ops` builds them from the package's ``ops`` modules and its
    ``workloads.json``).

    Called once per registry load, after :func:`npuops_devices`. Each op needs a non-empty
    ``name`` and ``family``; an op whose name an earlier plugin took is refused."""


@hookspec
def npuops_implementations(ops: Mapping[str, Op]) -> Iterable[Implementation]:
    """Implementations (:class:`npuops.Implementation`) of any registered op: this plugin's or
    another's. ``ops`` maps each op name to its op, every plugin's included (read it, do not
    change it); :func:`npuops.kernel_implementations` returns a family's TileLang kernels.

    Called once per registry load, after every plugin's :func:`npuops_ops`. An implementation is
    refused when its op is not registered, when its name is taken for that op (by an earlier
    plugin, or the built-in torch baselines ``torch_eager``/``torch_compile``/
    ``torch_compile_reduce_overhead``), or when it is tier ``ours`` for an op of the project's and
    this plugin is not the project's. The registry records the plugin's name in the
    implementation's ``plugin`` field. Its ``devices`` (None: any) and ``supports`` say where it
    runs; ``supports`` should ask the device what it can do (``device.graphs``, ...), not its
    name."""


@hookspec
def npuops_devices() -> Iterable[Device]:
    """Devices (backends) this plugin makes available: :class:`npuops.Device` instances (or
    :class:`npuops.AcceleratorDevice` for a backend behind a ``torch.cuda``-shaped module).

    Called once per registry load, first of the registering hooks. Each device needs a non-empty
    ``name``; one whose name an earlier plugin took (``cuda``, ``cpu`` and ``npu`` are built in) is
    refused. A device is offered whether or not it is available here (``is_available()`` is asked
    when it is chosen); the highest ``preference`` among the available ones is the default. Its
    capability attributes decide what runs on it, with no change to the core: ``graphs`` (the
    graph-replay regime), ``compiles`` (the ``torch_compile`` baseline), ``compile_graphs`` (the
    ``torch_compile_reduce_overhead`` baseline), ``host_timed`` (timed alone, on the host's
    clock) and ``profiler_activity()`` (kernel time); see :class:`npuops.Device`."""


@hookspec
def npuops_module_forwards() -> Iterable[Callable[[torch.nn.Module], Callable[..., Any] | None]]:
    """Forward finders for :func:`npuops.patch`: each, given a model's module, returns a Python
    function ``forward(module, *args, **kwargs)`` computing what the module's own forward computes, with this
    plugin's functions, or None for a module it does not recognize (or cannot vouch for). The core
    binds it to that one instance; the function should read the module's attributes at each call
    (so later changes to them apply) and may call ``type(module).forward`` for calls it does not
    cover.

    Called by each :func:`npuops.patch` (not when the registry loads), of the plugins it names.
    For each module the finders are asked in plugin order and the first forward returned wins. A
    hook that raises leaves its plugin's finders out; a finder that raises is not asked again
    during that patch; both are listed in the :class:`npuops.Patch`'s ``errors`` and warned about,
    and the other plugins' finders still apply."""


@hookspec
def npuops_module_workloads(module: torch.nn.Module) -> Iterable[Workload] | None:
    """For ``npuops.patch(model, warm=True)``: the workloads whose kernels the forward this plugin's
    finder gave ``module`` calls, built before the patch returns so that no first call waits for
    one (one a kernel key: its other launch classes are built with it), or None for a module this
    plugin did not patch or whose calls' shapes it cannot know ahead (a pool's image size). Called
    once per patched module, of the plugins the patch names; a hook that raises is listed in the
    :class:`npuops.Patch`'s ``errors`` and the warm goes on without it."""
