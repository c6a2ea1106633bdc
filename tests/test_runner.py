"""The runner end to end on the CPU: rows, the correctness gate, isolation, resume."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace


from npuops.registry import load_registry
from npuops.results import read_results, row_key
from npuops.runner import Runner, RunOptions
from npuops.timing import TimingOptions

FAST = TimingOptions(budget_s=0.05, min_reps=3, warmup_s=0.01)


def run(tmp_path: Path, impls=None, jobs=1, out="results.jsonl", tune=False, task_timeout_s=600.0):
    registry = load_registry()
    options = RunOptions(device="cpu", jobs=jobs, timing=FAST, tune=tune, tuning_timing=FAST,
                         task_timeout_s=task_timeout_s)
    runner = Runner(registry, options, tmp_path / out)
    counts = runner.run(registry.workloads("ToyScaleFwd"), impls)
    return counts, read_results(tmp_path / out)


def test_rows_for_every_impl_and_regime(toy, tmp_path):
    counts, results = run(tmp_path)
    impls = {r["impl"] for r in results.rows}
    assert impls == {"toy_ours", "toy_tunable", "torch_eager", "torch_compile", "torch_compile_reduce_overhead"}
    by = {(r["workload"], r["impl"], r["regime"]): r for r in results.rows}
    ok = by[("W1", "toy_ours", "eager")]
    assert ok["status"] == "ok" and ok["timing"]["median_ms"] > 0 and ok["timing"]["n"] >= 3
    assert ok["check"]["max_error"] <= 1.0
    assert ok["config"] == {"threads": 128}  # the launch configuration travels with the row
    assert "config" not in by[("W1", "torch_eager", "eager")]
    # CPU has no graphs, and reduce-overhead needs CUDA: skipped, with the reason.
    assert by[("W1", "toy_ours", "graph")]["status"] == "skipped"
    assert "graph" in by[("W1", "toy_ours", "graph")]["reason"]
    assert "CUDA" in by[("W2", "torch_compile_reduce_overhead", "eager")]["reason"]
    assert counts["ok"] == 2 * 4 and counts["skipped"] == 2 * 5 + 2 * 1
    env = next(iter(results.env.values()))
    assert env["device"]["device"] == "cpu" and env["versions"]["torch"]


def test_unwritten_output_is_wrong_and_crash_fails_only_its_row(toy, tmp_path, monkeypatch):
    monkeypatch.setenv("TOY_BAD_IMPLS", "1")
    counts, results = run(tmp_path, impls=["half_written", "crashes", "toy_ours"], jobs=2)
    by = {(r["workload"], r["impl"], r["regime"]): r for r in results.rows}
    wrong = by[("W1", "half_written", "eager")]
    assert wrong["status"] == "wrong" and "NaN" in wrong["reason"] and "timing" not in wrong
    crashed = by[("W1", "crashes", "eager")]
    assert crashed["status"] == "failed" and "exit code 7" in crashed["reason"]
    # The workers that replaced the crashed ones carried on.
    assert by[("W2", "toy_ours", "eager")]["status"] == "ok"


def test_rerun_resumes_without_duplicates(toy, tmp_path):
    run(tmp_path)
    first = (tmp_path / "results.jsonl").read_text().count('"record": "row"')
    counts, results = run(tmp_path)
    assert counts["ok"] == 0 and counts["resumed"] == first
    assert (tmp_path / "results.jsonl").read_text().count('"record": "row"') == first


def test_kill_minus_9_loses_no_finished_row(toy, tmp_path, killed_after_first_row):
    out = tmp_path / "killed.jsonl"
    cmd = [sys.executable, "-m", "npuops.cli", "run", "--device", "cpu", "--op", "ToyScaleFwd",
           "--out", str(out), "--budget", "0.3", "--no-progress"]
    killed_after_first_row(cmd, out)
    before = read_results(out)
    finished = {row_key(r) for r in before.rows}
    assert finished, "the run was killed before any row finished; nothing to check"
    # A record cut in half by the kill must not corrupt the file for the resumed run.
    with open(out, "a") as f:
        f.write('{"record": "row", "op": "ToyScal')
    subprocess.run(cmd, env=os.environ.copy(), check=True, capture_output=True, timeout=300)
    after = read_results(out)
    lines = [json.loads(line) for line in out.read_text().splitlines() if line.startswith('{"') and line.endswith("}")]
    keys = [row_key(r) for r in lines if r.get("record") == "row"]
    assert len(keys) == len(set(keys)), "a row was written twice"
    assert finished <= {row_key(r) for r in after.rows}
    assert len(after.rows) == 2 * 5 * 2  # 2 workloads x 5 impls x 2 regimes, all present once


def test_user_workloads_from_a_file_run_like_catalog_ones(toy, tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('[[workload]]\nop = "ToyScaleFwd"\nid = "U1"\nlabel = "mine"\ndtype = "bf16"\n'
                    'shapes = { x = [3000] }\nparams = { alpha = 0.5 }\n')
    out = tmp_path / "user.jsonl"
    cmd = [sys.executable, "-m", "npuops.cli", "run", "--workloads", str(path), "--device", "cpu",
           "--impl", "toy_ours", "--regime", "eager", "--budget", "0.05", "--out", str(out), "--no-progress"]
    subprocess.run(cmd, env=os.environ.copy(), check=True, capture_output=True, timeout=300)
    (row,) = read_results(out).rows
    assert (row["workload"], row["label"], row["status"], row["source"]) == ("U1", "mine", "ok", str(path))


def test_plain_run_builds_the_default_variant(toy, tmp_path):
    _, results = run(tmp_path, impls=["toy_tunable"])
    row = next(r for r in results.rows if r["regime"] == "eager")
    assert row["config"] == {"spin_s": 0.002} and "tuning" not in row


def test_tuning_checks_every_variant_and_measures_the_fastest(toy, tmp_path):
    _, results = run(tmp_path, impls=["toy_tunable"], tune=True)
    row = next(r for r in results.rows if r["regime"] == "eager" and r["workload"] == "W1")
    assert row["status"] == "ok" and row["config"] == {"spin_s": 0.0}
    tried = {tuple(t["config"].items()): t["median_ms"] for t in row["tuning"]}
    assert len(tried) == 2 and tried[(("spin_s", 0.002),)] > 2 * tried[(("spin_s", 0.0),)]
    assert row["timing"]["median_ms"] < 1.0  # the fast variant's own measurement, not the slow one's


def test_tuning_breaks_near_ties_by_the_graph_regime():
    """Variants close to the fastest eager one are timed replayed too and the least sum of both
    medians is measured; one not close is not replayed, nor any where the task has no graph regime."""
    from npuops.devices import CPUDevice
    from npuops.runner import _tune

    def spin(seconds):
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            pass

    def variant(eager_s, replay_extra_s):
        def call():
            spin(eager_s)

        call.config = {"eager_s": eager_s, "replay_extra_s": replay_extra_s}
        return call

    class ReplayingCPU(CPUDevice):
        graphs = True

        def capture_graph(self, call):
            return lambda: (call(), spin(call.func.config["replay_extra_s"]))

    fns = [variant(0.002, 0.004), variant(0.002, 0.0), variant(0.008, 0.0)]
    options = RunOptions(device="cpu", tuning_timing=FAST, tuning_tie=0.25)
    chosen, tuning = _tune(fns, {}, ReplayingCPU(), options, graph_capture=True)
    assert chosen == 1 and [("graph_median_ms" in t) for t in tuning] == [True, True, False]
    assert tuning[0]["graph_median_ms"] > 2.5 * tuning[1]["graph_median_ms"]
    chosen, tuning = _tune(fns, {}, ReplayingCPU(), options, graph_capture=None)
    assert chosen in (0, 1) and not any("graph_median_ms" in t for t in tuning)


def test_tuning_with_kernel_times_ranks_variants_by_them(monkeypatch):
    """With kernel times on, the variant of the least kernel time is measured, even where its
    event time (launch latency and all) is the longer; each tried variant records both."""
    from npuops import runner
    from npuops.devices import CPUDevice
    from npuops.timing import KernelTime

    def variant(event_s, kernel_ms):
        def call():
            start = time.perf_counter()
            while time.perf_counter() - start < event_s:
                pass

        call.config = {"kernel_ms": kernel_ms}
        return call

    def fake_kernel_time(call, device, regime, iterations=20, capture=True):
        ms = call.func.config["kernel_ms"]
        return KernelTime(median_ms=ms, min_ms=ms, activities=1, n=iterations)

    monkeypatch.setattr(runner, "kernel_time", fake_kernel_time)
    fns = [variant(0.0, 0.003), variant(0.004, 0.001)]
    options = RunOptions(device="cpu", tuning_timing=FAST, kernel_time=True)
    chosen, tuning = runner._tune(fns, {}, CPUDevice(), options, graph_capture=None)
    assert chosen == 1 and tuning[1]["median_ms"] > tuning[0]["median_ms"]
    assert [t["kernel_median_ms"] for t in tuning] == [0.003, 0.001]
    chosen, _ = runner._tune(fns, {}, CPUDevice(), dataclasses.replace(options, kernel_time=False), graph_capture=None)
    assert chosen == 0


def test_a_wrong_variant_makes_the_row_wrong(toy, tmp_path, monkeypatch):
    monkeypatch.setenv("TOY_BAD_IMPLS", "1")
    _, results = run(tmp_path, impls=["toy_tunable"], tune=True)
    row = next(r for r in results.rows if r["regime"] == "eager")
    assert row["status"] == "wrong" and "variant" in row["reason"] and row["config"]["writes"] == "half"
    assert "timing" not in row


def test_a_hanging_variant_fails_its_row_naming_the_variant(toy, tmp_path, monkeypatch):
    monkeypatch.setenv("TOY_HANGING_VARIANT", "1")
    _, results = run(tmp_path, impls=["toy_tunable", "toy_ours"], jobs=2, tune=True, task_timeout_s=5.0)
    by = {(r["workload"], r["impl"], r["regime"]): r for r in results.rows}
    hung = by.pop(("W1", "toy_tunable", "eager"))
    assert hung["status"] == "failed"
    assert hung["reason"] == "timed out after 5 s at variant {'spin_s': 3600.0}: first call"
    # The other worker waited for the device lock the hung one held (on the CPU every task holds
    # it throughout) without that wait counting against its own timeout, and the worker that
    # replaced the hung one carried on.
    assert {(key, row["status"]) for key, row in by.items() if row["regime"] == "eager"} == {
        (("W1", "toy_ours", "eager"), "ok"), (("W2", "toy_tunable", "eager"), "ok"), (("W2", "toy_ours", "eager"), "ok")}


def test_inductor_autotuning_takes_the_device_lock():
    """torch.compile's first call times its candidate kernel configs; beside other workers'
    measurements that choice would be noise, so those timings take the device lock."""
    from torch._inductor.runtime.benchmarking import benchmarker

    from npuops.runner import autotuning_under

    events = []

    class Lock:
        def __enter__(self):
            events.append("locked")

        def __exit__(self, *exc):
            events.append("unlocked")

    with autotuning_under(Lock()):
        # The call Inductor's autotuner makes for each candidate config.
        benchmarker.benchmark(lambda: events.append("timed"), device="cpu", warmup=0, rep=1)
    assert events[0] == "locked" and events[-1] == "unlocked" and set(events[1:-1]) == {"timed"}
    benchmarker.benchmark(lambda: events.append("after"), device="cpu", warmup=0, rep=1)
    assert "benchmark" not in vars(benchmarker) and events[-1] == "after"  # the lock is left out again


def _event(name, kind, activity, start, end, corr=0):
    """A torch.profiler FunctionEvent's fields call_spans reads (no activity type: as older torch has)."""
    from torch.autograd import DeviceType

    event = SimpleNamespace(name=name, device_type=getattr(DeviceType, kind), id=corr,
                            time_range=SimpleNamespace(start=start, end=end))
    if activity:
        event.activity_type = activity
    return event


def test_kernel_spans_keep_only_what_each_timed_call_launched():
    """The profiler's events of two timed calls, each after a flush and a hold: a call's span runs
    from the first activity it launched to the last (a kernel and a copy in call one, a graph's two
    kernels in call two, its launch without an activity type, as older torch records it, known by
    its name); a third call's cooperative kernel, whose launch the profiler did not record, by
    where it ran: after the hold launched before that call. The flush's and the hold's kernels, the
    device-side annotation and a CPU op sharing a kernel's id count for nothing."""
    from npuops.timing import CALL_LABEL, call_spans

    events = [
        _event("aten::zero_", "CPU", "cpu_op", 0, 5, corr=7),  # an op id equal to a kernel's correlation id
        _event("cudaLaunchKernel", "CPU", "cuda_runtime", 1, 2, corr=1), _event("fill", "CUDA", "kernel", 10, 40, corr=1),
        _event("cudaLaunchKernel", "CPU", "cuda_runtime", 3, 4, corr=2), _event("spin", "CUDA", "kernel", 40, 90, corr=2),
        _event(CALL_LABEL, "CPU", "user_annotation", 6, 20),
        _event("cuLaunchKernel", "CPU", "cuda_driver", 7, 8, corr=7), _event("main_kernel", "CUDA", "kernel", 91, 93, corr=7),
        _event("cudaMemcpyAsync", "CPU", "cuda_runtime", 9, 10, corr=8), _event("copy", "CUDA", "gpu_memcpy", 93.5, 95, corr=8),
        _event(CALL_LABEL, "CUDA", "gpu_user_annotation", 91, 95),
        _event("cudaLaunchKernel", "CPU", "cuda_runtime", 30, 31, corr=9), _event("fill", "CUDA", "kernel", 100, 130, corr=9),
        _event(CALL_LABEL, "CPU", "user_annotation", 40, 50),
        _event("cudaGraphLaunch", "CPU", None, 41, 45, corr=11),
        _event("a", "CUDA", "kernel", 200, 201.5, corr=11), _event("b", "CUDA", "kernel", 202, 204, corr=11),
        _event("cudaLaunchKernel", "CPU", "cuda_runtime", 60, 61, corr=12), _event("spin", "CUDA", "kernel", 205, 300, corr=12),
        _event(CALL_LABEL, "CPU", "user_annotation", 70, 80),
        _event("coop", "CUDA", "kernel", 301, 310, corr=13),  # its cuLaunchCooperativeKernel not recorded
        _event("cudaLaunchKernel", "CPU", "cuda_runtime", 90, 91, corr=14), _event("fill", "CUDA", "kernel", 311, 340, corr=14),
    ]
    assert call_spans(events) == [(4.0, 2), (4.0, 2), (9.0, 1)]
    assert call_spans(events[:5]) == []  # no timed call


def test_kernel_time_on_a_device_whose_profiler_records_no_kernels_leaves_rows_without_it(toy, tmp_path):
    registry = load_registry()
    options = RunOptions(device="cpu", timing=FAST, kernel_time=True)
    Runner(registry, options, tmp_path / "k.jsonl").run(registry.workloads("ToyScaleFwd"), ["toy_ours"])
    rows = [r for r in read_results(tmp_path / "k.jsonl").rows if r["status"] == "ok"]
    assert rows and all(r["kernel_time"] is None for r in rows)


def test_kernel_time_says_when_the_profiler_saw_nothing_the_call_launched(monkeypatch):
    """A profiler that records only the host (as torch.profiler does on the CPU) sees no device
    activity of the call: kernel_time says so rather than reporting a span of nothing."""
    import pytest
    import torch
    from torch.profiler import ProfilerActivity

    from npuops.timing import NoDeviceActivity, kernel_time

    device = load_registry().device("cpu")
    monkeypatch.setattr(type(device), "profiler_activity", lambda self: ProfilerActivity.CPU)
    x = torch.ones(16)
    with pytest.raises(NoDeviceActivity, match="no device activity"):
        kernel_time(lambda: x.add_(1), device, "eager", iterations=2)


def test_eager_rows_record_what_a_call_costs_back_to_back(toy, tmp_path):
    """Each eager row gets its wall time per back-to-back call: toy_tunable's default variant
    spins 2 ms per call on the host, so no call takes less; rows not timed have none."""
    _, results = run(tmp_path, impls=["toy_tunable"])
    by = {(r["workload"], r["regime"]): r for r in results.rows}
    for workload in ("W1", "W2"):
        calls = by[(workload, "eager")]["call_time"]
        assert 2.0 <= calls["min_ms"] <= calls["median_ms"] and calls["min_ms"] < 20.0
        assert calls["calls"] >= 1 and calls["n"] == 5
        assert "call_time" not in by[(workload, "graph")]  # skipped on the CPU


def test_call_time_counts_the_longer_of_host_cost_and_device_time():
    """On a device that runs calls after the host queues them, back-to-back calls cost the device's
    time where it is longer than the host's, and the host's where that is: the one synchronize
    after the loop waits for the queue to drain."""
    from npuops.devices import CPUDevice
    from npuops.timing import call_time

    class QueueingDevice(CPUDevice):
        """Each call queues ``device_s`` of work; synchronize waits until it has all run."""

        busy_until = 0.0

        def synchronize(self):
            time.sleep(max(0.0, self.busy_until - time.perf_counter()))

    def launcher(device, host_s, device_s):
        def call():
            time.sleep(host_s)  # sleeps, not spins: the test shares its cores
            device.busy_until = max(device.busy_until, time.perf_counter()) + device_s

        return call

    # The lower bounds hold whatever the load; the upper ones (minimums, robust to preemption) rule
    # out a loop that charged host and device time one after the other (2.5 ms), with room for a
    # loaded machine's late wake-ups (the minimum of 2 ms calls was 2.21 ms while other tests ran).
    device = QueueingDevice()
    device_bound = call_time(launcher(device, 0.0005, 0.002), device, FAST)
    assert 2.0 <= device_bound.median_ms and device_bound.min_ms < 2.4
    host_bound = call_time(launcher(device, 0.002, 0.0005), device, FAST)
    assert 2.0 <= host_bound.median_ms and host_bound.min_ms < 2.4


def test_a_worker_s_start_up_does_not_count_against_its_task_s_timeout(monkeypatch):
    from pytest import approx

    from npuops import runner

    clock = [100.0]
    monkeypatch.setattr(runner.time, "monotonic", lambda: clock[0])
    worker = runner._Worker(0, None, None, None)
    worker.take(runner.Task("ToyScaleFwd", None, "toy_ours", ("eager",)))
    clock[0] += 30.0  # still importing torch and the plugins
    assert worker.task_seconds() == 0.0
    clock[0] += runner.START_UP_S  # a start-up that hangs still ends
    assert worker.task_seconds() == approx(30.0)
    worker.enter("build")
    clock[0] += 2.0
    assert worker.task_seconds() == approx(2.0)  # the task's own time counts from its first stage


def test_call_time_of_a_slow_call_keeps_to_the_budget():
    """A call of a third of a second (a large convolution on a CPU) gets the samples its budget
    allows, not call_loops of them: on a CPU run, call time must not take a task's whole timeout."""
    from npuops.devices import CPUDevice
    from npuops.timing import TimingOptions, call_time

    options = TimingOptions(warmup_s=0.0, budget_s=0.5, call_loop_s=0.005, call_loops=5)
    started = time.perf_counter()
    timing = call_time(lambda: time.sleep(0.3), CPUDevice(), options)
    assert timing.calls == 1 and 1 <= timing.n < options.call_loops and timing.median_ms >= 300
    assert time.perf_counter() - started < 3.5  # warm-up (3 calls) and at most 3 samples
