"""The timing protocol (docs/timing.md explains the why of each step).

Per timed iteration: flush the last-level cache, hold the device (so the host has queued the whole
call before the start event fires), record the start event, make the call, record the end event.
Iterations are queued in batches and read back after a synchronize; batches continue until the
median is stable or the budget is spent. Regimes:

- ``eager``: the implementation's callable, launched from Python each iteration;
- ``graph``: the callable captured once in a device graph, replayed each iteration (still cold:
  the flush runs before every replay).

:func:`call_time` times what an eager model pays per call instead: calls back to back, neither
flushed nor held, so the host's cost of a call counts wherever it exceeds the device's time.

:func:`kernel_time` reads the same call's device activity from the device's profiler instead (CUPTI
on CUDA): from its first kernel's start to its last one's end, no event or launch cost counted.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
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
    call_loop_s: float = 0.005  # call time: back-to-back calls per loop double until a loop takes this long
    call_loops: int = 5  # call time: loops timed, their median per-call time kept


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


def regime_call(call: Callable[[], Any], device: Device, regime: str, warmup_s: float,
                capture: bool = True) -> tuple[Callable[[], Any], float]:
    """(what the regime times, warmed up; the host time of one call of it): ``call`` itself, or
    for ``graph`` where ``capture`` its capture in a device graph, replayed."""
    host_s = warm_up(call, device, warmup_s)
    if regime == "graph" and capture:
        call = device.capture_graph(call)
        host_s = warm_up(call, device, warmup_s)
    return call, host_s


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
    call, host_s = regime_call(call, device, regime, options.warmup_s, capture)
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


@dataclass(frozen=True)
class CallTime:
    median_ms: float  # per call, of the loops: each one's wall time over its calls
    min_ms: float
    calls: int  # back to back in each loop
    n: int  # loops

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def call_time(call: Callable[[], Any], device: Device, options: TimingOptions = TimingOptions()) -> CallTime:
    """Wall time per call of calls made back to back, neither flushed nor held, one synchronize
    after the last: what a model running eagerly pays per call among its other launches, the
    longer of the call's host cost and its device time. The calls per loop double until a loop
    takes ``options.call_loop_s``, which spreads the synchronize and the clock's resolution thin.
    Eager only: a graph replay has no host path in front of its kernels."""
    warm_up(call, device, options.warmup_s)

    def loop(calls: int) -> float:
        """Seconds per call of ``calls`` calls and one synchronize."""
        started = time.perf_counter()
        for _ in range(calls):
            call()
        device.synchronize()
        return (time.perf_counter() - started) / calls

    calls, per_call = 1, loop(1)
    while per_call * calls < options.call_loop_s:
        calls *= 2
        per_call = loop(calls)
    # That last loop is a sample; more up to call_loops, within the budget (a call of seconds, on a
    # CPU, gets one or two rather than a task's whole timeout).
    samples, deadline = [per_call * 1e3], time.perf_counter() + options.budget_s
    while len(samples) < options.call_loops and time.perf_counter() < deadline:
        samples.append(loop(calls) * 1e3)
    return CallTime(median_ms=statistics.median(samples), min_ms=min(samples), calls=calls, n=len(samples))


@dataclass(frozen=True)
class KernelTime:
    median_ms: float  # of the spans, each from the call's first device activity's start to its last's end
    min_ms: float
    activities: int  # kernels, copies and fills of one call
    n: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


CALL_LABEL = "npuops.timed-call"


class NoDeviceActivity(RuntimeError):
    """The profiler recorded nothing the timed call launched on the device."""


def _is_launch(event: Any) -> bool:
    """A runtime or driver call (cudaLaunchKernel, cuLaunchKernel, cudaGraphLaunch, ...): what a
    device activity's correlation id names. Named by its activity type where torch records one."""
    kind = getattr(event, "activity_type", None)
    return kind.endswith(("_runtime", "_driver")) if kind else event.name.startswith("cu")


def call_spans(events: Iterable[Any], label: str = CALL_LABEL) -> list[tuple[float, int]]:
    """(span in µs, activities) of each call a profile annotated with ``label``, in order: the
    device activities whose launch (the runtime call of the same correlation id) the host made
    inside the annotation. An activity whose launch the profiler did not record (Kineto keeps no
    ``cuLaunchCooperativeKernel``) is the call's that the host made after the last activity it
    launched outside every call and that ran before it (the hold before each call): a stream runs
    its work in launch order. ``events`` are torch.profiler FunctionEvents."""
    events = list(events)
    on_host = [e for e in events if e.device_type.name == "CPU"]
    calls = sorted((e.time_range.start, e.time_range.end) for e in on_host if e.name == label)
    launched_at = {e.id: e.time_range.start for e in on_host if _is_launch(e)}
    on_device = sorted((e for e in events if e.device_type.name != "CPU" and e.name != label),
                       key=lambda e: e.time_range.start)
    per_call: dict[int, list[Any]] = defaultdict(list)
    outside_launched_at = None  # of the last activity launched outside every call, among those run so far
    for e in on_device:
        if e.id in launched_at:
            at = launched_at[e.id]
            index = next((i for i, (start, end) in enumerate(calls) if start <= at <= end), None)
            if index is None:
                outside_launched_at = at
        else:
            after = outside_launched_at
            index = None if after is None else next((i for i, (start, _) in enumerate(calls) if start > after), None)
        if index is not None:
            per_call[index].append(e)
    return [(max(e.time_range.end for e in per_call[i]) - min(e.time_range.start for e in per_call[i]), len(per_call[i]))
            for i in range(len(calls)) if per_call[i]]


def kernel_time(call: Callable[[], Any], device: Device, regime: str, iterations: int = 20,
                capture: bool = True) -> KernelTime | None:
    """The call's device time as the device's profiler records it, each iteration flushed and
    held as :func:`measure` does, so its kernels are all queued before the first starts: the
    median span of its device activity. None where the device's profiler records no kernels."""
    activity = device.profiler_activity()
    if activity is None:
        return None
    from torch.profiler import ProfilerActivity, profile, record_function

    call, host_s = regime_call(call, device, regime, 0.05, capture)
    flush = device.cache_flusher()
    with profile(activities={ProfilerActivity.CPU, activity}) as prof:
        for _ in range(iterations + 1):  # the first call's host time, profiled, sizes the holds after it
            flush()
            device.hold(hold_seconds(host_s))
            started = time.perf_counter()
            with record_function(CALL_LABEL):
                call()
            host_s = max(host_s, time.perf_counter() - started)
        device.synchronize()
    spans = call_spans(prof.events())[1:]
    if not spans:
        raise NoDeviceActivity(f"the {device.name} profiler recorded no device activity of the call")
    return KernelTime(median_ms=statistics.median(us for us, _ in spans) / 1e3, min_ms=min(us for us, _ in spans) / 1e3,
                      activities=max(count for _, count in spans), n=len(spans))
