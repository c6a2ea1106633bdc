"""On a CUDA GPU (marker ``gpu``; skipped elsewhere): the timing protocol and every op's baselines."""

from __future__ import annotations

import time

import pytest
import torch

from npuops.check import check
from npuops.registry import load_registry
from npuops.runner import Runner, RunOptions
from npuops.timing import TimingOptions, measure

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def registry():
    return load_registry(strict=True)


def test_hold_keeps_host_overhead_out_of_device_time(registry):
    """A call that spends 2 ms on the host before a tiny kernel must time as the kernel alone."""
    device = registry.device("cuda")
    x = torch.zeros(1024, device="cuda")

    def slow_host_call():
        time.sleep(0.002)
        x.add_(1)

    t = measure(slow_host_call, device, "eager", TimingOptions(budget_s=0.3))
    assert t.hold_us and t.hold_us >= 4000
    assert t.median_ms < 0.1, f"host time leaked into device time: {t.median_ms} ms"


def test_copy_time_is_near_bandwidth(registry):
    device = registry.device("cuda")
    src = torch.randn(64 << 20, device="cuda")  # 256 MiB
    dst = torch.empty_like(src)
    for regime in ("eager", "graph"):
        t = measure(lambda: dst.copy_(src), device, regime, TimingOptions(budget_s=0.3))
        tbps = 2 * src.nbytes / (t.median_ms / 1e3) / 1e12
        assert 1.0 < tbps < 6.0, f"{regime}: {tbps:.2f} TB/s is not a plausible H100/H200 copy rate"


def _smallest(op):
    return min(op.workloads, key=op.memory_bytes)


def test_every_op_baseline_passes_its_check_on_cuda(registry):
    device = registry.device("cuda")
    failures = []
    for op in registry.ops.values():
        w = _smallest(op)
        impl = registry.implementation(op.name, "torch_eager")
        result = check(op, w, impl.build(op, w, device.torch_device()), device, seed=3)
        if not result.ok:
            failures.append(f"{w.key}: {result.detail}")
    assert not failures, "\n".join(failures)


def test_runner_on_cuda_both_regimes(toy, tmp_path):
    registry = load_registry()
    options = RunOptions(device="cuda", jobs=2, timing=TimingOptions(budget_s=0.1))
    Runner(registry, options, tmp_path / "r.jsonl").run(registry.workloads("ToyScaleFwd"))
    from npuops.results import read_results

    rows = {(r["workload"], r["impl"], r["regime"]): r for r in read_results(tmp_path / "r.jsonl").rows}
    for key in [("W1", "toy_ours", "eager"), ("W1", "toy_ours", "graph"), ("W2", "torch_compile", "graph"),
                ("W2", "torch_compile_reduce_overhead", "eager"), ("W1", "torch_compile_reduce_overhead", "graph")]:
        assert rows[key]["status"] == "ok", rows[key]
        assert rows[key]["timing"]["clock_mhz"]
