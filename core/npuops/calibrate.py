"""Device limits for the SOL column: measured once by ``npuops calibrate`` and cached, with
datasheet values as the fallback.

The cache is written whole or not at all (a temporary file renamed over it), so a kill during
``npuops calibrate`` leaves the previous cache or none. A cache that cannot be read anyway (cut
short by an older version, edited by hand) is ignored with a warning that names the file and how to
measure again; the datasheet values stand in meanwhile.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from dataclasses import asdict
from pathlib import Path

import torch

from .data import reference_math
from .devices import Device, Limits
from .files import replaced
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
    try:
        data = json.loads(path.read_text())
        limits = Limits(_rate(data["copy_bandwidth"]), {str(k): _rate(v) for k, v in data["flops"].items()},
                        str(data["source"]))
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        what = f"missing field {exc}" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
        warnings.warn(f"npuops: ignoring the calibration cache {str(path)!r}, which cannot be read ({what}); "
                      f"`npuops calibrate --device {device.name}` measures again (datasheet values meanwhile)",
                      RuntimeWarning, stacklevel=2)
        return None
    return limits


def _rate(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{value!r} is not a positive rate")
    return float(value)


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with replaced(path) as (f,):
        f.write(text.encode())


def device_limits(device: Device) -> Limits | None:
    """Calibrated limits where measured, datasheet values for the rest (fp8 rates, say), None
    when neither is known (no SOL column)."""
    measured, sheet = cached_limits(device), device.datasheet()
    if measured is None or sheet is None:
        return measured or sheet
    return Limits(measured.copy_bandwidth, {**sheet.flops, **measured.flops}, f"{measured.source}; datasheet for the rest")


_MATMUL_DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def _copy_bandwidth(device: Device, nbytes: int, options: TimingOptions) -> float:
    src = torch.randn(nbytes // 4, device=device.torch_device())
    dst = torch.empty_like(src)
    t = measure(lambda: dst.copy_(src), device, "eager", options)
    return 2 * src.nbytes / (t.median_ms / 1e3)


def _matmul_rate(device: Device, dtype: torch.dtype, n: int, options: TimingOptions) -> float:
    a = torch.randn(n, n, device=device.torch_device()).to(dtype)
    b = torch.randn(n, n, device=device.torch_device()).to(dtype)
    t = measure(lambda: a @ b, device, "eager", options)
    return 2 * n**3 / (t.median_ms / 1e3)


def calibrate(device: Device, copy_bytes: int = 1 << 30, matmul_n: int = 8192, save: bool = True) -> Limits:
    """Copy bandwidth (bytes read + written per second) from a large device-to-device copy, and
    the matmul rate per dtype from an n×n×n product on random data (no TF32 for f32)."""
    options = TimingOptions(budget_s=2.0, min_reps=5)
    bandwidth = _copy_bandwidth(device, copy_bytes, options)
    n = 1024 if device.host_timed else matmul_n  # the host computes it: a smaller product
    with reference_math():  # f32 means f32, not TF32
        flops = {name: _matmul_rate(device, dtype, n, options) for name, dtype in _MATMUL_DTYPES.items()}
    device.release_memory()
    limits = Limits(bandwidth, flops, f"calibrated {time.strftime('%Y-%m-%d')}")
    if save:
        _write_atomically(_cache_file(device), json.dumps(asdict(limits), indent=1))
    return limits
