"""Plugin discovery and the registry of ops, implementations and devices.

Plugins are found through ``importlib.metadata`` entry points (group ``npuops``) and called
through pluggy. Each plugin is loaded, and each of its hooks called, on its own: a plugin that fails
to import or whose hook raises (any exception short of KeyboardInterrupt, ``SystemExit`` included:
a module that runs argparse at import) is recorded (which plugin, which hook, the error) and
skipped, so one broken plugin never takes the CLI, or the process calling our functions, down.
``NPUOPS_DISABLE_PLUGINS=a,b`` skips plugins by name (an unknown name is warned about, with the
closest matches); ``NPUOPS_STRICT=1`` (or ``strict=True``) turns any load error into
:class:`PluginLoadError`.

Precedence: the project's own plugins (the built-ins and the distributions in
:data:`PROJECT_DISTRIBUTIONS`) load and are asked first, then third-party plugins in entry-point name
order, whatever order pluggy keeps its hook implementations in. A name taken twice (a plugin name,
an op, an implementation of an op, a device) stays with the first registrant; the later one is
refused, and the error names both plugins. So a third-party plugin cannot replace one of the
project's ops, and cannot add a kernel of tier ``ours`` to an op of the project's (our functions
launch an op's first ``ours`` kernel). An item of the wrong type, or an op or device without a name
(a non-empty string), is refused on its own. :mod:`npuops.hookspecs` states this contract for
plugin authors; keep the two in step.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import re
import sys
import traceback
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any

import pluggy

from . import hookspecs
from .devices import Device
from .errors import PluginLoadError, unknown
from .impl import Implementation
from .op import Op
from .workload import Workload

ENTRY_POINT_GROUP = "npuops"
DISABLE_ENV = "NPUOPS_DISABLE_PLUGINS"
STRICT_ENV = "NPUOPS_STRICT"
BUILTIN_PLUGINS = ("npuops.devices", "npuops.baselines")
# The project's own distributions: their plugins win any name they share with a third-party one.
PROJECT_DISTRIBUTIONS = frozenset({"npuops", "npuops-norm", "npuops-conv", "npuops-pool", "npuops-topk"})


def _canonical(dist: str | None) -> str:
    return re.sub(r"[-_.]+", "-", dist or "").lower()


def is_project_distribution(dist: str | None) -> bool:
    return _canonical(dist) in PROJECT_DISTRIBUTIONS


@dataclass
class PluginInfo:
    name: str
    module: str
    distribution: str | None = None
    version: str | None = None
    builtin: bool = False
    disabled: bool = False
    ops: list[str] = field(default_factory=list)
    implementations: list[str] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def project(self) -> bool:
        """One of the project's own plugins (built in, or from a distribution of the project)."""
        return self.builtin or is_project_distribution(self.distribution)

    def describe(self) -> str:
        """``'norm' (npuops-norm)``: how errors name a plugin."""
        return f"{self.name!r}" + (f" ({self.distribution})" if self.distribution else "")


@dataclass(frozen=True)
class LoadError:
    plugin: str
    stage: str  # "import" or the hook's name
    message: str

    def __str__(self) -> str:
        return f"plugin {self.plugin!r} failed in {self.stage}: {self.message}"


def _short_error(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    if isinstance(exc, SystemExit):
        return f"SystemExit({exc.code!r}): the plugin tried to end the process{where}"
    return f"{type(exc).__name__}: {exc}{where}"




def _env_list(name: str) -> set[str]:
    return {part.strip() for part in os.environ.get(name, "").split(",") if part.strip()}


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


class Registry:
    def __init__(self) -> None:
        self.ops: dict[str, Op] = {}
        self.implementations: dict[str, list[Implementation]] = {}
        self.devices: dict[str, Device] = {}
        self.plugins: dict[str, PluginInfo] = {}
        self.errors: list[LoadError] = []
        self.hooks: pluggy.PluginManager | None = None  # the plugins' hooks, for call_each

    def call_each(self, hook_name: str, **kwargs: Any) -> Iterable[tuple[str, Any]]:
        """(plugin, item) for each item a hook of the loaded plugins returns, plugin by plugin (see
        ``_call_each``): for hooks the registry itself does not gather (``npuops_module_forwards``)."""
        return _call_each(self.hooks, self, hook_name, **kwargs)

    # -- lookups with helpful errors ----------------------------------------------------------
    @property
    def families(self) -> list[str]:
        return sorted({op.family for op in self.ops.values()})

    def op(self, name: str) -> Op:
        if name not in self.ops:
            raise unknown("op", name, self.ops)
        return self.ops[name]

    def impls_for(self, op_name: str) -> list[Implementation]:
        return self.implementations.get(op_name, [])

    def implementation(self, op_name: str, name: str) -> Implementation:
        for impl in self.impls_for(op_name):
            if impl.name == name:
                return impl
        raise unknown(f"implementation of {op_name}", name, [i.name for i in self.impls_for(op_name)])

    def device(self, name: str | None = None) -> Device:
        """The named device, or the best available one (the first in preference order)."""
        if name is None:
            available = [d for d in self.devices.values() if d.is_available()]
            if not available:
                raise PluginLoadError("no device is available (the cpu device should always be)")
            return max(available, key=lambda d: d.preference)
        if name not in self.devices:
            raise unknown("device", name, self.devices)
        device = self.devices[name]
        if not device.is_available():
            raise PluginLoadError(f"device {name!r} is not available here: {device.unavailable_reason()}")
        return device

    def workloads(self, op_name: str | None = None) -> list[Workload]:
        ops = [self.op(op_name)] if op_name else self.ops.values()
        return [w for op in ops for w in op.workloads]

    def add_workloads(self, workloads: Iterable[Workload]) -> list[Workload]:
        """Attach user workloads to their ops (validated); returns them."""
        added = []
        for w in workloads:
            op = self.op(w.op)
            op.validate(w)
            if any(existing.id == w.id for existing in op.workloads):
                from .errors import WorkloadError

                raise WorkloadError(f"{w.op}: workload id {w.id!r} is already taken; choose another id")
            op.workloads = op.workloads + (w,)
            added.append(w)
        return added


def _register_plugins(pm: pluggy.PluginManager, registry: Registry, disabled: set[str]) -> None:
    """Import and register each plugin: the built-ins, the project's distributions, then third-party
    ones, each group in entry-point name order (``registry.plugins`` keeps that order, which is the
    precedence :func:`_call_each` asks the plugins in)."""
    for module_name in BUILTIN_PLUGINS:
        name = module_name.split(".")[-1]
        module = importlib.import_module(module_name)
        pm.register(module, name=name)
        registry.plugins[name] = PluginInfo(name=name, module=module_name, distribution="npuops",
                                            version=_npuops_version(), builtin=True)

    def order(ep: Any) -> tuple[bool, str, str]:
        dist = getattr(ep, "dist", None)
        name = dist.name if dist else None
        return (not is_project_distribution(name), ep.name, _canonical(name))

    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=order):
        dist = getattr(ep, "dist", None)
        info = PluginInfo(
            name=ep.name,
            module=ep.value,
            distribution=dist.name if dist else None,
            version=dist.version if dist else None,
        )
        if ep.name in registry.plugins:  # two distributions, one plugin name: the first keeps it
            first = registry.plugins[ep.name]
            if first.module == info.module and _canonical(first.distribution) == _canonical(info.distribution):
                continue  # the same distribution found twice on the path
            message = (f"plugin name {ep.name!r} is already taken by {first.describe()}; "
                       f"{info.distribution or ep.value} was not loaded (rename its entry point)")
            first.errors.append(f"import: {message}")
            registry.errors.append(LoadError(ep.name, "import", message))
            continue
        registry.plugins[ep.name] = info
        if ep.name in disabled:
            info.disabled = True
            continue
        captured = io.StringIO()
        try:
            # What a plugin prints while it loads is shown if it loads, and its last line kept in
            # the error if it does not (argparse's usage and complaint, say).
            with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
                plugin: Any = ep.load()
                if not isinstance(plugin, ModuleType) and callable(plugin) and not _has_hooks(plugin):
                    plugin = plugin()
            pm.register(plugin, name=ep.name)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # a broken plugin is reported, never fatal (SystemExit included)
            message = _short_error(exc)
            said = [line.strip() for line in captured.getvalue().splitlines() if line.strip()]
            if said:
                message += f"; it printed: {said[-1][:200]}"
            info.errors.append(f"import: {message}")
            registry.errors.append(LoadError(ep.name, "import", message))
        else:
            if captured.getvalue():
                sys.stdout.write(captured.getvalue())
    _warn_unknown_disabled(registry, disabled)


def _warn_unknown_disabled(registry: Registry, disabled: set[str]) -> None:
    for name in sorted(disabled - set(registry.plugins)):
        warnings.warn(f"npuops: cannot disable plugin: {unknown('plugin', name, registry.plugins)}",
                      RuntimeWarning, stacklevel=3)


def _npuops_version() -> str:
    from . import __version__

    return __version__


def _has_hooks(obj: Any) -> bool:
    return any(name.startswith("npuops_") for name in dir(obj))


def _call_each(pm: pluggy.PluginManager, registry: Registry, hook_name: str, **kwargs: Any) -> Iterable[tuple[str, Any]]:
    """Call one hook plugin by plugin so one failure does not hide the others' results.

    Plugins are asked in ``registry.plugins`` order (the project's own first), not pluggy's: pluggy
    keeps hook implementations in registration order, moved by ``tryfirst``/``trylast``, and calls
    them last first; neither may decide which plugin keeps a name."""
    rank = {name: i for i, name in enumerate(registry.plugins)}
    impls = sorted(getattr(pm.hook, hook_name).get_hookimpls(), key=lambda i: rank.get(i.plugin_name, len(rank)))
    for impl in impls:
        try:
            result = impl.function(**{k: kwargs[k] for k in impl.argnames})
            items = list(result or ())
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # SystemExit included: a plugin never ends the process
            message = _short_error(exc)
            registry.plugins[impl.plugin_name].errors.append(f"{hook_name}: {message}")
            registry.errors.append(LoadError(impl.plugin_name, hook_name, message))
            continue
        for item in items:
            yield impl.plugin_name, item


def _reject(registry: Registry, plugin: str, hook: str, message: str) -> None:
    registry.plugins[plugin].errors.append(f"{hook}: {message}")
    registry.errors.append(LoadError(plugin, hook, message))


def _unnamed(obj: Any, attributes: tuple[str, ...]) -> str | None:
    """Why ``obj`` (an op, a device) cannot be registered: an attribute that is not a non-empty
    string (an op class without ``name`` or ``family``, a device without ``name``); else None."""
    for attribute in attributes:
        value = getattr(obj, attribute, None)
        if not isinstance(value, str) or not value:
            return f"{type(obj).__name__} has no {attribute} (a non-empty string); got {value!r}"
    return None


def _owner(registry: Registry, kind: str, name: str) -> PluginInfo | None:
    for info in registry.plugins.values():
        if name in getattr(info, kind):
            return info
    return None


def _taken(registry: Registry, what: str, owner: PluginInfo | None, plugin: str) -> str:
    by = owner.describe() if owner else "another plugin"
    return f"{what} is already defined by plugin {by}; plugin {registry.plugins[plugin].describe()}'s is ignored"


def load_registry(strict: bool | None = None, disabled: Iterable[str] | None = None) -> Registry:
    strict = _env_flag(STRICT_ENV) if strict is None else strict
    disabled_set = _env_list(DISABLE_ENV) if disabled is None else set(disabled)
    registry = Registry()
    registry.hooks = pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    _register_plugins(pm, registry, disabled_set)

    for plugin, device in _call_each(pm, registry, "npuops_devices"):
        if not isinstance(device, Device):
            _reject(registry, plugin, "npuops_devices", f"returned {type(device).__name__}, not a Device")
        elif why := _unnamed(device, ("name",)):
            _reject(registry, plugin, "npuops_devices", why)
        elif device.name in registry.devices:
            _reject(registry, plugin, "npuops_devices",
                    _taken(registry, f"device {device.name!r}", _owner(registry, "devices", device.name), plugin))
        else:
            registry.devices[device.name] = device
            registry.plugins[plugin].devices.append(device.name)

    for plugin, op in _call_each(pm, registry, "npuops_ops"):
        if not isinstance(op, Op):
            _reject(registry, plugin, "npuops_ops", f"returned {type(op).__name__}, not an Op")
        elif why := _unnamed(op, ("name", "family")):
            _reject(registry, plugin, "npuops_ops", why)
        elif op.name in registry.ops:
            _reject(registry, plugin, "npuops_ops",
                    _taken(registry, f"op {op.name!r}", _owner(registry, "ops", op.name), plugin))
        else:
            registry.ops[op.name] = op
            registry.plugins[plugin].ops.append(op.name)

    for plugin, impl in _call_each(pm, registry, "npuops_implementations", ops=registry.ops):
        if not isinstance(impl, Implementation):
            _reject(registry, plugin, "npuops_implementations", f"returned {type(impl).__name__}, not an Implementation")
            continue
        if impl.op not in registry.ops:
            _reject(registry, plugin, "npuops_implementations", f"implementation {impl.name!r} is for unknown op {impl.op!r}")
            continue
        existing = registry.implementations.setdefault(impl.op, [])
        same = [e for e in existing if e.name == impl.name]
        if same:
            _reject(registry, plugin, "npuops_implementations",
                    _taken(registry, f"implementation {impl.name!r} of {impl.op}", registry.plugins.get(same[0].plugin), plugin))
            continue
        op_owner = _owner(registry, "ops", impl.op)
        if impl.tier == "ours" and op_owner is not None and op_owner.project and not registry.plugins[plugin].project:
            _reject(registry, plugin, "npuops_implementations",
                    f"implementation {impl.name!r} of {impl.op}: tier 'ours' of an op of plugin {op_owner.describe()} "
                    "is the project's own (our functions launch it); register it under another tier, e.g. 'open-source'")
            continue
        impl = _with_plugin(impl, plugin)
        existing.append(impl)
        registry.plugins[plugin].implementations.append(f"{impl.op}:{impl.name}")

    if strict and registry.errors:
        raise PluginLoadError("plugin errors (strict mode):\n" + "\n".join(f"  {e}" for e in registry.errors))
    return registry


def _with_plugin(impl: Implementation, plugin: str) -> Implementation:
    from dataclasses import replace

    return replace(impl, plugin=plugin)
