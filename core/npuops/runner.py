"""The runner: ops × workloads × implementations × regimes → rows in the results file.

Work happens in worker processes, so a CUDA fault (which poisons a process's context) or a hard
crash fails one row and a fresh worker carries on. With ``jobs > 1`` several workers build
(compile) at once, while checking and timing take a device lock: one measurement at a time. With
several devices (``RunOptions.devices``, ``npuops run --devices``) each worker is bound to one of
them and each device has its own lock: one measurement at a time per device. Tasks go to whichever
worker is free next. The parent writes each row to the results file as it arrives, skips rows the
file already holds, and shows progress.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import multiprocessing as mp
import os
import socket
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from importlib.metadata import PackageNotFoundError, version
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from .calibrate import device_limits
from .check import check
from .data import InputRNG
from .devices import Device
from .impl import Implementation
from .op import Op
from .registry import Registry, load_registry
from .results import ResultsWriter, git_revision, read_results, row_key
from .timing import REGIMES, NoDeviceActivity, TimingOptions, call_time, kernel_time, measure
from .workload import Workload

_GIB = 1 << 30


@dataclass(frozen=True)
class Task:
    """One implementation on one workload; produces a row per regime."""

    op: str
    workload: Workload
    impl: str
    regimes: tuple[str, ...]

    @property
    def title(self) -> str:
        return f"{self.workload.key} {self.impl}"


@dataclass(frozen=True)
class Shard:
    """Slice ``index`` of ``count`` (1-based) of a run's planned rows, so that N machines each run one
    (``npuops run --shard I/N``) and ``npuops merge`` joins their files.

    The unit dealt is an (op, workload, fingerprint, implementation) pair, with every regime of it:
    the runner's task, whose regimes share one build, or the pair's rows skipped up front. Every pair
    the plan considers is dealt, runnable here or not, so that which pairs a shard owns does not
    depend on what the machine can run (graphs, installed compilers): machines that differ in that
    still split the plan disjointly. The pairs are ordered by a stable hash of their key (SHA-256,
    not Python's salted hash()) and dealt round-robin: slices differ by at most one pair, and an
    op's implementations (ours, a compiled one, eager: runs of very different cost) are spread over
    the slices rather than each landing on one, as dealing them in plan order would do whenever N
    divides the number of implementations per op."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if not (isinstance(self.count, int) and self.count >= 1):
            raise ValueError(f"N must be a whole number of at least 1, got {self.count!r}")
        if not (isinstance(self.index, int) and 1 <= self.index <= self.count):
            raise ValueError(f"I must be a whole number from 1 to N={self.count}, got {self.index!r}")

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``I/N``; a ValueError saying what is wrong and what would be right."""
        parts = text.strip().split("/")
        example = "e.g. 1/4 for the first of 4 slices"
        if len(parts) != 2:
            raise ValueError(f"expected I/N, the slice I of N (I from 1 to N), {example}; got {text!r}")
        try:
            index, count = (int(part) for part in parts)
        except ValueError:
            raise ValueError(f"expected I/N with whole numbers, {example}; got {text!r}") from None
        if count < 1:
            raise ValueError(f"N (the number of slices) must be at least 1, {example}; got {text!r}")
        if not 1 <= index <= count:
            raise ValueError(f"I must be from 1 to N={count} (slices are numbered from 1: "
                             f"1/{count} ... {count}/{count}); got {text!r}")
        return cls(index, count)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_devices(text: str) -> tuple[str | None, tuple[int, ...] | None]:
    """``--devices``: ``all`` -> (None, None); ``cuda:0,cuda:1`` -> ("cuda", (0, 1)). A ValueError
    saying what is wrong and what would be right; whether the devices exist is
    :func:`resolve_devices`' question."""
    example = "e.g. cuda:0,cuda:1 (a device name and an index each, comma-separated), or all"
    if text.strip() == "all":
        return None, None
    names, indices = [], []
    for part in text.split(","):
        name, colon, index = part.strip().partition(":")
        if not (name and colon and index.strip().isdecimal()):
            raise ValueError(f"expected a list of devices, {example}; got {text!r} "
                             f"({part.strip()!r} is not NAME:INDEX)" if part.strip() else
                             f"expected a list of devices, {example}; got {text!r} (an empty entry)")
        names.append(name.strip())
        indices.append(int(index))
    if len(set(names)) > 1:
        raise ValueError(f"the devices of one run are of one kind; got {', '.join(dict.fromkeys(names))} "
                         f"in {text!r}, {example}")
    repeated = sorted({i for i in indices if indices.count(i) > 1})
    if repeated:
        raise ValueError(f"{', '.join(f'{names[0]}:{i}' for i in repeated)} named twice in {text!r}; "
                         "name each device once")
    return names[0], tuple(indices)


def resolve_devices(device: Device, indices: tuple[int, ...] | None) -> tuple[int, ...]:
    """The indices of ``device`` a ``--devices`` run times on (None: all of them); an NpuopsError,
    one line, where the kind has no indices or an index is not on this machine."""
    from .errors import NpuopsError

    count = device.device_count()
    if count is None:
        raise NpuopsError(f"--devices: the {device.name} device has no device indices (one timing worker at a "
                          f"time on it); drop --devices, or name devices of a kind with several, e.g. "
                          f"--devices cuda:0,cuda:1")
    if count < 1:
        raise NpuopsError(f"--devices: this machine has no {device.name} devices")
    have = f"{device.name}:0" if count == 1 else f"{device.name}:0 to {device.name}:{count - 1}"
    if indices is None:
        return tuple(range(count))
    if not indices:
        raise NpuopsError(f"--devices names no device; name some, e.g. {device.name}:0,{device.name}:1, or all")
    missing = [i for i in indices if i >= count]
    if missing:
        raise NpuopsError(f"--devices: no {', '.join(f'{device.name}:{i}' for i in missing)} here; this machine has "
                          f"{count} {device.name} device{'s' if count != 1 else ''}, {have} (or --devices all)")
    return indices


def check_same_model(device: Device, indices: Sequence[int]) -> None:
    """Refuse (NpuopsError, one line) devices of different models: rows of one run must be
    comparable, and the env record describes one model."""
    from .errors import NpuopsError

    models = {i: device.at(i).model() for i in indices}
    if len(set(models.values())) > 1:
        named = ", ".join(f"{device.name}:{i} {model}" for i, model in models.items())
        raise NpuopsError(f"--devices: the devices differ in model ({named}); rows of one run must be "
                          "comparable: name devices of one model, and run the others separately (another --out)")


def _unit_key(op: str, workload: str, fingerprint: str, impl: str) -> str:
    return f"{op}\x1f{workload}\x1f{fingerprint}\x1f{impl}"


def shard_plan(tasks: Sequence[Task], skipped: Sequence[dict[str, Any]], shard: Shard | None
               ) -> tuple[list[Task], list[dict[str, Any]]]:
    """The tasks and skipped rows of :func:`plan` that ``shard`` owns (all where None), in plan order;
    see :class:`Shard` for the rule."""
    if shard is None or shard.count == 1:
        return list(tasks), list(skipped)
    units = {_unit_key(t.op, t.workload.id, t.workload.fingerprint, t.impl) for t in tasks}
    units |= {_unit_key(r["op"], r["workload"], r["fingerprint"], r["impl"]) for r in skipped}
    dealt = sorted(units, key=lambda key: (hashlib.sha256(key.encode()).hexdigest(), key))
    mine = {key for i, key in enumerate(dealt) if i % shard.count == shard.index - 1}
    return ([t for t in tasks if _unit_key(t.op, t.workload.id, t.workload.fingerprint, t.impl) in mine],
            [r for r in skipped if _unit_key(r["op"], r["workload"], r["fingerprint"], r["impl"]) in mine])


@dataclass(frozen=True)
class RunOptions:
    device: str
    regimes: tuple[str, ...] = REGIMES
    jobs: int = 1
    seed: int = 0
    timing: TimingOptions = field(default_factory=TimingOptions)
    task_timeout_s: float = 600.0
    rerun: bool = False  # run rows again even if the results file has them
    tune: bool = False  # build every variant of implementations that list them; measure the fastest
    tuning_timing: TimingOptions = field(default_factory=lambda: TimingOptions(budget_s=0.15, warmup_s=0.05))
    # Variants this close to the fastest eager one (at most tuning_graph_finalists of them) are
    # timed in the graph regime too, where the task has it, and the fastest over both regimes is
    # measured: one launch serves both, and short kernels that tie eager may not tie replayed.
    tuning_tie: float = 0.02
    tuning_graph_finalists: int = 3
    # Also read each measured call's device activity from the device's profiler (timing.kernel_time).
    kernel_time: bool = False
    shard: Shard | None = None  # run only this slice of the plan (Shard says which rows)
    # Indices of the device to time on, one timing worker (at least) and one device lock each; jobs
    # is then the total of workers, dealt round-robin over them. None: the device as it comes.
    devices: tuple[int, ...] | None = None


def base_row(op: Op, w: Workload, impl: Implementation, regime: str, device: str) -> dict[str, Any]:
    cost = op.cost(w)
    return {
        "record": "row",
        "family": op.family,
        "op": op.name,
        "workload": w.id,
        "label": w.label,
        "dtype": w.dtype,
        "fingerprint": w.fingerprint,
        "source": w.source,
        "impl": impl.name,
        "tier": impl.tier,
        "plugin": impl.plugin,
        "regime": regime,
        "device": device,
        "bytes": cost.bytes,
        "flops": cost.flops,
        "compute_dtype": cost.compute_dtype or w.dtype,
    }


def plan(
    registry: Registry,
    workloads: Sequence[Workload],
    impl_names: Sequence[str] | None,
    device: Device,
    regimes: Sequence[str],
) -> tuple[list[Task], list[dict[str, Any]]]:
    """Tasks to run, and rows that are skipped up front (with the reason)."""
    tasks, skipped = [], []
    for w in workloads:
        op = registry.op(w.op)
        for impl in registry.impls_for(op.name):
            if impl_names and impl.name not in impl_names:
                continue
            reason = impl.why_not(op, w, device)
            runnable = []
            for regime in regimes:
                why = reason
                if why is None and regime == "graph" and not device.graphs:
                    why = f"the graph regime needs device graphs, which {device.name} lacks"
                if why is None:
                    runnable.append(regime)
                else:
                    skipped.append({**base_row(op, w, impl, regime, device.name), "status": "skipped", "reason": why})
            if runnable:
                tasks.append(Task(op.name, w, impl.name, tuple(runnable)))
    return tasks, skipped


def environment(registry: Registry, device: Device, run_id: str, argv: Sequence[str]) -> dict[str, Any]:
    def dist_version(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    limits = device_limits(device)
    return {
        "record": "env",
        "run_id": run_id,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": socket.gethostname(),
        "argv": list(argv),
        "device": device.describe(),
        "limits": asdict(limits) if limits else None,
        "versions": {
            "python": ".".join(map(str, os.sys.version_info[:3])),
            "torch": dist_version("torch"),
            "tilelang": dist_version("tilelang"),
            "triton": dist_version("triton"),
            "npuops": dist_version("npuops"),
            "plugins": {p.name: p.version for p in registry.plugins.values() if not p.builtin},
        },
        "git": git_revision(Path(__file__).parent),
    }


# -- worker side -----------------------------------------------------------------------------------

class DeviceLock:
    """One measurement at a time on a device across worker processes (one lock per device). An
    flock, not a multiprocessing.Lock:
    the kernel releases it when its holder dies, so a crashing kernel cannot deadlock the run."""

    def __init__(self, path: Path):
        self.path = str(path)
        self._fd: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "_fd": None}

    def __enter__(self) -> DeviceLock:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)


@contextlib.contextmanager
def autotuning_under(lock: contextlib.AbstractContextManager[Any]) -> Iterator[None]:
    """torch.compile's Inductor times a kernel's candidate launch configs on the kernel's first
    call and keeps the fastest for the whole run (its autotune cache too). That first call happens
    outside the device lock, so those timings would share the GPU with other workers'
    measurements and the choice would be noise. Inside this context Inductor's benchmarks take the
    lock, as every measurement here does."""
    try:
        from torch._inductor.runtime.benchmarking import benchmarker
    except ImportError:  # a torch without Inductor: nothing autotunes
        yield
        return
    own = vars(benchmarker).get("benchmark")
    timed = benchmarker.benchmark

    def benchmark(*args: Any, **kwargs: Any) -> Any:
        with lock:
            return timed(*args, **kwargs)

    benchmarker.benchmark = benchmark
    try:
        yield
    finally:
        if own is None:
            del benchmarker.benchmark
        else:
            benchmarker.benchmark = own


WAITING_FOR_DEVICE = "waiting for the device lock"  # a task's stage that its timeout does not count
START_UP_S = 60.0  # a worker's start-up the task's timeout does not count (beyond it, a hang there fails the task)


class _DeviceLost(Exception):
    """The device context cannot run work any more; the worker must be replaced."""


def _describe_error(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}{where}"[:500]


def execute(task: Task, registry: Registry, device: Device, options: RunOptions, lock: DeviceLock,
            emit: Callable[[dict[str, Any]], None], enter: Callable[[str], None] = lambda stage: None,
            sharing: int | None = None) -> None:
    """Build, check and time one task, emitting a row per regime and calling ``enter`` with each
    stage it starts (so that a task killed for hanging can say where, and a wait for the device
    lock does not count as the task's time). ``sharing``: how many workers share the device
    (default ``options.jobs``). Rows of a device with an index record it (``device_index``).
    Raises _DeviceLost when the device broke underneath (after emitting the rows)."""
    op = registry.op(task.op)
    impl = registry.implementation(task.op, task.impl)
    w = task.workload
    where = {} if device.index is None else {"device_index": device.index}
    rows = {r: {**base_row(op, w, impl, r, device.name), **where} for r in task.regimes}

    def finish(status: str, **fields: Any) -> None:
        for regime in list(rows):
            emit({**rows.pop(regime), "status": status, **fields})

    need, free = op.memory_bytes(w), device.free_memory()
    if need > device.total_memory():
        return finish("failed", reason=f"needs {need / _GIB:.1f} GiB of {device.name} memory; the device has {device.total_memory() / _GIB:.1f} GiB")
    # Host-timed devices share their clock with compilation: nothing may overlap their timing.
    # A task using much of the memory runs alone so it does not starve its neighbours.
    exclusive = device.host_timed or need > device.total_memory() / (2 * (sharing or options.jobs))
    stage = ""

    def begin(name: str) -> None:
        nonlocal stage
        stage = name
        enter(name)

    try:
        if exclusive:
            begin(WAITING_FOR_DEVICE)
        with lock if exclusive else contextlib.nullcontext():
            begin("build")
            free = device.free_memory()
            if need > free:
                return finish("failed", reason=f"needs {need / _GIB:.2f} GiB of {device.name} memory, {free / _GIB:.2f} GiB free")
            t0 = time.perf_counter()
            fns = impl.builds(op, w, device.torch_device(), options.tune)
            inputs = op.make_inputs(w, InputRNG(device.torch_device(), options.seed + 1))
            # Lazy compilers (torch.compile) compile here, outside the device lock, and autotune
            # under it. Each variant's first call finishes before the next starts, so that one that
            # hangs is the stage a timeout names.
            with contextlib.nullcontext() if exclusive else autotuning_under(lock):
                for fn in fns:
                    begin(f"{_variant_of(fn, fns)}first call")
                    fn(**inputs)
                    device.synchronize()
            build_s = time.perf_counter() - t0
            if not exclusive:
                begin(WAITING_FOR_DEVICE)
            with contextlib.nullcontext() if exclusive else lock:
                errors = []
                for fn in fns:
                    where = _variant_of(fn, fns)
                    begin(f"{where}check")
                    result = check(op, w, fn, device, options.seed, nan_fill=impl.nan_fill)
                    errors.append({"max_error": result.max_error, "max_abs_error": result.max_abs_error})
                    if not result.ok:
                        return finish("wrong", reason=where + result.detail, check=errors[-1], build_s=build_s,
                                      **_config_field(fn))
                chosen = 0
                if len(fns) > 1:
                    begin("tuning")
                    chosen, tuning = _tune(fns, inputs, device, options, impl.graph_capturable if "graph" in task.regimes else None)
                    for row in rows.values():
                        row["tuning"] = tuning
                fn, checked, fns = fns[chosen], errors[chosen], None
                for row in rows.values():
                    row.update(_config_field(fn))
                for regime in task.regimes:
                    begin(f"timing ({regime})")
                    call = functools.partial(fn, **inputs)
                    timing = measure(call, device, regime, options.timing, capture=impl.graph_capturable)
                    row = {**rows.pop(regime), "status": "ok", "timing": timing.to_dict(), "check": checked, "build_s": build_s}
                    if regime == "eager":  # what a model pays per call beside the device time; a replay has no host path
                        begin("call time")
                        row["call_time"] = call_time(call, device, options.timing).to_dict()
                    if options.kernel_time:
                        begin(f"kernel time ({regime})")
                        try:
                            kernels = kernel_time(call, device, regime, capture=impl.graph_capturable)
                            row["kernel_time"] = kernels.to_dict() if kernels else None
                        except NoDeviceActivity as exc:  # the event time stands; the row says why it has no kernel time
                            row["kernel_time"] = {"error": _describe_error(exc)}
                    emit(row)
    except Exception as exc:
        finish("failed", reason=f"{stage}: {_describe_error(exc)}")
        try:
            device.check_health()
        except Exception as health:
            raise _DeviceLost(_describe_error(health)) from None
    finally:
        fn = fns = inputs = None  # noqa: F841 - drop references before releasing cached memory
        device.release_memory()


def _tune(fns: Sequence[Callable[..., Any]], inputs: dict[str, Any], device: Device, options: RunOptions,
          graph_capture: bool | None) -> tuple[int, list[dict[str, Any]]]:
    """(index of the variant to measure, what was tried): each timed briefly eager, and with
    ``options.kernel_time`` ranked by its kernel time (the bars' measure: a few-microsecond
    kernel's event time is mostly launch latency, the same for every variant); with
    ``graph_capture`` not None (the task times the graph regime), the finalists of
    RunOptions.tuning_tie timed replayed too, and the least sum of both medians chosen."""
    calls = [functools.partial(fn, **inputs) for fn in fns]
    eager = [measure(call, device, "eager", options.tuning_timing).median_ms for call in calls]
    tuning = [{"config": _config_of(fn), "median_ms": ms} for fn, ms in zip(fns, eager, strict=True)]
    rank = eager
    if options.kernel_time:
        kernels = [_kernel_median(call, device) for call in calls]
        for entry, ms in zip(tuning, kernels, strict=True):
            if ms is not None:
                entry["kernel_median_ms"] = ms
        if None not in kernels:
            rank = kernels
    fastest = min(range(len(fns)), key=rank.__getitem__)
    finalists = sorted((i for i, ms in enumerate(rank) if ms <= rank[fastest] * (1 + options.tuning_tie)),
                       key=rank.__getitem__)[:options.tuning_graph_finalists]
    if graph_capture is None or len(finalists) < 2:
        return fastest, tuning
    for i in finalists:
        tuning[i]["graph_median_ms"] = measure(calls[i], device, "graph", options.tuning_timing,
                                               capture=graph_capture).median_ms
    return min(finalists, key=lambda i: rank[i] + tuning[i]["graph_median_ms"]), tuning


def _kernel_median(call: Callable[[], Any], device: Device) -> float | None:
    """A variant's median kernel time for tuning (fewer iterations than a row's), None where the
    profiler records none."""
    try:
        kernels = kernel_time(call, device, "eager", iterations=10)
    except NoDeviceActivity:
        return None
    return None if kernels is None else kernels.median_ms


def _config_of(fn: Callable[..., Any]) -> Any:
    return getattr(fn, "config", None)


def _variant_of(fn: Callable[..., Any], fns: Sequence[Callable[..., Any]]) -> str:
    """'variant {config}: ' where the task tunes among several, else ''."""
    return f"variant {_config_of(fn)}: " if len(fns) > 1 else ""


def _config_field(fn: Callable[..., Any]) -> dict[str, Any]:
    return {} if _config_of(fn) is None else {"config": _config_of(fn)}


def _worker_main(conn: Connection, device_name: str, options: RunOptions, user_workloads: list[tuple[dict, str]],
                 lock: DeviceLock, log_path: str, device_index: int | None = None, sharing: int = 1) -> None:
    # Compiler chatter goes to the worker's log, not over the parent's progress display.
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    registry = load_registry()
    registry.add_workloads(Workload.from_dict(record, source=source) for record, source in user_workloads)
    device = registry.device(device_name)
    if device_index is not None:
        device = device.at(device_index)
        device.select()  # before anything touches the device: this worker's work all lands on it
    while True:
        message = conn.recv()
        if message is None:
            return
        try:
            execute(message, registry, device, options, lock, lambda row: conn.send(("row", row)),
                    lambda stage: conn.send(("stage", stage)), sharing=sharing)
        except _DeviceLost as exc:
            conn.send(("lost", str(exc)))
            os._exit(3)
        conn.send(("done", None))


# -- parent side -----------------------------------------------------------------------------------

@dataclass
class _Worker:
    index: int
    process: Any
    conn: Connection
    log_path: Path
    device_index: int | None = None  # the device it times on, where the run names several
    task: Task | None = None
    started: float = 0.0  # when the task's own time began, moved on by each wait for the device lock
    stage: str = ""  # of the task, as the worker last reported it
    stage_since: float = 0.0
    pending: set[str] = field(default_factory=set)  # regimes of the task not yet reported

    def take(self, task: Task | None) -> None:
        self.task, self.pending = task, set(task.regimes) if task else set()
        self.started = self.stage_since = time.monotonic()
        self.stage = "start"

    def enter(self, stage: str) -> None:
        now = time.monotonic()
        if self.stage == "start":  # the task's time counts from the worker beginning it, not its start-up
            self.started = now
        elif self.stage == WAITING_FOR_DEVICE:
            self.started += now - self.stage_since
        self.stage, self.stage_since = stage, now

    def task_seconds(self) -> float:
        """How long the task has run, waits for the device lock left out, and the worker's start-up
        (spawning, importing torch and the plugins: seconds on a loaded machine) up to START_UP_S."""
        now = time.monotonic()
        if self.stage == "start":
            return max(0.0, now - self.started - START_UP_S)
        return now - self.started - (now - self.stage_since if self.stage == WAITING_FOR_DEVICE else 0.0)


def _log_tail(path: Path, lines: int = 6) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text[-lines:])[-600:]


class Runner:
    def __init__(self, registry: Registry, options: RunOptions, results_path: str | Path,
                 user_workloads: Iterable[Workload] = (), progress: Any = None):
        self.registry = registry
        self.options = options
        self.results_path = Path(results_path)
        self.user_workloads = [(w.to_dict(), w.source) for w in user_workloads]
        self.progress = progress
        self.log_dir = self.results_path.with_name(self.results_path.name + ".logs")
        self.counts = {"ok": 0, "wrong": 0, "failed": 0, "skipped": 0, "resumed": 0}
        self.wrong: list[dict[str, Any]] = []  # rows of implementations that failed their check
        self.planned = 0  # rows of the plan (of its shard, where sharded), those resumed included

    def run(self, workloads: Sequence[Workload], impl_names: Sequence[str] | None = None, argv: Sequence[str] = ()) -> dict[str, int]:
        device = self.registry.device(self.options.device)
        if self.options.devices is not None:
            indices = resolve_devices(device, self.options.devices)
            check_same_model(device, indices)
        tasks, skipped = shard_plan(*plan(self.registry, workloads, impl_names, device, self.options.regimes),
                                    self.options.shard)
        self.planned = sum(len(t.regimes) for t in tasks) + len(skipped)
        done = set() if self.options.rerun else read_results(self.results_path).keys()
        skipped_new = [r for r in skipped if row_key(r) not in done]
        todo = []
        for task in tasks:
            op = self.registry.op(task.op)
            impl = self.registry.implementation(task.op, task.impl)
            left = tuple(r for r in task.regimes if row_key(base_row(op, task.workload, impl, r, device.name)) not in done)
            self.counts["resumed"] += len(task.regimes) - len(left)
            if left:
                todo.append(replace(task, regimes=left))
        self.counts["resumed"] += len(skipped) - len(skipped_new)

        with ResultsWriter(self.results_path) as writer:
            if not todo and not skipped_new:
                return self.counts
            run_id = uuid.uuid4().hex[:12]
            described = device if self.options.devices is None else device.at(self.options.devices[0])
            env = environment(self.registry, described, run_id, argv)
            if self.options.shard is not None:
                env["shard"] = str(self.options.shard)
            if self.options.devices is not None:
                env["devices"] = [device.at(i).label for i in self.options.devices]
            writer.append(env)

            def record(row: dict[str, Any]) -> None:
                row["run_id"] = run_id
                row["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
                writer.append(row)
                self.counts[row["status"]] += 1
                if row["status"] == "wrong":
                    self.wrong.append(row)

            for row in skipped_new:
                record(row)
            if todo:
                self._run_tasks(todo, device, record)
        return self.counts

    def _start_worker(self, ctx: Any, index: int, lock: DeviceLock, device_index: int | None = None,
                      sharing: int = 1) -> _Worker:
        parent, child = ctx.Pipe()
        log_path = self.log_dir / f"worker-{index}.log"
        process = ctx.Process(
            target=_worker_main,
            args=(child, self.options.device, self.options, self.user_workloads, lock, str(log_path),
                  device_index, sharing),
            daemon=True,
        )
        process.start()
        child.close()
        return _Worker(index, process, parent, log_path, device_index)

    def _run_tasks(self, tasks: list[Task], device: Device, record: Callable[[dict[str, Any]], None]) -> None:
        ctx = mp.get_context("spawn")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        indices: tuple[int | None, ...] = self.options.devices or (None,)
        # One device lock per device; a worker is bound to one device and takes its lock.
        locks = {i: DeviceLock(self.log_dir / ("device.lock" if i is None else f"device-{i}.lock")) for i in indices}
        count = max(1, min(max(self.options.jobs, len(indices)), len(tasks)))
        bound = [indices[i % len(indices)] for i in range(count)]  # worker -> its device, round-robin
        sharing = {i: max(1, bound.count(i)) for i in indices}
        if count > 1:
            # The workers are the parallelism: inductor's own pool of compile processes per worker
            # would oversubscribe the host jobs-fold.
            os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
        queue = list(reversed(tasks))

        def start(i: int) -> _Worker:
            return self._start_worker(ctx, i, locks[bound[i]], bound[i], sharing[bound[i]])

        workers = [start(i) for i in range(count)]
        progress_task = self.progress.add_task("running", total=len(tasks)) if self.progress else None

        def activity(last: Task | None) -> str:
            """What the progress line shows: the task just finished, or with several devices what
            each device's workers hold."""
            if self.options.devices is None:
                return last.title if last else ""
            held: dict[int | None, list[str]] = {}
            for w in workers:
                if w.task is not None:
                    held.setdefault(w.device_index, []).append(w.task.title)
            return " · ".join(f"{device.name}:{i} {', '.join(held[i]) if i in held else 'idle'}" for i in indices)

        def show(w: _Worker | None = None, advance: int = 0) -> None:
            if self.progress:
                self.progress.update(progress_task, advance=advance,
                                     description=f"{self._status_line()} {activity(w.task if w else None)}")

        def advance(w: _Worker) -> None:
            show(w, advance=1)

        def fail_pending(w: _Worker, reason: str) -> None:
            op = self.registry.op(w.task.op)
            impl = self.registry.implementation(w.task.op, w.task.impl)
            where = {} if w.device_index is None else {"device_index": w.device_index}
            for regime in sorted(w.pending):
                record({**base_row(op, w.task.workload, impl, regime, device.name), **where,
                        "status": "failed", "reason": reason})
            w.pending.clear()

        def assign(w: _Worker) -> None:
            w.take(queue.pop() if queue else None)
            w.conn.send(w.task)
            if self.options.devices is not None:
                show()

        def replace_worker(w: _Worker, reason: str) -> _Worker:
            if w.task is not None:
                fail_pending(w, reason)
                advance(w)
            if w.process.is_alive():
                w.process.kill()
            w.process.join()
            fresh = start(w.index)
            workers[workers.index(w)] = fresh
            assign(fresh)
            return fresh

        try:
            for w in workers:
                assign(w)
            while any(w.task is not None for w in workers):
                active = [w for w in workers if w.task is not None]
                ready = wait([w.conn for w in active] + [w.process.sentinel for w in active], timeout=1.0)
                for w in active:
                    if w.conn in ready:
                        try:
                            while w.conn.poll():
                                kind, payload = w.conn.recv()
                                if kind == "row":
                                    w.pending.discard(payload["regime"])
                                    record(payload)
                                elif kind == "stage":
                                    w.enter(payload)
                                elif kind == "lost":
                                    fail_pending(w, f"device context lost: {payload}")
                                elif kind == "done":
                                    advance(w)
                                    assign(w)
                                    break
                        except (EOFError, OSError):
                            pass  # the sentinel branch below restarts it
                    if w.task is not None and not w.process.is_alive():
                        code = w.process.exitcode
                        replace_worker(w, f"worker died (exit code {code}) at {w.stage}; log: {_log_tail(w.log_path)}")
                    elif w.task is not None and w.task_seconds() > self.options.task_timeout_s:
                        replace_worker(w, f"timed out after {self.options.task_timeout_s:.0f} s at {w.stage}")
        finally:
            for w in workers:  # finished workers are exiting; give them time before killing
                w.process.join(timeout=0 if w.task is not None else 30)
                if w.process.is_alive():
                    w.process.kill()
                w.process.join()

    def _status_line(self) -> str:
        c = self.counts
        return f"ok {c['ok']} wrong {c['wrong']} failed {c['failed']} skipped {c['skipped']} |"


def selected_workloads(registry: Registry, family: Sequence[str] = (), op: Sequence[str] = (),
                       workload: Sequence[str] = ()) -> list[Workload]:
    """Workloads matching the CLI filters; unknown names raise with the closest matches.
    ``workload`` entries are ``W3`` (with --op) or ``Op/W3``."""
    from .errors import unknown

    for f in family:
        if f not in registry.families:
            raise unknown("family", f, registry.families)
    ops = [registry.op(name) for name in op] if op else list(registry.ops.values())
    ops = [o for o in ops if not family or o.family in family]
    chosen = []
    for o in sorted(ops, key=lambda o: (o.family, o.name)):
        for w in o.workloads:
            if not workload or w.id in workload or w.key in workload:
                chosen.append(w)
    for name in workload:
        if not any(name in (w.id, w.key) for w in chosen):
            every = [w.key for o in ops for w in o.workloads] + [w.id for o in ops for w in o.workloads]
            raise unknown("workload", name, every)
    return chosen
