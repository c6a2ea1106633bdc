"""The timing protocol (docs/timing.md explains the why of each step).

Per timed iteration: flush the last-level cache, hold the device (so the host has queued the whole
call before the start event fires), record the start event, make the call, record the end event.
Iterations are queued in batches and read back after a synchronize; batches continue until the
median is stable or the budget is spent. Regimes:

- ``eager``: the implementation's callable, launched from Python each iteration;
- ``graph``: the callable captured once in a device graph, replayed each iteration (still cold:
  the flush runs before every replay).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from .devices import Device

REGIMES = ("eager", "graph")


@dataclass(frozen=True)
class TimingOptions:
    rel_tol: float = 0.02  # the median is stable when both halves' medians agree this closely
    min_reps: int = 10
    max_reps: int = 2000
    budget_s: float = 0.5  # wall time per measurement before giving up on stability
    warmup_s: float = 0.2
    hold_min_s: float = 50e-6


@dataclass(frozen=True)
class Timing:
    median_ms: float
    min_ms: float
    q1_ms: float
    q3_ms: float
    n: int
    stable: bool
    hold_us: float | None  # how long the device was held before each start event (None: not held)
    clock_mhz: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _quartiles(samples: list[float]) -> tuple[float, float, float]:
    if len(samples) < 2:
        return samples[0], samples[0], samples[0]
    q1, q2, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return q1, q2, q3


def _is_stable(samples: list[float], rel_tol: float) -> bool:
    half = len(samples) // 2
    a, b = statistics.median(samples[:half]), statistics.median(samples[half:])
    return abs(a - b) <= rel_tol * max(statistics.median(samples), 1e-9)


def warm_up(call: Callable[[], Any], device: Device, budget_s: float) -> float:
    """Call until first-call costs (compilation, autotuning, lazy init) are gone; returns the
    host time of one call in seconds (what the hold must cover)."""
    start = time.perf_counter()
    previous = None
    for i in range(50):
        t0 = time.perf_counter()
        call()
        device.synchronize()
        elapsed = time.perf_counter() - t0
        settled = previous is not None and elapsed <= 1.25 * previous
        previous = elapsed if previous is None else min(previous, elapsed)
        if i >= 2 and (settled or time.perf_counter() - start > budget_s):
            break
    # Host-side launch cost alone, without waiting for the device.
    t0 = time.perf_counter()
    for _ in range(3):
        call()
    host = (time.perf_counter() - t0) / 3
    device.synchronize()
    return host


def hold_seconds(host_s: float, options: TimingOptions = TimingOptions()) -> float:
    """How long to hold the device before each timed call whose host time is ``host_s``: long
    enough that the host has queued the whole call before the device reaches it."""
    return max(options.hold_min_s, 2 * host_s + 20e-6)


def measure(
    call: Callable[[], Any],
    device: Device,
    regime: str,
    options: TimingOptions = TimingOptions(),
    capture: bool = True,
) -> Timing:
    """``capture=False`` times a callable that replays its own graph (torch.compile's
    reduce-overhead mode) as it is in the graph regime: capturing it again would not be possible
    or meaningful."""
    if regime not in REGIMES:
        raise ValueError(f"regime {regime!r} is not one of {', '.join(REGIMES)}")
    host_s = warm_up(call, device, options.warmup_s)
    if regime == "graph" and capture:
        call = device.capture_graph(call)
        host_s = warm_up(call, device, options.warmup_s)
    flush = device.cache_flusher()
    hold_s = hold_seconds(host_s, options)
    held = device.hold(0)  # probes whether this device can be held at all

    # Enough iterations per batch to amortize a synchronize, but small enough to stop early.
    per_iter_s = hold_s + host_s + 50e-6
    batch = max(1, min(100, int(0.02 / per_iter_s)))
    samples: list[float] = []
    started = time.perf_counter()
    while True:
        events = []
        for _ in range(batch):
            start, end = device.event(), device.event()
            flush()
            device.hold(hold_s)
            start.record()
            call()
            end.record()
            events.append((start, end))
        device.synchronize()
        samples += [s.elapsed_time(e) for s, e in events]
        n = len(samples)
        spent = time.perf_counter() - started
        stable = n >= options.min_reps and _is_stable(samples, options.rel_tol)
        if stable or n >= options.max_reps or (spent > options.budget_s and n >= options.min_reps):
            break
    q1, median, q3 = _quartiles(samples)
    return Timing(
        median_ms=median,
        min_ms=min(samples),
        q1_ms=q1,
        q3_ms=q3,
        n=len(samples),
        stable=stable,
        hold_us=hold_s * 1e6 if held else None,
        clock_mhz=device.clock_mhz(),
    )
