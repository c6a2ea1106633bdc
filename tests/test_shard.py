"""Issue 38 on the CPU: `npuops run --shard I/N` slices the plan disjointly and completely, in
balanced slices, each resumable; `npuops merge` of the slices equals an unsharded run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from npuops.cli import main
from npuops.merge import merge_results, write_results
from npuops.registry import load_registry
from npuops.results import read_results, row_key
from npuops.runner import Runner, RunOptions, Shard, base_row, plan, shard_plan
from npuops.timing import REGIMES, TimingOptions

FAST = TimingOptions(budget_s=0.05, min_reps=3, warmup_s=0.01)


def unit(op, workload, fingerprint, impl):
    return (op, workload, fingerprint, impl)


def units_of(tasks, skipped):
    return ({unit(t.op, t.workload.id, t.workload.fingerprint, t.impl) for t in tasks}
            | {unit(r["op"], r["workload"], r["fingerprint"], r["impl"]) for r in skipped})


def row_keys(registry, device, tasks, skipped, cache=None):
    """The keys of the rows the plan's tasks and skipped rows make (``cache``: id of a task -> its keys)."""
    keys = [row_key(r) for r in skipped]
    for t in tasks:
        if cache is None or id(t) not in cache:
            op, impl = registry.op(t.op), registry.implementation(t.op, t.impl)
            found = [row_key(base_row(op, t.workload, impl, regime, device.name)) for regime in t.regimes]
            if cache is None:
                keys += found
                continue
            cache[id(t)] = found
        keys += cache[id(t)]
    return keys


def test_shards_of_the_whole_catalog_are_disjoint_cover_it_and_are_balanced():
    registry = load_registry()
    device = registry.device("cpu")
    tasks, skipped = plan(registry, registry.workloads(), None, device, REGIMES)
    cache = {}
    every = row_keys(registry, device, tasks, skipped, cache)
    assert len(every) == len(set(every))
    for count in (1, 2, 3, 7, 64):
        check_slices(tasks, skipped, every, count, lambda s: row_keys(registry, device, *s, cache))


def check_slices(tasks, skipped, every, count, keys_of):
    slices = [shard_plan(tasks, skipped, Shard(i, count)) for i in range(1, count + 1)]
    keys = [keys_of(s) for s in slices]
    together = Counter(k for ks in keys for k in ks)
    assert set(together) == set(every) and max(together.values()) == 1  # every planned row exactly once
    sizes = [len(units_of(*s)) for s in slices]
    assert max(sizes) - min(sizes) <= 1  # implementation-workload pairs dealt evenly
    for s in slices:  # a pair's regimes stay together: one task, one build
        assert units_of(*s).isdisjoint(set().union(*(units_of(*o) for o in slices if o is not s)))
    if count == 3:
        # Not each implementation on one slice, as dealing in plan order would do with 3 per op.
        for impl, n in Counter(t.impl for t in tasks).items():
            if n >= 10:
                assert sum(any(t.impl == impl for t in s[0]) for s in slices) == 3, impl


def test_which_slice_owns_a_pair_does_not_depend_on_what_the_machine_can_run():
    """A pair skipped up front on one machine (no compiler, no graphs) and runnable on another
    belongs to the same slice on both, so slices run on unlike machines still never overlap."""
    registry = load_registry()
    device = registry.device("cpu")
    pool = [w for w in registry.workloads() if registry.op(w.op).family == "pool"]
    tasks, skipped = plan(registry, pool, None, device, REGIMES)
    moved = tasks[: len(tasks) // 2]
    elsewhere_skipped = skipped + [
        {**base_row(registry.op(t.op), t.workload, registry.implementation(t.op, t.impl), r, device.name),
         "status": "skipped", "reason": "not here"} for t in moved for r in t.regimes]
    for i in (1, 2, 3):
        here = units_of(*shard_plan(tasks, skipped, Shard(i, 3)))
        there = units_of(*shard_plan(tasks[len(moved):], elsewhere_skipped, Shard(i, 3)))
        assert here == there


@pytest.mark.parametrize("text, message", [
    ("3/2", "I must be from 1 to N=2"),
    ("0/0", "N (the number of slices) must be at least 1"),
    ("0/3", "I must be from 1 to N=3"),
    ("x", "expected I/N"),
    ("1/x", "expected I/N with whole numbers"),
    ("1/2/3", "expected I/N"),
    ("", "expected I/N"),
])
def test_bad_shard_values_get_one_line_naming_what_would_be_right(capsys, text, message):
    with pytest.raises(SystemExit) as exc:
        main(["run", "--device", "cpu", "--op", "MaxPool2dFwd", "--shard", text])
    _, err = capsys.readouterr()
    assert exc.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert f"argument --shard: {message}" in err


def test_shard_parse_accepts_i_of_n():
    assert Shard.parse("2/3") == Shard(2, 3) and str(Shard.parse(" 1/1 ")) == "1/1"


def _run(tmp_path, name, shard=None, impls=("toy_ours", "torch_eager", "torch_compile_reduce_overhead")):
    registry = load_registry()
    options = RunOptions(device="cpu", timing=FAST, shard=shard)
    Runner(registry, options, tmp_path / name).run(registry.workloads("ToyScaleFwd"), list(impls))
    return tmp_path / name


def test_merged_shards_equal_an_unsharded_run(toy, tmp_path):
    whole = read_results(_run(tmp_path, "whole.jsonl"))
    parts = [_run(tmp_path, f"part{i}.jsonl", Shard(i, 3)) for i in (1, 2, 3)]
    keys = [read_results(p).keys() for p in parts]
    assert all(keys)  # 2 workloads x 3 implementations dealt over 3 slices: 2 pairs each
    assert not (keys[0] & keys[1] or keys[1] & keys[2] or keys[0] & keys[2])
    merged = merge_results(parts)
    assert merged.overlaps == 0 and not merged.notes
    write_results(tmp_path / "merged.jsonl.gz", merged.env, merged.rows)
    back = read_results(tmp_path / "merged.jsonl.gz")
    assert back.keys() == whole.keys() and len(back.rows) == len(whole.rows) == 2 * 3 * 2
    assert {env.get("shard") for env in back.env.values()} == {"1/3", "2/3", "3/3"}
    assert all(row["run_id"] in back.env for row in back.rows)


def test_a_killed_shard_resumes_with_its_own_rows_only(toy, tmp_path, killed_after_first_row):
    registry = load_registry()
    device = registry.device("cpu")
    shard = Shard(1, 2)
    mine = row_keys(registry, device, *shard_plan(*plan(registry, registry.workloads("ToyScaleFwd"), None, device,
                                                              REGIMES), shard))
    out = tmp_path / "shard.jsonl"
    cmd = [sys.executable, "-m", "npuops.cli", "run", "--device", "cpu", "--op", "ToyScaleFwd", "--shard", str(shard),
           "--out", str(out), "--budget", "0.3", "--no-progress"]
    killed_after_first_row(cmd, out)
    finished = read_results(out).keys()
    assert finished and finished < set(mine), "the kill came before any row or after every row"
    subprocess.run(cmd, env=os.environ.copy(), check=True, capture_output=True, timeout=300)
    lines = [json.loads(line) for line in out.read_text().splitlines() if line.startswith('{"') and line.endswith("}")]
    keys = [row_key(r) for r in lines if r.get("record") == "row"]
    assert len(keys) == len(set(keys)), "a row was written twice"
    assert set(keys) == set(mine)  # the slice, whole, and nothing of the other slice
    assert {r["shard"] for r in lines if r.get("record") == "env"} == {"1/2"}
