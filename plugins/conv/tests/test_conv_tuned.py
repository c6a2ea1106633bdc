"""Tuned launches kept as data: read from a tuned run's results, used by a plain run and by the
functions for the same problem, the launch rule for every other."""

import json

import torch

from npuops.registry import load_registry
from npuops_conv import conv_kernel as ck
from npuops_conv import tuned

TUNED = {"kernel": "gemm", "block_M": 64, "block_N": 64, "block_K": 32, "num_stages": 2, "threads": 128, "splits": 1}


def _tuned_row(op="Conv2dFwd", workload="W1", **extra):
    return {"op": op, "workload": workload, "tier": "ours", "status": "ok", "impl": "tilelang",
            "tuning": [{"config": TUNED, "eager_median_ms": 0.01}],
            "config": {**TUNED, "layout": "channels-last", "k_tiles": 9}, **extra}


def test_a_tuned_run_s_choices_become_the_table(tmp_path):
    op = load_registry().op("Conv2dFwd")
    w = op.workload("W1")
    rows = [_tuned_row(), _tuned_row(workload="W2", tuning=None), _tuned_row(status="wrong"),
            _tuned_row(op="MaxPool2dFwd")]
    table = tuned.launches_from_results(rows)
    assert table == {tuned.problem_key(op.geometry(w), w.dtype_of("input"), False): TUNED}
    results = tmp_path / "tuned.jsonl"
    results.write_text("".join(json.dumps({"record": "row", "family": "conv", "label": "l", "dtype": "f16",
                                           "fingerprint": "f", "regime": "eager", "device": "cuda",
                                           "compute_dtype": "f16", "plugin": "conv", "run_id": "r",
                                           "source": "catalog", "bytes": 1, "flops": 1,
                                           "timing": {"median_ms": 0.01, "min_ms": 0.01, "q1_ms": 0.01,
                                                      "q3_ms": 0.01, "n": 10, "stable": True},
                                           **r}) + "\n" for r in rows[:1]))
    assert tuned.main([str(results), "-o", str(tmp_path / "table.json")]) == 0
    assert json.loads((tmp_path / "table.json").read_text()) == table


def test_the_table_s_launch_is_what_a_plain_run_and_the_key_take(monkeypatch):
    op = load_registry().op("Conv2dFwd")
    w = op.workload("W1")
    g, dtype = op.geometry(w), w.dtype_of("input")
    p = ck.Problem(g, dtype)
    assert ck.chosen_launch(p) == ck.default_launch(p)  # the shipped table names no such problem yet
    monkeypatch.setattr(tuned, "tuned_launches", lambda: {tuned.problem_key(g, dtype, False): TUNED})
    assert ck.chosen_launch(p) == ck.ConvLaunch(**TUNED)
    assert ck.conv_kernel(g, dtype).config["block_M"] == 64
    assert ck.kernel_key(g, dtype).launch == tuple(sorted(TUNED.items()))
    assert ck.launch_variants(p)[0] == TUNED and ck.default_launch(p).as_dict() in ck.launch_variants(p)
    other = ck.Problem(g, torch.bfloat16)  # another problem: the rule
    assert ck.chosen_launch(other) == ck.default_launch(other)


def test_problem_keys_name_every_size():
    op = load_registry().op("Conv1dCausal")
    w = op.workload("W15")
    key = tuned.problem_key(op.geometry(w), w.dtype_of("input"), False)
    assert key == "f16 N1 80>1280 3000 k3 s1 p2/0 d1 g1 bias"
