"""scripts/publish-results.py: a sweep's shard files as benchmarks/DEVICE/ (the merged results, the
reports, a README saying how they were produced and the headline), the same bytes from the same
inputs, and nothing replaced where the inputs are refused."""

from __future__ import annotations

import gzip
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from npuops.cli import main as npuops
from npuops.results import read_results, row_key
from npuops.summary import geomean_text, sol_pct_text, summarize_results
from test_merge import LIMITS, env, write
from test_summary import row

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "publish-results.py"
FILES = ["README.md", "report.html", "report.md", "results.jsonl.gz"]
DEVICE = {"device": "cuda", "model": "NVIDIA H200", "capability": "sm_90", "multiprocessors": 132, "memory_gib": 139.8,
          "driver": "580.159.04", "cuda_runtime": "13.0"}
VERSIONS = {"python": "3.12.3", "torch": "2.11.0", "tilelang": "0.1.15", "triton": "3.6.0", "npuops": "0.1.0"}


def _script():
    spec = importlib.util.spec_from_file_location("publish_results", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


publish_main = _script().main


def shard_env(index, count=2, git="4242ccabdfb9"):
    return env(f"s{index}", git=git, shard=f"{index}/{count}", device=DEVICE, versions=VERSIONS, host="vm",
               started=f"2026-12-03T14:3{index}:00+0000",
               argv=["/venv/bin/npuops", "run", "--tune", "--kernel-time", "--shard", f"{index}/{count}",
                     "--out", f"shard{index}.jsonl"])


def sweep_rows():
    """norm · RMSNormFwd, ours against torch_compile on W1 (ours twice as fast by kernel time) and W2
    (ours behind), both regimes, each workload's rows in one shard's run; a wrong vendor row;
    pool · MaxPool2dFwd, ours skipped."""
    rows = []
    for shard, (workload, ours_ms, alt_ms) in enumerate((("W1", 0.002, 0.004), ("W2", 0.004, 0.003)), 1):
        for regime in ("eager", "graph"):
            rows += [row("RMSNormFwd", "tilelang", "ours", regime, ours_ms, workload, run_id=f"s{shard}",
                         kernel_ms=ours_ms / 2),
                     row("RMSNormFwd", "torch_compile", "torch_compile", regime, alt_ms, workload, run_id=f"s{shard}",
                         kernel_ms=alt_ms / 2)]
    rows += [row("RMSNormFwd", "broken", "vendor", "eager", None, "W1", status="wrong", reason="output 0: 3 NaN",
                 run_id="s1"),
             row("MaxPool2dFwd", "tilelang", "ours", "eager", None, "W1", "pool", status="skipped",
                 reason="tilelang runs on cuda, not cpu", run_id="s2"),
             row("MaxPool2dFwd", "torch_eager", "torch_eager", "eager", 0.5, "W1", "pool", run_id="s2")]
    for r in rows:
        if r["status"] == "ok":
            r["timing"]["clock_mhz"] = 1980.0
    return rows


@pytest.fixture
def shards(tmp_path):
    """The sweep as two shard files, the second gzip-compressed."""
    rows = sweep_rows()
    first = write(tmp_path / "shard1.jsonl", shard_env(1), *(r for r in rows if r["run_id"] == "s1"))
    second = write(tmp_path / "shard2.jsonl", shard_env(2), *(r for r in rows if r["run_id"] == "s2"))
    compressed = tmp_path / "shard2.jsonl.gz"
    compressed.write_bytes(gzip.compress(second.read_bytes()))
    second.unlink()
    return [first, compressed]


def publish(capsys, folder, *argv):
    code = publish_main([*map(str, argv), "--device", "h200", "--into", str(folder)])
    out, err = capsys.readouterr()
    return code, out, err


def contents(folder):
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


def test_four_files_every_row_once_and_the_same_bytes_from_the_same_inputs(capsys, tmp_path, shards):
    folder = tmp_path / "h200"
    code, out, err = publish(capsys, folder, *shards)
    assert code == 0 and err == "" and "published 11 rows of 2 runs" in out
    first = contents(folder)
    assert sorted(first) == FILES
    data = first["results.jsonl.gz"]
    assert data[:4] == b"\x1f\x8b\x08\x00" and data[4:8] == b"\0\0\0\0"  # no name, no time: `gzip -n`
    lines = gzip.decompress(data).splitlines()
    assert len(lines) == 2 + 11  # the two runs' env records, then every row once
    published = read_results(folder / "results.jsonl.gz")
    assert [row_key(r) for r in published.rows] == sorted(row_key(r) for r in sweep_rows())
    assert publish(capsys, folder, *shards)[0] == 0
    assert contents(folder) == first
    again = tmp_path / "again"
    assert publish(capsys, again, *reversed(shards))[0] == 0  # the order of the inputs changes no figure
    assert {**contents(again), "README.md": None} == {**first, "README.md": None}  # its commands name them in order


def test_the_reports_are_what_npuops_report_writes(capsys, tmp_path, shards):
    folder = tmp_path / "h200"
    publish(capsys, folder, *shards)
    for fmt, name in (("markdown", "report.md"), ("html", "report.html")):
        assert npuops(["report", str(folder / "results.jsonl.gz"), "--format", fmt, "-o", str(tmp_path / name)]) == 0
        assert (tmp_path / name).read_bytes() == (folder / name).read_bytes()


def test_the_readme_says_where_how_and_the_headline(capsys, tmp_path, shards):
    folder = tmp_path / "h200"
    publish(capsys, folder, *shards)
    readme = (folder / "README.md").read_text()
    assert readme.startswith("# npuops results: h200 (NVIDIA H200)\n")
    for fact in ("- Device: NVIDIA H200, sm_90, 132 SMs, 139.8 GiB, driver 580.159.04, CUDA runtime 13.0",
                 "- Host: host vm, Python 3.12.3, torch 2.11.0, tilelang 0.1.15, triton 3.6.0, npuops 0.1.0",
                 "- SM clock when each row was timed: 1980 MHz on every timed row",
                 "- Revision: 4242ccabdfb9 (every row)",
                 ("- Calibration (the limits of SOL): copy 4.00 TB/s, matmul TFLOP/s bf16 800.0; "
                  f"source: {LIMITS['source']} (every row)"),
                 "- Runs: 2, of shards 1/2, 2/2, started 2026-12-03T14:31:00+0000 to 2026-12-03T14:32:00+0000"):
        assert fact + "\n" in readme
    commands = readme.split("```bash\n")[1].split("```")[0].splitlines()
    assert commands == [
        "git checkout 4242ccabdfb9",
        "npuops calibrate --device cuda",
        "npuops run --tune --kernel-time --shard 1/2 --out shard1.jsonl",
        "npuops run --tune --kernel-time --shard 2/2 --out shard2.jsonl",
        "npuops merge shard1.jsonl shard2.jsonl.gz -o results.jsonl.gz",
        "npuops report results.jsonl.gz --format markdown -o report.md",
        "npuops report results.jsonl.gz --format html -o report.html",
        "# or the merge, both reports and this README at once, into benchmarks/h200/:",
        "python scripts/publish-results.py shard1.jsonl shard2.jsonl.gz --device h200"]
    assert "9 ok, 1 wrong, 0 failed, 1 skipped; 2 ops in 2 families; regimes eager, graph." in readme
    # The headline is the summary's: by kernel time, 2.0 on W1 and 0.75 on W2, ours leading on one.
    norm = next(line for line in summarize_results(read_results(folder / "results.jsonl.gz")).lines
                if (line.family, line.op) == ("norm", None))
    figures = norm.regimes["eager"]
    assert figures.by_kernels and geomean_text(figures) == "1.22×k" and (figures.leads, figures.compared) == (1, 2)
    cells = [f"{figures.leads} of {figures.compared}", geomean_text(figures), sol_pct_text(figures)]
    assert f"| norm | 1 | 2 | 2 | {' | '.join(cells * 2)} | 1/0 |\n" in readme
    assert "| pool | 1 | 1 | 0 | · | — | · | · | — | · | · |\n" in readme
    assert "kernel time where it is marked k, else device time" in readme


def test_the_command_given_replaces_the_runs_own(capsys, tmp_path, shards):
    folder = tmp_path / "h200"
    command = "npuops run --tune --kernel-time --shard $I/2 --out shard$I.jsonl"
    assert publish(capsys, folder, *shards, "--command", command)[0] == 0
    commands = (folder / "README.md").read_text().split("```bash\n")[1].split("```")[0].splitlines()
    assert commands[2] == command and not any("--shard 1/2" in line for line in commands)
    assert commands[-1].endswith(f"--device h200 --command '{command}'")


def test_mixed_revisions_are_refused_leaving_the_set_and_said_when_forced(capsys, tmp_path, shards):
    folder = tmp_path / "h200"
    publish(capsys, folder, *shards)
    before = contents(folder)
    other = write(tmp_path / "shard2-new.jsonl", shard_env(2, git="def456"),
                  *(r for r in sweep_rows() if r["run_id"] == "s2"))
    code, out, err = publish(capsys, folder, shards[0], other)
    assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("error: inputs differ in git revision")
    assert "4242ccabdfb9" in err and "def456" in err and "--force" in err
    assert contents(folder) == before  # no file replaced, no temporary file left
    assert publish(capsys, tmp_path / "fresh", shards[0], other)[0] == 2 and not (tmp_path / "fresh").exists()

    code, _, err = publish(capsys, folder, shards[0], other, "--force")
    assert code == 0 and "warning: inputs differ in git revision" in err
    readme = (folder / "README.md").read_text()
    # shard 1 holds W1's 4 rows and the wrong one, shard 2 the other 6
    assert ("- Revision: **several, merged with --force**; rows measured under each:\n"
            "  - def456: 6 rows (55%)\n  - 4242ccabdfb9: 5 rows (45%)\n") in readme
    assert "(merged anyway: --force)" in readme and "# at the revisions above: 4242ccabdfb9, def456" in readme
    assert "-o results.jsonl.gz --force" in readme


def test_a_missing_shard_is_refused_unless_forced(capsys, tmp_path, shards):
    code, _, err = publish(capsys, tmp_path / "h200", shards[0])
    assert code == 2 and err.count("\n") == 1 and "no run of shard 2/2 is among the inputs" in err
    assert not (tmp_path / "h200").exists()
    assert publish(capsys, tmp_path / "h200", shards[0], "--force")[0] == 0
    assert "- no run of shard 2/2 is among the inputs: their rows are missing\n" in (tmp_path / "h200" / "README.md").read_text()


@pytest.mark.parametrize("name, content, message", [
    ("missing.jsonl", None, "results file '{path}' does not exist"),
    ("binary.jsonl", b"\x00\xff garbage\n\x89PNG\n", "results file '{path}' holds no records (2 malformed lines)"),
    ("empty.jsonl.gz", b"", "results file '{path}' holds no records (it is empty)"),
    ("folder.jsonl", "folder", "results file '{path}' is a directory"),
])
def test_a_missing_or_malformed_input_gets_one_line_naming_it(capsys, tmp_path, shards, name, content, message):
    path = tmp_path / name
    if content == "folder":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    code, out, err = publish(capsys, tmp_path / "h200", *shards, path)
    assert code == 2 and out == "" and err.count("\n") == 1 and message.format(path=path) in err
    assert not (tmp_path / "h200").exists()


def test_the_script_runs_as_a_command(tmp_path, shards):
    """As a user runs it: exit status and one line, no traceback, for a success and a refusal."""
    def run(*argv):
        return subprocess.run([sys.executable, str(SCRIPT), *map(str, argv), "--device", "h200",
                               "--into", str(tmp_path / "h200")], check=False, capture_output=True, text=True,
                              env=os.environ.copy())

    done = run(*shards)
    assert done.returncode == 0 and done.stderr == "" and sorted(os.listdir(tmp_path / "h200")) == FILES
    missing = run(tmp_path / "nothing.jsonl")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "Traceback" not in missing.stderr
