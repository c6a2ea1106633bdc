"""Use the families' functions in an existing model: :func:`patch` swaps the forward of each module
a plugin recognizes (a norm, a pool, ...) for one computing the same thing with npuops' functions,
and returns a :class:`Patch` that undoes it.

Forwards are replaced on the module instances, never on their classes, so other models built from
the same classes keep theirs. Which modules match and what replaces their forward is the plugins'
business (hook ``npuops_module_forwards``); the core walks the model, binds, records and restores.
"""

from __future__ import annotations

import time
import warnings
import weakref
from collections import Counter
from collections.abc import Callable, Iterable
from types import MethodType
from typing import Any

import torch

from .errors import unknown
from .registry import _short_error, load_registry

# The functions patch() has bound as some module's forward: a module whose forward is one of them is
# already patched (also in a deepcopy of a patched model, whose bound methods follow the copy).
_installed: weakref.WeakSet = weakref.WeakSet()

Finder = Callable[[torch.nn.Module], Callable[..., Any] | None]


class Patch:
    """The forwards :func:`patch` replaced. ``swapped``: how many modules of each type now run
    npuops' functions; ``already_patched``: modules left as they were because an earlier patch
    holds them; ``skipped``: modules a plugin recognized but whose forward was already replaced on
    the instance by something else (accelerate's hooks, say), left alone so that is not lost;
    ``errors``: plugins whose hook or finder raised (skipped, the others still applied);
    ``warmed``: with ``warm=True``, what the warm did (see :func:`npuops.functional.warm`: workloads
    with a kernel, without, kernels built, and its ``seconds``).

    :meth:`undo` restores each forward still ours; leaving a ``with`` block does the same."""

    def __init__(self) -> None:
        self.swapped: Counter[str] = Counter()
        self.already_patched = 0
        self.skipped: list[str] = []
        self.errors: list[str] = []
        self.warmed: dict[str, float] = {}
        self._records: list[tuple[torch.nn.Module, MethodType]] = []  # each module and the forward we bound to it

    def undo(self) -> None:
        """Restore the forwards this patch replaced (a forward someone replaced after us is kept)."""
        for module, ours in self._records:
            if module.__dict__.get("forward") is ours:
                del module.__dict__["forward"]  # the class's forward shows through again
        self._records.clear()
        self.swapped.clear()

    def __enter__(self) -> Patch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.undo()

    def __repr__(self) -> str:
        swapped = ", ".join(f"{n} {name}" for name, n in sorted(self.swapped.items())) or "nothing"
        extra = "".join(f"; {label}: {v}" for label, v in (("already patched", self.already_patched),
                                                           ("skipped", len(self.skipped)),
                                                           ("errors", len(self.errors))) if v)
        return f"<npuops.Patch swapped {swapped}{extra}>"


def module_forward_finders(families: Iterable[str] | None = None,
                           errors: list[str] | None = None) -> list[tuple[str, Finder]]:
    """(plugin, finder) for each finder the installed plugins contribute, of the plugins named in
    ``families`` (all by default). A plugin that fails to load or whose hook raises is left out and
    described in ``errors``. ``NPUOPS_DISABLE_PLUGINS`` applies."""
    registry = load_registry()
    finders = list(registry.call_each("npuops_module_forwards"))
    if errors is not None:  # the plugins that failed to load, or failed this hook
        errors.extend(str(e) for e in registry.errors if e.stage in ("import", "npuops_module_forwards"))
    if families is not None:
        wanted = set(families)
        offered = {plugin for plugin, _ in finders}
        for name in sorted(wanted - offered):
            raise unknown("family with module forwards", name, offered)
        finders = [(plugin, f) for plugin, f in finders if plugin in wanted]
    return finders


def patch(model: torch.nn.Module, families: Iterable[str] | None = None, *, warm: bool = False) -> Patch:
    """Swap the forward of each module of ``model`` (itself included) that a family plugin
    recognizes for one computing the same thing with npuops' functions: our kernels where they
    cover the call (CUDA), torch's formulation otherwise; gradients flow as before. ``families``:
    the plugins to use (``["norm"]``, ...; all by default).

    Patching a patched model changes nothing (``already_patched`` counts what an earlier patch
    holds). Weights, parameters and state dicts are untouched; patch after loading the weights (a
    module on the meta device is not matched). Returns the :class:`Patch`, whose ``undo()``
    restores the original forwards::

        with npuops.patch(model) as p:
            print(p)        # <npuops.Patch swapped 5 LlamaRMSNorm>
            logits = model(ids).logits

    ``warm=True`` (on a CUDA device): before returning, build (or load from TileLang's disk cache)
    every kernel the patched modules will call whose shapes the plugins can tell ahead (a norm's
    hidden size and dtype, every launch class of its row counts: hook ``npuops_module_workloads``),
    so that no first forward, whatever its token count, waits for a build; ``Patch.warmed`` says
    what it did and how long it took.
    """
    handle = Patch()
    finders = module_forward_finders(families, handle.errors)
    failed: set[str] = set()  # a finder that raised is not asked again (one report, not one per module)
    for name, module in model.named_modules(remove_duplicate=True):
        current = module.__dict__.get("forward")
        if getattr(current, "__func__", None) in _installed:
            handle.already_patched += 1
            continue
        for plugin, finder in finders:
            if plugin in failed:
                continue
            try:
                forward = finder(module)
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # a plugin's bug (sys.exit too) must not cost the model the others
                failed.add(plugin)
                handle.errors.append(f"plugin {plugin!r} failed on {name or 'the model'} "
                                     f"({type(module).__name__}): {_short_error(exc)}")
                continue
            if forward is None:
                continue
            if current is not None:
                handle.skipped.append(f"{name} ({type(module).__name__}): "
                                      "its forward is already replaced on the instance")
            else:
                ours = MethodType(forward, module)
                module.__dict__["forward"] = ours
                _installed.add(forward)
                handle._records.append((module, ours))
                handle.swapped[type(module).__name__] += 1
            break
    if warm and handle._records and torch.cuda.is_available():
        handle.warmed = _warm(handle, families)
    if handle.errors:
        warnings.warn("npuops.patch: " + "; ".join(handle.errors), RuntimeWarning, stacklevel=2)
    return handle


def _warm(handle: Patch, families: Iterable[str] | None) -> dict[str, float]:
    """Build the kernels of the workloads the plugins name for the modules ``handle`` patched."""
    from . import functional

    registry, wanted = load_registry(), None if families is None else set(families)
    started, workloads, seen = time.perf_counter(), [], set()
    for module, _ in handle._records:
        for plugin, w in registry.call_each("npuops_module_workloads", module=module):
            if (wanted is None or plugin in wanted) and w.fingerprint not in seen:  # modules of one size: one
                seen.add(w.fingerprint)
                workloads.append(w)
    handle.errors.extend(str(e) for e in registry.errors if e.stage == "npuops_module_workloads")
    return {**functional.warm(workloads), "seconds": round(time.perf_counter() - started, 3)}
