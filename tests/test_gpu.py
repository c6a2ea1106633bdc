"""On a CUDA GPU (marker ``gpu``; skipped elsewhere): the timing protocol and every op's baselines."""

from __future__ import annotations

import itertools
import time

import pytest
import torch

from npuops.check import check
from npuops.registry import load_registry
from npuops.runner import Runner, RunOptions
from npuops.timing import TimingOptions, kernel_time, measure

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


def test_kernel_time_reads_the_calls_device_activity_alone(registry):
    """Two small kernels with 2 ms of host work between them: the profiler's span covers both
    kernels and nothing of the host, in both regimes, and is no longer than the event time."""
    device = registry.device("cuda")
    x = torch.zeros(1 << 20, device="cuda")

    def two_kernels_slow_host():
        x.add_(1)
        time.sleep(0.002)
        x.mul_(0.5)

    for regime in ("eager", "graph"):
        kernels = kernel_time(two_kernels_slow_host, device, regime)
        assert kernels.activities == 2 and kernels.n == 20
        assert 0 < kernels.median_ms < 0.05, f"{regime}: {kernels.median_ms} ms is more than two small kernels"
        assert kernels.median_ms <= measure(two_kernels_slow_host, device, regime, TimingOptions(budget_s=0.2)).median_ms


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


WHERE = '''
import torch
from npuops import Implementation, hookimpl


def _where(op, w, device):
    alpha = op.config(w)["alpha"]
    seen = {}

    def scale(x):
        seen.setdefault("tensor", x.device.index)
        return x * alpha

    scale.config = {"current": torch.cuda.current_device(), "built_for": device.index, "inputs_on": seen}
    return scale


@hookimpl
def npuops_implementations(ops):
    return [Implementation("ToyScaleFwd", "where", "vendor", _where)]
'''


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_several_gpus_each_row_runs_wholly_on_its_device(toy, tmp_path):
    """--devices cuda:0,cuda:1: each worker selected its GPU before building, its inputs were made
    there, and its rows say so; both GPUs measured."""
    toy.install("npuops-where", "npuops_where", WHERE, entry_name="where")
    registry = load_registry()
    options = RunOptions(device="cuda", jobs=2, timing=TimingOptions(budget_s=0.1), devices=(0, 1))
    Runner(registry, options, tmp_path / "r.jsonl").run(registry.workloads("ToyScaleFwd"), ["where", "toy_ours"])
    from npuops.results import read_results

    rows = [r for r in read_results(tmp_path / "r.jsonl").rows if r["status"] != "skipped"]
    assert all(r["status"] == "ok" for r in rows), rows
    assert {r["device_index"] for r in rows} == {0, 1}
    for r in rows:
        if r["impl"] == "where":
            assert r["config"] == {"current": r["device_index"], "built_for": r["device_index"],
                                   "inputs_on": {"tensor": r["device_index"]}}, r


def test_flush_evicts_lines_kept_with_evict_last(registry):
    """torch.compile's Triton kernels load windows and weights with an L2 evict_last hint; after the
    flush, a buffer read that way must time as cold as a copy never read before."""
    triton = pytest.importorskip("triton")
    tl = pytest.importorskip("triton.language")

    @triton.jit
    def read_evict_last(x, out, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out + tl.program_id(0), tl.sum(tl.load(x + offs, eviction_policy="evict_last"), axis=0))

    device = registry.device("cuda")
    copies = [torch.randn(1 << 20, device="cuda") for _ in range(64)]  # 4 MiB each, 256 MiB in all
    out = torch.empty(1024, device="cuda")
    fresh_copies = itertools.cycle(copies[1:])

    def read(x):
        read_evict_last[(1024,)](x, out, BLOCK=1024)

    options = TimingOptions(budget_s=0.3)
    same = measure(lambda: read(copies[0]), device, "eager", options).median_ms
    fresh = measure(lambda: read(next(fresh_copies)), device, "eager", options).median_ms
    assert same > 0.93 * fresh, f"the same buffer read in {same * 1e3:.2f} µs, fresh copies in {fresh * 1e3:.2f} µs"


def test_flush_leaves_no_write_back_debt(registry, monkeypatch):
    """The flush overwrites twice the L2, leaving it full of dirty lines; unless it also reads as
    much back, their write-back lands in the timed call. One more clean read of twice the L2 must
    then change nothing (an overwrite-only flush left 3.7 µs of write-back in our 64 MiB RMSNorm
    W5 kernel on the H200)."""
    device = registry.device("cuda")
    src = torch.randn(8 << 20, device="cuda")  # 32 MiB read, 32 MiB written
    dst = torch.empty_like(src)
    extra = torch.ones(torch.cuda.get_device_properties(0).L2_cache_size // 2, device="cuda")  # 2x L2
    total = torch.empty((), device="cuda")
    options = TimingOptions(budget_s=0.3)
    as_flushed = measure(lambda: dst.copy_(src), device, "eager", options).median_ms
    flusher = device.cache_flusher

    def read_once_more():
        flush = flusher()
        return lambda: (flush(), torch.sum(extra, dim=0, out=total))

    monkeypatch.setattr(device, "cache_flusher", read_once_more)
    cleaner = measure(lambda: dst.copy_(src), device, "eager", options).median_ms
    assert abs(as_flushed - cleaner) < 0.03 * cleaner, (
        f"copy after the flush {as_flushed * 1e3:.2f} µs, after one more clean read {cleaner * 1e3:.2f} µs")
