"""The CUDA device's L2 flush, with the GPU and the driver faked (the real one runs in test_gpu.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from npuops import devices


class FakeCuda:
    def __init__(self, calls):
        self.calls = calls

    def current_device(self):
        return 0

    def get_device_properties(self, index):
        return SimpleNamespace(L2_cache_size=1 << 20)

    def synchronize(self):
        self.calls.append("synchronize")


@pytest.fixture
def flusher(monkeypatch):
    """A cuda device's flusher on the CPU; returns (flush, calls, set_status)."""
    calls, status = [], [0]
    device = devices.CUDADevice(preference=0)
    device._module = FakeCuda(calls)
    monkeypatch.setattr(device, "torch_device", lambda: torch.device("cpu"))

    def reset():
        calls.append("reset")
        return status[0]

    monkeypatch.setattr(devices, "_persisting_l2_reset", lambda: reset)
    flush = device.cache_flusher()
    zero_, sum_ = torch.Tensor.zero_, torch.sum

    def overwrite(tensor):
        calls.append(f"overwrite {tensor.nbytes}")
        return zero_(tensor)

    def read(tensor, *args, **kwargs):
        calls.append(f"read {tensor.nbytes}")
        return sum_(tensor, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "zero_", overwrite)
    monkeypatch.setattr(torch, "sum", read)
    return flush, calls, lambda value: status.__setitem__(0, value)


def test_cuda_flush_resets_persisting_lines_after_queued_work_then_leaves_only_clean_lines(flusher):
    """Twice the L2 (64 MiB at least) overwritten, then as much read: the overwrite's dirty lines
    are written back during the flush, not during the timed call."""
    flush, calls, _ = flusher
    flush()
    flush()
    assert calls == ["synchronize", "reset", f"overwrite {64 << 20}", f"read {64 << 20}"] * 2


def test_cuda_flush_reports_a_failed_reset(flusher):
    flush, _, set_status = flusher
    set_status(201)
    with pytest.raises(RuntimeError, match="cuCtxResetPersistingL2Cache failed .*201"):
        flush()
