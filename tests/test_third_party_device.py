"""A third-party device gets the torch baselines without a change to the core: the baselines and the
runner ask the device what it supports (``compiles``, ``compile_graphs``, ``graphs``, ...), never
its name. The plugin below adds "fakecuda", a CUDA stand-in backed by the CPU, without graphs."""

from __future__ import annotations

import json

from npuops.cli import main
from npuops.registry import load_registry
from npuops.results import read_results
from npuops.runner import Runner, RunOptions
from npuops.timing import TimingOptions

FAKECUDA = '''
import torch
from npuops import Device, hookimpl


class FakeCuda(Device):
    """Computes on the CPU; torch.compile works there (inductor's C++ backend); no device graphs."""

    name = "fakecuda"
    preference = -1  # never the default device
    compiles = True

    def torch_device(self):
        return torch.device("cpu")


@hookimpl
def npuops_devices():
    return [FakeCuda()]
'''

BASELINES = ("torch_eager", "torch_compile", "torch_compile_reduce_overhead")


def install(toy):
    toy.install("npuops-fakecuda", "npuops_fakecuda", FAKECUDA, entry_name="fakecuda")


def test_the_registry_and_the_cli_offer_a_plugin_s_device(toy, capsys):
    install(toy)
    registry = load_registry()
    assert not registry.errors
    device = registry.device("fakecuda")
    assert registry.plugins["fakecuda"].devices == ["fakecuda"]
    assert registry.device().name == "cpu"  # preference -1: cpu stays the default
    assert main(["plugins", "--json"]) == 0
    plugins = {p["name"]: p for p in json.loads(capsys.readouterr().out)}
    assert plugins["fakecuda"]["devices"] == ["fakecuda"] and not plugins["fakecuda"]["errors"]
    assert (device.graphs, device.compiles, device.compile_graphs, device.host_timed) == (False, True, False, True)
    assert device.profiler_activity() is None


def test_the_torch_baselines_answer_from_the_device_s_capabilities(toy):
    install(toy)
    registry = load_registry()
    op = registry.op("ToyScaleFwd")
    w = op.workloads[0]
    device = registry.device("fakecuda")

    def why_not(device):
        return {name: registry.implementation(op.name, name).why_not(op, w, device) for name in BASELINES}

    answers = why_not(device)
    assert answers["torch_eager"] is None and answers["torch_compile"] is None
    assert "fakecuda" in answers["torch_compile_reduce_overhead"]
    assert "reduce-overhead" in answers["torch_compile_reduce_overhead"]

    # The same device declaring more (or less) gets more (or fewer) baselines: no name is checked.
    device.compile_graphs = True
    assert why_not(device) == dict.fromkeys(BASELINES)
    device.compiles = device.compile_graphs = False
    answers = why_not(device)
    assert answers["torch_eager"] is None
    assert "torch.compile has no backend for fakecuda" in answers["torch_compile"]
    assert "reduce-overhead" in answers["torch_compile_reduce_overhead"]

    # The built-in devices declare what they had by name: cuda all three, cpu no reduce-overhead.
    assert why_not(registry.devices["cuda"]) == dict.fromkeys(BASELINES)
    cpu = why_not(registry.devices["cpu"])
    assert cpu["torch_eager"] is None and cpu["torch_compile"] is None and cpu["torch_compile_reduce_overhead"]


def test_a_run_on_a_plugin_s_device_times_what_it_supports_and_skips_the_rest(toy, tmp_path):
    install(toy)
    registry = load_registry()
    fast = TimingOptions(budget_s=0.05, min_reps=3, warmup_s=0.01)
    options = RunOptions(device="fakecuda", timing=fast)
    runner = Runner(registry, options, tmp_path / "results.jsonl")
    workloads = [w for w in registry.workloads("ToyScaleFwd") if w.id == "W1"]
    runner.run(workloads, ["torch_eager", "torch_compile_reduce_overhead"])
    rows = {(r["impl"], r["regime"]): r for r in read_results(tmp_path / "results.jsonl").rows}
    assert {r["device"] for r in rows.values()} == {"fakecuda"}
    assert rows[("torch_eager", "eager")]["status"] == "ok"
    assert rows[("torch_eager", "graph")]["status"] == "skipped"
    assert "needs device graphs, which fakecuda lacks" in rows[("torch_eager", "graph")]["reason"]
    for regime in ("eager", "graph"):
        row = rows[("torch_compile_reduce_overhead", regime)]
        assert row["status"] == "skipped" and "reduce-overhead" in row["reason"], row
