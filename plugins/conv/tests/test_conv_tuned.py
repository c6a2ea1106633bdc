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


def test_gradients_keep_their_tuned_launches_apart_from_the_forward_s(monkeypatch):
    """A tuned Conv2dDgrad row keys its data gradient, a Conv2dTranspose row its data gradient with
    the bias added, a Conv2dWgrad row the weight gradient; each is what a plain run and the
    variants' first take for that problem, and the forward conv of the same geometry keeps its rule."""
    from npuops_conv import conv_grad_kernel as gk

    registry = load_registry()
    rows = [_tuned_row(op=name, workload="W1") for name in ("Conv2dDgrad", "Conv2dTranspose", "Conv2dWgrad")]
    assert registry.op("Conv2dTranspose").kernel_bias(registry.op("Conv2dTranspose").workload("W1"))
    table = tuned.launches_from_results(rows)
    assert sorted(key.split()[0] for key in table) == ["dgrad", "dgrad+bias", "wgrad"]
    monkeypatch.setattr(tuned, "tuned_launches", lambda: table)
    dgrad = registry.op("Conv2dDgrad")
    w = dgrad.workload("W1")
    g, dtype = dgrad.geometry(w), w.dtype_of("input")
    q = gk.Grad(ck.Problem(g, dtype))
    assert gk.chosen_dgrad(q) == ck.ConvLaunch(**TUNED) != gk.dgrad_default(q)
    assert gk.dgrad_kernel(g, dtype).config["block_K"] == TUNED["block_K"]
    assert dgrad.tilelang_variants(w)[0] == TUNED and gk.dgrad_default(q).as_dict() in dgrad.tilelang_variants(w)
    wgrad = registry.op("Conv2dWgrad")
    gw = wgrad.geometry(wgrad.workload("W1"))
    assert gk.chosen_wgrad(gk.Grad(ck.Problem(gw, dtype), gw.bias)) == ck.ConvLaunch(**TUNED)
    assert ck.chosen_launch(ck.Problem(g, dtype)) == ck.default_launch(ck.Problem(g, dtype))
