"""Issue 38 on the CPU: `npuops run --devices` (a timing worker and a device lock per device, tasks
dealt to whichever device is free, one resumable results file) without GPUs.

The plugin below adds "multicpu": MULTICPU_COUNT stand-in devices (default 2) backed by the CPU,
addressed as multicpu:0, multicpu:1, ... like cuda's. Selecting one sets MULTICPU_SELECTED in the
worker, which the "whoami" implementation puts in its rows' config: a row's device_index can be
checked against the device its worker selected. With MULTICPU_RENDEZVOUS set to a folder, whoami's
first call in each worker waits (under its device lock: the stand-ins are host-timed, so the whole
task holds it) until a second worker has made its first call too, and fails after 60 s alone: with
one lock shared by the devices that never happens."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest
import torch

from npuops import devices as devices_module
from npuops.cli import main
from npuops.registry import load_registry
from npuops.results import read_results, row_key
from npuops.runner import Runner, RunOptions, base_row, parse_devices, plan
from npuops.timing import TimingOptions

FAST = TimingOptions(budget_s=0.05, min_reps=3, warmup_s=0.01)
IMPLS = ["toy_ours", "toy_tunable", "torch_eager", "whoami"]

MULTICPU = '''
import os
import time
from pathlib import Path

import torch
from npuops import CPUDevice, Implementation, hookimpl


class MultiCpu(CPUDevice):
    name = "multicpu"
    preference = -1  # never the default device

    def device_count(self):
        return int(os.environ.get("MULTICPU_COUNT", "2"))

    def torch_device(self):
        return torch.device("cpu")

    def select(self):
        os.environ["MULTICPU_SELECTED"] = str(self.index)

    def describe(self):
        models = os.environ.get("MULTICPU_MODELS")
        model = models.split(",")[self.index] if models and self.index is not None else "stand-in"
        return {"device": self.name, "model": model}


@hookimpl
def npuops_devices():
    return [MultiCpu()]


_MET = []


def _rendezvous(folder):
    if _MET:
        return
    Path(folder, str(os.getpid())).write_text(os.environ.get("MULTICPU_SELECTED", ""))
    deadline = time.monotonic() + 60
    while len(os.listdir(folder)) < 2:
        if time.monotonic() > deadline:
            raise RuntimeError("no other worker measured while this one held its device lock")
        time.sleep(0.01)
    _MET.append(True)


def _whoami(op, w, device):
    alpha = op.config(w)["alpha"]
    folder = os.environ.get("MULTICPU_RENDEZVOUS")

    def scale(x):
        if folder:
            _rendezvous(folder)
        return x * alpha

    scale.config = {"selected": os.environ.get("MULTICPU_SELECTED")}
    return scale


@hookimpl
def npuops_implementations(ops):
    return [Implementation("ToyScaleFwd", "whoami", "vendor", _whoami)]
'''


@pytest.fixture
def multicpu(toy):
    toy.install("npuops-multicpu", "npuops_multicpu", MULTICPU, entry_name="multicpu")
    return toy


def run(tmp_path, devices, jobs=1, impls=IMPLS, out="results.jsonl"):
    registry = load_registry()
    options = RunOptions(device="multicpu", jobs=jobs, timing=FAST, tuning_timing=FAST, devices=devices)
    runner = Runner(registry, options, tmp_path / out)
    counts = runner.run(registry.workloads("ToyScaleFwd"), impls)
    return registry, runner, counts, read_results(tmp_path / out)


def test_every_planned_row_is_measured_once_on_the_device_whose_worker_took_it(multicpu, tmp_path, monkeypatch):
    monkeypatch.setenv("MULTICPU_COUNT", "3")
    registry, runner, counts, results = run(tmp_path, (0, 1, 2))
    device = registry.device("multicpu")
    tasks, skipped = plan(registry, registry.workloads("ToyScaleFwd"), IMPLS, device, ("eager", "graph"))
    planned = [row_key(r) for r in skipped] + [
        row_key(base_row(registry.op(t.op), t.workload, registry.implementation(t.op, t.impl), regime, device.name))
        for t in tasks for regime in t.regimes]
    keys = Counter(row_key(r) for r in results.rows)
    assert set(keys) == set(planned) and max(keys.values()) == 1
    assert counts["ok"] == len(planned) - len(skipped) == 8 and runner.planned == len(planned)
    measured = [r for r in results.rows if r["status"] != "skipped"]
    assert all(r["status"] == "ok" for r in measured)
    # Every worker took a task at the start: all three devices measured some.
    assert {r["device_index"] for r in measured} == {0, 1, 2}
    assert all("device_index" not in r for r in results.rows if r["status"] == "skipped")  # not measured anywhere
    for r in measured:
        if r["impl"] == "whoami":  # the worker selected the device its rows name
            assert r["config"] == {"selected": str(r["device_index"])}
    (env,) = results.env.values()
    assert env["devices"] == ["multicpu:0", "multicpu:1", "multicpu:2"] and env["device"]["model"] == "stand-in"
    assert {p.name for p in (tmp_path / "results.jsonl.logs").glob("device-*.lock")} == {
        "device-0.lock", "device-1.lock", "device-2.lock"}


def test_two_devices_measure_at_once(multicpu, tmp_path, monkeypatch):
    """Each of the two tasks holds its device's lock until the other device's worker is measuring
    too (see the module's docstring): with one lock for both, each would fail after 60 s alone."""
    meet = tmp_path / "meet"
    meet.mkdir()
    monkeypatch.setenv("MULTICPU_RENDEZVOUS", str(meet))
    results = run(tmp_path, (0, 1), impls=["whoami"])[3]
    by = {r["workload"]: r for r in results.rows if r["regime"] == "eager"}
    assert {r["status"] for r in by.values()} == {"ok"}, [r.get("reason") for r in by.values()]
    assert sorted(r["device_index"] for r in by.values()) == [0, 1]
    assert sorted(p.read_text() for p in meet.iterdir()) == ["0", "1"]


def test_a_killed_several_device_run_resumes_without_losing_or_repeating_rows(multicpu, tmp_path, killed_after_first_row):
    out = tmp_path / "killed.jsonl"
    cmd = [sys.executable, "-m", "npuops.cli", "run", "--device", "multicpu", "--devices", "all", "--op", "ToyScaleFwd",
           "--impl", ",".join(IMPLS), "--out", str(out), "--budget", "0.3", "--no-progress"]
    killed_after_first_row(cmd, out)
    finished = {row_key(r) for r in read_results(out).rows}
    assert finished, "the run was killed before any row finished; nothing to check"
    subprocess.run(cmd, env=os.environ.copy(), check=True, capture_output=True, timeout=300)
    lines = [json.loads(line) for line in out.read_text().splitlines() if line.startswith('{"') and line.endswith("}")]
    keys = [row_key(r) for r in lines if r.get("record") == "row"]
    assert len(keys) == len(set(keys)), "a row was written twice"
    after = read_results(out)
    assert finished <= {row_key(r) for r in after.rows}
    assert len(after.rows) == 2 * 4 * 2  # 2 workloads x 4 impls x 2 regimes, all present once
    assert {r["device_index"] for r in after.rows if r["status"] == "ok"} <= {0, 1}


@pytest.mark.parametrize("value, message", [
    ("cuda0", "'cuda0' is not NAME:INDEX"),
    ("cuda:x", "'cuda:x' is not NAME:INDEX"),
    ("cuda:-1", "'cuda:-1' is not NAME:INDEX"),
    ("cuda:0,,cuda:1", "an empty entry"),
    ("", "an empty entry"),
    ("cuda:0,npu:1", "of one kind; got cuda, npu"),
    ("cuda:1,cuda:1", "cuda:1 named twice"),
])
def test_malformed_device_lists_get_one_line(capsys, value, message):
    with pytest.raises(SystemExit) as exc:
        main(["run", "--op", "MaxPool2dFwd", "--devices", value])
    _, err = capsys.readouterr()
    assert exc.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert "argument --devices:" in err and message in err, err


@pytest.mark.parametrize("argv, message", [
    (["--devices", "multicpu:7"], "no multicpu:7 here; this machine has 2 multicpu devices, multicpu:0 to multicpu:1 (or --devices all)"),
    (["--devices", "multicpu:0,multicpu:2,multicpu:3"], "no multicpu:2, multicpu:3 here"),
    (["--device", "cpu", "--devices", "all"], "the cpu device has no device indices"),
    (["--devices", "cpu:0"], "the cpu device has no device indices"),
    (["--device", "cpu", "--devices", "multicpu:0"], "--devices names multicpu devices but --device is cpu"),
    (["--devices", "gpu:0"], "unknown device 'gpu'"),
])
def test_devices_this_machine_lacks_get_one_line(multicpu, tmp_path, capsys, argv, message):
    code = main(["run", "--op", "ToyScaleFwd", "--out", str(tmp_path / "r.jsonl"), "--no-progress", *argv])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "r.jsonl").exists() or not (tmp_path / "r.jsonl").read_text()


def test_devices_of_different_models_are_refused_naming_them(multicpu, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MULTICPU_COUNT", "3")
    monkeypatch.setenv("MULTICPU_MODELS", "H100,H100,A100")
    code = main(["run", "--device", "multicpu", "--devices", "all", "--op", "ToyScaleFwd", "--out", str(tmp_path / "r.jsonl")])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1
    assert "differ in model (multicpu:0 H100, multicpu:1 H100, multicpu:2 A100)" in err
    assert main(["run", "--devices", "multicpu:0,multicpu:1", "--op", "ToyScaleFwd", "--impl", "whoami",
                 "--regime", "eager", "--budget", "0.05", "--out", str(tmp_path / "r.jsonl"), "--no-progress"]) == 0
    (env,) = read_results(tmp_path / "r.jsonl").env.values()
    assert env["device"]["model"] == "H100" and env["devices"] == ["multicpu:0", "multicpu:1"]


def test_parse_devices():
    assert parse_devices("all") == (None, None)
    assert parse_devices("cuda:0, cuda:3") == ("cuda", (0, 3))
    assert parse_devices("npu:1") == ("npu", (1,))


class _FakeCudaApi:
    def __init__(self):
        self.calls = []

    def device_count(self):
        return 2

    def current_device(self):
        return 0

    def set_device(self, index):
        self.calls.append(("set_device", index))

    def get_device_properties(self, index):
        self.calls.append(("properties", index))
        return type("Props", (), {"name": f"GPU{index}", "total_memory": 1 << 30, "multi_processor_count": 1,
                                  "L2_cache_size": 1 << 20, "major": 9, "minor": 0})()

    def mem_get_info(self, index=None):
        self.calls.append(("mem_get_info", index))
        return (1 << 29, 1 << 30)


def test_the_cuda_device_threads_its_index_through_torch(monkeypatch):
    api = _FakeCudaApi()
    cuda = devices_module.CUDADevice()
    cuda._module = api
    assert cuda.device_count() == 2 and cuda.index is None and cuda.label == "cuda"
    one = cuda.at(1)
    assert cuda.index is None and one.index == 1 and one.label == "cuda:1"
    assert one.torch_device() == torch.device("cuda", 1) and cuda.torch_device() == torch.device("cuda")
    assert one.model() == "GPU1" and one.total_memory() == 1 << 30
    assert ("properties", 1) in api.calls and ("mem_get_info", 1) in api.calls
    one.select()
    assert ("set_device", 1) in api.calls
    cpu = devices_module.CPUDevice()
    assert cpu.device_count() is None
    with pytest.raises(ValueError, match="no device indices"):
        cpu.at(0)
