"""Errors users see. Each names what is wrong and what would be right."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class NpuopsError(Exception):
    """Base class: a problem with the user's request, reported without a traceback by the CLI."""


class WorkloadError(NpuopsError, ValueError):
    """A workload does not fit its op's schema."""


class UnknownNameError(NpuopsError, KeyError):
    """An op, workload, implementation, family, device or plugin name that is not registered."""

    def __init__(self, kind: str, name: str, known: Iterable[str]):
        known = sorted(set(known))
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        if not close:
            lowered = name.lower()
            close = [k for k in known if lowered in k.lower()][:3]
        msg = f"unknown {kind} {name!r}"
        if close:
            msg += f"; did you mean {', '.join(repr(c) for c in close)}?"
        elif known:
            shown = ", ".join(known[:12]) + (", ..." if len(known) > 12 else "")
            msg += f"; known: {shown}"
        super().__init__(msg)
        self.kind, self.name, self.close = kind, name, close

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


class PluginLoadError(NpuopsError):
    """Raised in strict mode when a plugin fails to load or one of its hooks raises."""


def unknown(kind: str, name: str, known: Iterable[str]) -> UnknownNameError:
    return UnknownNameError(kind, name, known)
