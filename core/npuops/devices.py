"""Devices the runner can check and time on: ``cuda`` (primary), ``cpu`` (always there) and ``npu``
(Ascend through torch_npu, whose event/stream/graph API mirrors torch.cuda's).

A third party adds a backend by returning a :class:`Device` from the ``npuops_devices`` hook; its
capability attributes (``graphs``, ``compiles``, ``compile_graphs``, ``host_timed``,
``profiler_activity()``) decide which regimes and torch baselines run on it, so no core change is
needed. This module is itself the built-in plugin that registers the three.
"""

from __future__ import annotations

import copy
import ctypes
import functools
import importlib
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from .hookspecs import hookimpl

# Called before each graph capture (Device.capture_graph), in registration order.
_before_capture: list[Callable[[], Any]] = []


def before_graph_capture(callback: Callable[[], Any]) -> Callable[[], Any]:
    """Have ``callback()`` run before each graph capture of :meth:`Device.capture_graph`: for work
    that must not overlap a capture (the functions' kernel builds running behind their calls load
    their kernels from their own threads, which CUDA refuses during another thread's capture).
    Returns ``callback``, so it can decorate."""
    _before_capture.append(callback)
    return callback


@dataclass(frozen=True)
class Limits:
    """What no kernel can beat on a device: DRAM bandwidth and peak FLOP rate per dtype."""

    copy_bandwidth: float  # bytes/s, read + write counted
    flops: dict[str, float]  # dtype name -> FLOP/s
    source: str  # "calibrated <date>" or "datasheet"


class Device:
    """A backend the runner checks and times on. Subclass it and return an instance from the
    ``npuops_devices`` hook; the core asks the device what it can do, never its name:

    - ``graphs``: :meth:`capture_graph` works, so the graph-replay regime runs here;
    - ``compiles``: ``torch.compile`` (inductor) builds code for :meth:`torch_device` (the
      ``torch_compile`` baseline runs here);
    - ``compile_graphs``: ``torch.compile(mode="reduce-overhead")`` replays device graphs here
      (inductor's CUDA graph trees: the ``torch_compile_reduce_overhead`` baseline runs here);
    - ``host_timed``: :meth:`event` reads the host's clock (the default :class:`_HostEvent`), so
      nothing may run beside a measurement (the runner times such devices alone);
    - :meth:`profiler_activity`: the ``torch.profiler`` activity that records this device's
      kernels, for kernel time (None: kernel time is not measured here);
    - :meth:`device_count`: how many devices of this kind the machine has, addressed as
      ``name:0`` ... (``npuops run --devices``: one timing worker each); None where the kind is
      not indexed (the CPU). :meth:`at` gives one of them (``index``), and a worker timing on it
      calls :meth:`select` first, so that everything it runs lands on that device.

    The defaults describe a synchronous, host-timed device without graphs on which
    ``torch.compile`` is not known to work; a device states what it supports.
    """

    name: str = ""
    preference: int = 0  # the highest available is the default device
    graphs: bool = False
    compiles: bool = False
    compile_graphs: bool = False
    host_timed: bool = True
    index: int | None = None  # which device of this kind (None: the process's current one)

    def is_available(self) -> bool:
        return True

    @property
    def label(self) -> str:
        """``name:index``, or the name where no index is chosen."""
        return self.name if self.index is None else f"{self.name}:{self.index}"

    def device_count(self) -> int | None:
        """Devices of this kind here, ``at(0)`` to ``at(n - 1)``; None: not indexed (one device)."""
        return None

    def at(self, index: int) -> Device:
        """Device ``index`` of this kind: a copy with ``index`` set (nothing is selected yet)."""
        if self.device_count() is None:
            raise ValueError(f"the {self.name} device has no device indices")
        chosen = copy.copy(self)
        chosen.index = index
        return chosen

    def select(self) -> None:
        """Make this device (``index``) the process's current one, before any work on it."""

    def model(self) -> str:
        """The device's model name (devices of one run must share it)."""
        return str(self.describe().get("model"))

    def unavailable_reason(self) -> str:
        return ""

    def torch_device(self) -> torch.device:
        return torch.device(self.name) if self.index is None else torch.device(self.name, self.index)

    def synchronize(self) -> None:
        pass

    def event(self) -> Any:
        """Something with ``record()`` and ``elapsed_time(end) -> ms``."""
        return _HostEvent()

    def hold(self, seconds: float) -> bool:
        """Keep the device busy so work queued next starts only after the host is ahead.
        Returns False where the device cannot be held."""
        return False

    def profiler_activity(self) -> Any:
        """The torch.profiler activity that records this device's kernels (None: none does)."""
        return None

    def cache_flusher(self) -> Callable[[], None]:
        """A callable that evicts the last-level cache (on GPUs, L2)."""
        size = max(2 * _host_llc_bytes(), 32 << 20)
        buf = torch.empty(size, dtype=torch.uint8)
        return lambda: buf.fill_(1)

    def total_memory(self) -> int:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    def free_memory(self) -> int:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")

    def clock_mhz(self) -> float | None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"device": self.name, "model": platform.processor() or platform.machine()}

    def capture_graph(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        raise NotImplementedError(f"device {self.name} has no graph capture")

    def check_health(self) -> None:
        """Raise if the device can no longer run work (a poisoned CUDA context)."""

    def release_memory(self) -> None:
        pass

    def datasheet(self) -> Limits | None:
        return None


class _HostEvent:
    """Monotonic-clock stand-in for a device event on synchronous devices."""

    __slots__ = ("t",)

    def record(self) -> None:
        self.t = time.perf_counter_ns()

    def elapsed_time(self, end: _HostEvent) -> float:
        return (end.t - self.t) / 1e6


def _host_llc_bytes() -> int:
    for index in (3, 2):
        path = f"/sys/devices/system/cpu/cpu0/cache/index{index}/size"
        try:
            text = open(path).read().strip().upper()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1], 1)
        return int(text.rstrip("KM")) * scale
    return 32 << 20


class CPUDevice(Device):
    name = "cpu"
    preference = 0
    compiles = True  # inductor's C++ backend

    def describe(self) -> dict[str, Any]:
        return {
            "device": "cpu",
            "model": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
        }


@functools.cache  # one lookup per process, not one per measurement
def _persisting_l2_reset() -> Callable[[], int]:
    """The CUDA driver's ``cuCtxResetPersistingL2Cache`` (torch exposes no binding for it)."""
    for library in ("libcuda.so.1", "nvcuda.dll"):
        try:
            return ctypes.CDLL(library).cuCtxResetPersistingL2Cache
        except (OSError, AttributeError):
            continue
    raise RuntimeError("the CUDA driver library (libcuda.so.1 / nvcuda.dll) has no "
                       "cuCtxResetPersistingL2Cache: the L2 flush needs it (CUDA 11.0 or newer)")


# Datasheet limits, used until `npuops calibrate` has measured the device.
_GPU_DATASHEETS: dict[str, Limits] = {
    "H200": Limits(4.8e12, {"bf16": 989e12, "f16": 989e12, "fp8e4m3": 1979e12, "fp8e5m2": 1979e12, "f32": 67e12, "f64": 67e12}, "datasheet"),
    "H100": Limits(3.35e12, {"bf16": 989e12, "f16": 989e12, "fp8e4m3": 1979e12, "fp8e5m2": 1979e12, "f32": 67e12, "f64": 67e12}, "datasheet"),
    "A100": Limits(2.0e12, {"bf16": 312e12, "f16": 312e12, "f32": 19.5e12, "f64": 19.5e12}, "datasheet"),
}


class AcceleratorDevice(Device):
    """A device behind a torch.cuda-shaped module (``torch.npu``; :class:`CUDADevice` for
    ``torch.cuda``): device events and graphs, ``torch.compile`` through the backend the module
    registers; no kernel profiling (torch_npu records its kernels through its own profiler, not
    ``torch.profiler``'s) and no ``reduce-overhead`` graphs (inductor's graph trees are CUDA's)."""

    graphs = True
    compiles = True
    host_timed = False

    def __init__(self, name: str, preference: int, import_module: str | None = None):
        self.name = name
        self.preference = preference
        self._import_module = import_module
        self._module: ModuleType | None = None
        self._why_unavailable = ""

    @property
    def api(self) -> Any:
        if self._module is None:
            if self._import_module:
                importlib.import_module(self._import_module)  # registers torch.<name>
            self._module = getattr(torch, self.name)
        return self._module

    def is_available(self) -> bool:
        try:
            ok = bool(self.api.is_available())
        except Exception as exc:  # torch_npu missing or broken
            self._why_unavailable = f"{type(exc).__name__}: {exc}"
            return False
        if not ok:
            self._why_unavailable = f"torch.{self.name}.is_available() is False"
        return ok

    def unavailable_reason(self) -> str:
        return self._why_unavailable or "not available"

    def device_count(self) -> int | None:
        return int(self.api.device_count())

    def select(self) -> None:
        if self.index is not None:
            self.api.set_device(self.index)

    def _current(self) -> int:
        """The index this device stands for: its own, else the process's current device."""
        return self.api.current_device() if self.index is None else self.index

    def synchronize(self) -> None:
        self.api.synchronize()

    def event(self) -> Any:
        return self.api.Event(enable_timing=True)

    def hold(self, seconds: float) -> bool:
        sleep = getattr(self.api, "_sleep", None)
        if sleep is None:
            return False
        # Cycles at 2 GHz: never shorter than asked at the H200's 1.98 GHz boost or any lower clock.
        sleep(int(seconds * 2.0e9))
        return True

    def _flush_bytes(self) -> int:
        props = self.api.get_device_properties(self._current())
        l2 = getattr(props, "L2_cache_size", 0) or (64 << 20)
        return max(2 * l2, 64 << 20)

    def cache_flusher(self) -> Callable[[], None]:
        return torch.empty(self._flush_bytes(), dtype=torch.uint8, device=self.torch_device()).zero_

    def total_memory(self) -> int:
        return self.api.mem_get_info(self._current())[1]

    def free_memory(self) -> int:
        free, _ = self.api.mem_get_info(self._current())
        # Memory cached by torch's allocator is free for our purposes.
        return free + self.api.memory_reserved(self._current()) - self.api.memory_allocated(self._current())

    def clock_mhz(self) -> float | None:
        try:
            return float(self.api.clock_rate())
        except Exception:
            return None

    def describe(self) -> dict[str, Any]:
        props = self.api.get_device_properties(self._current())
        return {
            "device": self.name,
            "model": props.name,
            "memory_gib": round(props.total_memory / 2**30, 1),
            "multiprocessors": getattr(props, "multi_processor_count", None),
            "l2_bytes": getattr(props, "L2_cache_size", None),
        }

    def capture_graph(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        # Warm up on a side stream first, as torch.cuda.graphs recommends, so lazy initialisation
        # (workspaces, handles) happens outside the capture.
        api = self.api
        side = api.Stream()
        side.wait_stream(api.current_stream())
        with api.stream(side):
            for _ in range(2):
                fn()
        api.current_stream().wait_stream(side)
        graph_cls = getattr(api, "CUDAGraph", None) or getattr(api, "NPUGraph")
        graph = graph_cls()
        for callback in _before_capture:
            callback()
        with api.graph(graph):
            fn()
        return graph.replay

    def check_health(self) -> None:
        torch.ones(1, device=self.torch_device()).add_(1).item()
        self.synchronize()

    def release_memory(self) -> None:
        self.api.empty_cache()

    def datasheet(self) -> Limits | None:
        model = self.api.get_device_properties(self._current()).name
        for key, limits in _GPU_DATASHEETS.items():
            if key in model:
                return limits
        return None


class CUDADevice(AcceleratorDevice):
    """``torch.cuda``: adds kernel time (``torch.profiler``'s CUDA activity), ``reduce-overhead``
    graphs, and an L2 flush that also resets lines persisting through the CUDA driver."""

    compile_graphs = True

    def __init__(self, preference: int = 20):
        super().__init__("cuda", preference)

    def profiler_activity(self) -> Any:
        from torch.profiler import ProfilerActivity

        return ProfilerActivity.CUDA

    def cache_flusher(self) -> Callable[[], None]:
        size = self._flush_bytes()
        buf = torch.empty(size, dtype=torch.uint8, device=self.torch_device())
        reset = _persisting_l2_reset()
        # Read after the overwrite: it leaves the L2 full of dirty lines, whose write-back would
        # otherwise be charged to the timed kernel that evicts them (docs/timing.md).
        scrub = torch.empty(size // 4, dtype=torch.float32, device=self.torch_device())
        scrub_sum = torch.empty((), dtype=torch.float32, device=self.torch_device())

        def flush() -> None:
            # Lines loaded with an evict_last hint (torch.compile's Triton kernels put it on window
            # and broadcast loads) persist through any overwrite until reset (docs/timing.md).
            self.synchronize()  # the reset acts when called, not in stream order
            if (status := reset()) != 0:
                raise RuntimeError(f"cuCtxResetPersistingL2Cache failed (CUresult {status})")
            buf.zero_()
            torch.sum(scrub, dim=0, out=scrub_sum)

        return flush

    def describe(self) -> dict[str, Any]:
        props = self.api.get_device_properties(self._current())
        return {
            **super().describe(),
            "capability": f"sm_{props.major}{props.minor}",
            "cuda_runtime": torch.version.cuda,
            "driver": _nvidia_driver(),
            "l2_flush": "persisting lines reset, 2x L2 overwritten, then 2x L2 read (no dirty lines left)",
        }


def _nvidia_driver() -> str | None:
    try:
        import pynvml  # nvidia-ml-py, installed with torch's CUDA builds

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else version
    except Exception:
        return None


@hookimpl
def npuops_devices() -> list[Device]:
    return [
        CUDADevice(preference=20),
        AcceleratorDevice("npu", preference=10, import_module="torch_npu"),
        CPUDevice(),
    ]
