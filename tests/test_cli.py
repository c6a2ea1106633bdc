"""The CLI's contracts and its errors for bad input."""

from __future__ import annotations

import json

import pytest

from npuops.cli import main


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_list_counts_everything(capsys):
    code, out, _ = run_cli(capsys, "list")
    assert code == 0 and "4 families, 45 ops, 414 workloads" in out


def test_list_json_contract(capsys):
    code, out, _ = run_cli(capsys, "list", "--json")
    records = json.loads(out)
    assert code == 0 and len(records) == 414
    assert set(records[0]) == {"family", "op", "id", "label", "dtype", "implementations"}
    rms = [r for r in records if r["op"] == "RMSNormFwd"]
    assert len(rms) == 9 and "hf_llama_rms_norm" in rms[0]["implementations"]
    assert "torch_compile_reduce_overhead" in rms[0]["implementations"]


def test_list_filters(capsys):
    _, out, _ = run_cli(capsys, "list", "--json", "--family", "pool", "--op", "MaxPool2dFwd", "--workload", "W3")
    assert [(r["op"], r["id"], r["dtype"]) for r in json.loads(out)] == [("MaxPool2dFwd", "W3", "f32")]


@pytest.mark.parametrize("argv, expected", [
    (["list", "--op", "RMSNormFw"], "unknown op 'RMSNormFw'; did you mean 'RMSNormFwd'"),
    (["list", "--family", "nrom"], "unknown family 'nrom'; did you mean 'norm'"),
    (["list", "--op", "RMSNormFwd", "--workload", "W99"], "unknown workload 'W99'"),
    (["run", "--op", "RMSNormFwd", "--impl", "torch_eagre", "--device", "cpu"], "did you mean 'torch_eager'"),
    (["run", "--op", "RMSNormFwd", "--device", "tpu"], "unknown device 'tpu'"),
    (["run", "--op", "RMSNormFwd", "--device", "cpu", "--regime", "graf"], "unknown regime 'graf'; did you mean 'graph'"),
    (["report", "no-such-file.jsonl"], "results file 'no-such-file.jsonl' does not exist"),
])
def test_unknown_names_get_closest_matches(capsys, argv, expected):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert expected in " ".join(err.split())


def test_plugins_table(capsys):
    code, out, _ = run_cli(capsys, "plugins", "--json")
    plugins = {p["name"]: p for p in json.loads(out)}
    assert code == 0
    assert {"norm", "conv", "pool", "topk", "devices", "baselines"} <= set(plugins)
    assert len(plugins["norm"]["ops"]) == 23 and plugins["topk"]["distribution"] == "npuops-topk"


BAD_WORKLOADS = [
    ('[[workload]]\nop = "RMSNormFwd"\nid = "U1"\ndtype = "bf17"\nshapes = { x = [4, 8] }\n', "dtype 'bf17' is not known; allowed: bf16"),
    ('[[workload]]\nop = "RMSNormFwd"\nid = "U1"\ndtype = "bf16"\nshapes = { y = [4, 8] }\n', "'shapes' lacks x"),
    ('[[workload]]\nop = "RMSNormFwd"\nid = "U1"\ndtype = "bf16"\nshapes = { x = [4, 8] }\nparams = { epsilon = 1e-6 }\n', "unknown param 'epsilon'; allowed: eps"),
    ('[[workload]]\nop = "RMSNormFwd"\nid = "U1"\ndtype = "bf16"\nshapes = { x = [4, -8] }\n', "must be a list of non-negative integers"),
    ('[[workload]]\nop = "RMSNormFwd"\nid = "W1"\ndtype = "bf16"\nshapes = { x = [4, 8] }\n', "id 'W1' is already taken"),
    ('[[workload]]\nop = "RMSNormFwd"\ndtype = "bf16"\nshapes = { x = [4, 8] }\n', "missing field(s) id"),
    ('[[workload]]\nop = "MaxPool9dFwd"\nid = "U1"\ndtype = "bf16"\nshapes = { x = [4, 8] }\n', "unknown op 'MaxPool9dFwd'"),
    ("[[workload]\n", "is not valid TOML"),
]


@pytest.mark.parametrize("text, expected", BAD_WORKLOADS)
def test_bad_workload_files_name_the_field(capsys, tmp_path, text, expected):
    path = tmp_path / "w.toml"
    path.write_text(text)
    code, _, err = run_cli(capsys, "list", "--workloads", str(path))
    assert code == 2
    assert expected in " ".join(err.split())


def test_user_workloads_from_json_are_listed(capsys, tmp_path):
    path = tmp_path / "w.json"
    path.write_text(json.dumps({"workloads": [
        {"op": "RMSNormFwd", "id": "U1", "label": "odd-hidden", "dtype": "f16", "shapes": {"x": [3, 5120]}}]}))
    code, out, _ = run_cli(capsys, "list", "--json", "--workloads", str(path), "--op", "RMSNormFwd")
    assert code == 0 and [r["id"] for r in json.loads(out)][-1] == "U1"


def test_warm_without_a_gpu_says_why_in_one_line(capsys):
    code, out, err = run_cli(capsys, "warm", "--op", "RMSNormFwd")
    assert code == 2 and err.count("\n") == 1 and "device 'cuda' is not available here" in err


@pytest.mark.gpu
def test_warm_builds_each_kernel_key_once(capsys):
    code, out, _ = run_cli(capsys, "warm", "--op", "RMSNormFwd")
    assert code == 0 and "9 of 9 workloads have our kernel" in out
    assert "fast path reads tensors through torch's C++ objects" in out  # npuops.native built with them
