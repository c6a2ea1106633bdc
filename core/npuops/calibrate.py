"""Device limits for the SOL column: measured once by ``npuops calibrate`` and cached, with
datasheet values as the fallback."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path

import torch

from .devices import Device, Limits
from .timing import TimingOptions, measure

CACHE_ENV = "NPUOPS_CACHE_DIR"


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "npuops")


def _cache_file(device: Device) -> Path:
    model = str(device.describe().get("model", device.name)).replace(" ", "_").replace("/", "_")
    return cache_dir() / f"calibration-{device.name}-{model}.json"


def cached_limits(device: Device) -> Limits | None:
    path = _cache_file(device)
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    return Limits(data["copy_bandwidth"], data["flops"], data["source"])


def device_limits(device: Device) -> Limits | None:
    """Calibrated limits if cached, else the datasheet's, else None (no SOL column)."""
    return cached_limits(device) or device.datasheet()


_MATMUL_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def calibrate(device: Device, copy_bytes: int = 1 << 30, matmul_n: int = 8192, save: bool = True) -> Limits:
    """Copy bandwidth (bytes read + written per second) from a large device-to-device copy, and
    the matmul rate per dtype from an n×n×n product on random data (no TF32 for f32)."""
    dev = device.torch_device()
    options = TimingOptions(budget_s=2.0, min_reps=5)
    src = torch.randn(copy_bytes // 4, device=dev)
    dst = torch.empty_like(src)
    t = measure(lambda: dst.copy_(src), device, "eager", options)
    bandwidth = 2 * src.numel() * 4 / (t.median_ms / 1e3)
    del src, dst
    flops: dict[str, float] = {}
    n = matmul_n if device.name != "cpu" else 1024
    saved_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for name, dtype in _MATMUL_DTYPES.items():
            a = torch.randn(n, n, device=dev).to(dtype)
            b = torch.randn(n, n, device=dev).to(dtype)
            t = measure(lambda: a @ b, device, "eager", options)
            flops[name] = 2 * n**3 / (t.median_ms / 1e3)
            del a, b
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved_tf32
    device.release_memory()
    limits = Limits(bandwidth, flops, f"calibrated {time.strftime('%Y-%m-%d')}")
    if save:
        path = _cache_file(device)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(limits), indent=1))
    return limits
