"""``npuops report A --against B``: two results files row by row."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from npuops.cli import main
from npuops.results import ResultsWriter
from test_report import LIMITS, row


def env(model="H200", git="new", limits=LIMITS, run_id="r1"):
    return {"record": "env", "run_id": run_id, "device": {"device": "cuda", "model": model}, "limits": limits,
            "versions": {"torch": "2.11"}, "git": git}


def kernels(ms):
    return {"median_ms": ms, "min_ms": ms, "activities": 1, "n": 20}


def write(path, records):
    with ResultsWriter(path) as w:
        for r in records:
            w.append(r)
    return path


@pytest.fixture
def files(tmp_path):
    """B the baseline, A the change: ours faster on W1 eager (4 → 2 us, kernels 3 → 1.5), slower on
    W1 graph (2 → 4), level on W2; torch_eager level; a vendor row that turned wrong, one that
    recovered; a row only in A, one only in B."""
    b = write(tmp_path / "b.jsonl", [
        env(git="old"),
        row("ours_kernel", "ours", "eager", 0.004, kernel_time=kernels(0.003)),
        row("ours_kernel", "ours", "graph", 0.002),
        row("ours_kernel", "ours", "eager", 0.010, workload="W2"),
        row("torch_eager", "torch_eager", "eager", 0.005),
        row("vendor_a", "vendor", "eager", 0.003),
        row("vendor_b", "vendor", "eager", None, status="failed", reason="launch failed"),
        row("old_impl", "open-source", "eager", 0.006),
    ])
    a = write(tmp_path / "a.jsonl", [
        env(git="new"),
        row("ours_kernel", "ours", "eager", 0.002, kernel_time=kernels(0.0015)),
        row("ours_kernel", "ours", "graph", 0.004),
        row("ours_kernel", "ours", "eager", 0.0101, workload="W2"),
        row("torch_eager", "torch_eager", "eager", 0.00505),
        row("vendor_a", "vendor", "eager", None, status="wrong", reason="output 0: 3 NaN"),
        row("vendor_b", "vendor", "eager", 0.003),
        row("new_impl", "open-source", "eager", 0.001),
    ])
    return a, b


def compare(capsys, a, b, fmt, *extra):
    assert main(["report", str(a), "--against", str(b), "--format", fmt, *extra]) == 0
    return capsys.readouterr().out


def test_json_matches_rows_and_computes_speedups(capsys, files):
    doc = json.loads(compare(capsys, *files, "json"))
    by = {(r["workload"], r["impl"], r["regime"]): r for r in doc["rows"]}
    assert len(by) == 8
    ours = by[("W1", "ours_kernel", "eager")]
    assert ours["speedup"] == pytest.approx(2.0) and ours["change"] == "faster"  # B / A: above 1, A is faster
    assert ours["median_ms_b"] == 0.004 and ours["median_ms_a"] == 0.002
    assert ours["kernel_speedup"] == pytest.approx(2.0) and ours["kernel_ms_a"] == 0.0015
    assert by[("W1", "ours_kernel", "graph")]["speedup"] == pytest.approx(0.5)
    assert by[("W1", "ours_kernel", "graph")]["change"] == "slower" and by[("W1", "ours_kernel", "graph")]["kernel_speedup"] is None
    assert by[("W2", "ours_kernel", "eager")]["change"] == "level" and by[("W1", "torch_eager", "eager")]["change"] == "level"
    assert by[("W1", "vendor_a", "eager")]["status_change"] == "ok → wrong" and by[("W1", "vendor_a", "eager")]["speedup"] is None
    assert by[("W1", "vendor_b", "eager")]["status_change"] == "failed → ok"
    assert by[("W1", "new_impl", "eager")]["in_b"] is False and by[("W1", "old_impl", "eager")]["in_a"] is False
    assert doc["counts"] == {"compared": 4, "faster": 1, "slower": 1, "level": 2, "only_in_a": 1, "only_in_b": 1,
                             "status_changes": 2}
    (family,) = doc["families"]
    assert family["family"] == "norm" and family["compared"] == 4 and family["ours_compared"] == 3
    assert family["geomean_speedup"] == pytest.approx((2.0 * 0.5 * (0.010 / 0.0101) * (0.005 / 0.00505)) ** 0.25)
    assert family["ours_geomean_speedup"] == pytest.approx((2.0 * 0.5 * (0.010 / 0.0101)) ** (1 / 3))
    assert doc["worst_regressions"] == ["norm · RMSNormFwd W1 decode bf16 · ours_kernel (ours) · graph"]
    assert [r["git"] for r in doc["a"]["runs"]] == ["new"] and [r["git"] for r in doc["b"]["runs"]] == ["old"]


def test_terminal_opens_with_the_runs_and_a_summary_then_the_changed_rows(capsys, files, monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")  # no line folded
    out = compare(capsys, *files, "terminal")
    lines = out.splitlines()
    assert lines[0].startswith("A: ") and "git new" in out and "git old" in out and "4.00 TB/s copy" in out
    assert "devices differ" not in out
    assert "4 rows timed in both: 1 faster in A, 1 slower, 2 within 2%; 2 status changes; 1 rows only in A, 1 only in B" in out
    assert "worst regressions:" in out and "graph: 0.0020 → 0.0040 ms (0.50×)" in out
    assert "ok → wrong: norm · RMSNormFwd W1 decode bf16 · vendor_a · eager: output 0: 3 NaN" in out
    assert "failed → ok" in out and "only in A: norm · RMSNormFwd W1 decode bf16 · new_impl" in out
    # the table: the changed rows only, the level ones counted
    assert "2.00×" in out and "0.50×" in out and "0.0050" not in out.split("worst regressions")[1]
    assert "2 rows within 2% or not timed in either file not shown" in out
    detail = compare(capsys, *files, "terminal", "--detail")
    assert "0.0050" in detail and "not shown" not in detail


def test_markdown_and_csv_carry_every_row(capsys, files):
    md = compare(capsys, *files, "markdown")
    assert md.startswith("# npuops comparison") and "## norm · RMSNormFwd" in md
    assert "| W1 decode bf16 | ours_kernel · ours | eager | 0.0040 | 0.0020 | 2.00× | 0.0030 → 0.0015 (2.00×) | ok |" in md
    assert "| W1 decode bf16 | vendor_a · vendor | eager | 0.0030 | · | — | · | ok → wrong |" in md
    assert "| only in A |" in md and "| only in B |" in md
    assert "| norm | 4 | 1 | 1 |" in md
    rows = list(csv.DictReader(io.StringIO(compare(capsys, *files, "csv"))))
    assert len(rows) == 8 and {r["status_change"] for r in rows} == {"", "ok → wrong", "failed → ok"}


def test_files_of_different_devices_and_calibrations_say_so_and_never_crash(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    b = write(tmp_path / "b.jsonl", [env(model="H100", git="abc"),
                                     {**row("ours_kernel", "ours", "eager", 0.004), "device": "cuda"}])
    a = write(tmp_path / "a.jsonl", [env(model="H200", git="abc", limits=None),
                                     {**row("ours_kernel", "ours", "eager", 0.002), "device": "cuda"},
                                     {**row("torch_eager", "torch_eager", "eager", 0.003), "run_id": "no-env"}])
    out = compare(capsys, a, b, "terminal")
    assert "devices differ (A: H200, unknown device; B: H100)" in out
    assert "calibrations differ" in out and "no limits" in out
    assert "same git revision" not in out  # A has an unknown revision too (the run without its env record)
    for fmt in ("markdown", "json", "csv"):
        assert "ours_kernel" in compare(capsys, a, b, fmt)


def test_a_file_compared_with_itself_is_level_and_says_same_revision(capsys, files):
    a, _ = files
    doc = json.loads(compare(capsys, a, a, "json"))
    assert doc["counts"]["level"] == doc["counts"]["compared"] == 6 and doc["counts"]["status_changes"] == 0
    assert any(n.startswith("same git revision (new)") for n in doc["notes"])


def test_filters_apply_to_both_files_and_html_is_refused(capsys, files):
    a, b = files
    assert main(["report", str(a), "--against", str(b), "--format", "json", "--family", "pool"]) == 2
    assert "holds no rows matching the filters" in capsys.readouterr().err
    assert main(["report", str(a), "--against", str(b), "--format", "html"]) == 2
    assert "--against renders" in capsys.readouterr().err
    assert main(["report", str(a), "--against", str(b.with_name("missing.jsonl"))]) == 2


def test_the_committed_results_of_two_devices_compare(capsys):
    """benchmarks/h100 against benchmarks/h200: the rows both devices timed (torch's, on the ops
    both measured) matched, each speed-up the H200's time over the H100's."""
    published = Path(__file__).resolve().parents[1] / "benchmarks"
    doc = json.loads(compare(capsys, published / "h100" / "results.jsonl.gz", published / "h200" / "results.jsonl.gz",
                             "json"))
    assert any(note.startswith("devices differ") for note in doc["notes"])
    both = [r for r in doc["rows"] if r["in_a"] and r["in_b"] and r["speedup"] is not None]
    assert len(both) == doc["counts"]["compared"] > 100
    for r in both:
        assert r["speedup"] == pytest.approx(r["median_ms_b"] / r["median_ms_a"])
