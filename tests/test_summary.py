"""The report's first screen (npuops.summary): coverage, geomean and worst ratio per family, op and
regime, skipped rows grouped by reason, wrong and failed rows named; and its size on a terminal."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from npuops.cli import main
from npuops.report import build_entries, render_markdown, render_terminal, throughput_text
from npuops.results import ResultsWriter, read_results
from npuops.summary import summarize_results

LIMITS = {"copy_bandwidth": 4e12, "flops": {"bf16": 800e12, "f32": 50e12}, "source": "test"}
GRAPHS = "the graph regime needs device graphs, which cpu lacks"
CUDA = "tilelang runs on cuda, not cpu"


def row(op, impl, tier, regime, median_ms, workload="W1", family="norm", status="ok", kernel_ms=None, **extra):
    r = {"record": "row", "run_id": "r1", "family": family, "op": op, "workload": workload, "label": "decode",
         "dtype": "bf16", "fingerprint": "f", "source": "catalog", "impl": impl, "tier": tier, "plugin": "p",
         "regime": regime, "device": "cuda", "bytes": 4_000_000, "flops": 1_000_000, "compute_dtype": "bf16",
         "status": status, **extra}
    if status == "ok":
        r["timing"] = {"median_ms": median_ms, "min_ms": median_ms, "q1_ms": median_ms, "q3_ms": median_ms,
                       "n": 50, "stable": True}
        if kernel_ms is not None:
            r["kernel_time"] = {"median_ms": kernel_ms, "min_ms": kernel_ms, "activities": 1, "n": 20}
    return r


@pytest.fixture
def results_path(tmp_path):
    return write_results(tmp_path / "s.jsonl")


def write_results(path):
    """norm: RMSNormFwd (ours on 3 of 4 workloads, by device time; a wrong alternative), LayerNormFwd
    (by kernel time; a failed ours on W2); pool: alternatives only; 5 skipped rows for 2 reasons."""
    rows = []
    for wid, ours, alt in (("W1", 0.002, 0.008), ("W2", 0.004, 0.002), ("W3", 0.001, 0.001)):
        rows += [row("RMSNormFwd", "tilelang", "ours", "eager", ours, wid),
                 row("RMSNormFwd", "torch_compile", "torch_compile", "eager", alt, wid)]
    rows += [row("RMSNormFwd", "torch_compile", "torch_compile", "eager", 0.003, "W4"),  # no ours: not covered
             row("RMSNormFwd", "broken", "vendor", "eager", None, "W1", status="wrong", reason="output 0: 3 NaN"),
             row("RMSNormFwd", "tilelang", "ours", "graph", 0.004),
             row("RMSNormFwd", "torch_compile", "torch_compile", "graph", 0.002),
             # by kernel time: 0.003 / 0.002 = 1.5 against 0.010 / 0.004 = 2.5 by device time
             row("LayerNormFwd", "tilelang", "ours", "eager", 0.004, kernel_ms=0.002),
             row("LayerNormFwd", "liger", "open-source", "eager", 0.010, kernel_ms=0.003),
             row("LayerNormFwd", "tilelang", "ours", "eager", None, "W2", status="failed", reason="compile timed out"),
             row("LayerNormFwd", "liger", "open-source", "eager", 0.010, "W2")]
    for wid in ("W1", "W2", "W3"):
        rows.append(row("MaxPool2dFwd", "tilelang", "ours", "eager", None, wid, "pool", status="skipped", reason=CUDA))
        rows.append(row("MaxPool2dFwd", "torch_eager", "torch_eager", "eager", 0.5, wid, "pool"))
    rows += [row("MaxPool2dFwd", impl, impl, "graph", None, "W1", "pool", status="skipped", reason=GRAPHS)
             for impl in ("torch_eager", "torch_compile")]
    with ResultsWriter(path) as w:
        w.append({"record": "env", "run_id": "r1", "device": {"device": "cuda", "model": "H200"}, "limits": LIMITS,
                  "versions": {"torch": "2.11"}, "git": "abc"})
        for r in rows:
            w.append(r)
    return path


def test_summary_counts_ratios_and_reasons(results_path):
    s = summarize_results(read_results(results_path))
    assert s.rows == 22 and s.statuses == {"ok": 15, "wrong": 1, "failed": 1, "skipped": 5}
    assert (s.covered, s.workloads) == (4, 9) and s.regimes == ["eager", "graph"]
    lines = {(line.family, line.op): line for line in s.lines}
    # a family where ours ran on nothing is one line: its ops' lines would say the same
    assert list(lines) == [("norm", None), ("norm", "LayerNormFwd"), ("norm", "RMSNormFwd"), ("pool", None)]
    rms = lines[("norm", "RMSNormFwd")]
    assert (rms.covered, rms.workloads, rms.wrong, rms.failed) == (3, 4, 1, 0)
    eager = rms.regimes["eager"]
    assert eager.compared == 3 and not eager.by_kernels
    assert eager.geomean == pytest.approx((4.0 * 0.5 * 1.0) ** (1 / 3))
    assert eager.leads == 2  # 4.0 and 1.0: a tie counts as ours leading
    assert eager.worst.workload == "W2" and eager.worst_ratio == pytest.approx(0.5)
    assert eager.sol_pct == pytest.approx((50.0 * 25.0 * 100.0) ** (1 / 3))  # 1 us at the limit over 2, 4, 1 us
    assert rms.regimes["graph"].geomean == pytest.approx(0.5)
    layer = lines[("norm", "LayerNormFwd")]
    assert (layer.covered, layer.workloads, layer.failed) == (1, 2, 1)
    assert layer.regimes["eager"].by_kernels and layer.regimes["eager"].geomean == pytest.approx(1.5)
    assert layer.regimes["eager"].leads == 1
    assert layer.regimes["graph"].geomean is None
    norm = lines[("norm", None)]
    assert (norm.covered, norm.workloads, norm.ops) == (4, 6, 2)
    # the family mixes a workload without kernel times: all by device time
    assert not norm.regimes["eager"].by_kernels
    assert norm.regimes["eager"].geomean == pytest.approx((4.0 * 0.5 * 1.0 * 2.5) ** (1 / 4))
    assert norm.regimes["eager"].worst.op == "RMSNormFwd"
    assert (norm.regimes["eager"].leads, norm.regimes["graph"].leads) == (3, 0)
    assert (lines[("pool", None)].covered, lines[("pool", None)].workloads) == (0, 3)
    assert s.skipped == [(CUDA, 3, ["tilelang (ours)"]), (GRAPHS, 2, ["torch_compile", "torch_eager"])]
    assert [(r["status"], r["op"], r["impl"]) for r in s.problems] == [
        ("failed", "LayerNormFwd", "tilelang"), ("wrong", "RMSNormFwd", "broken")]


def _terminal(path, width=120, detail=False):
    console = Console(file=io.StringIO(), width=width)
    render_terminal(read_results(path), console, detail=detail)
    return console.file.getvalue()


def test_terminal_first_screen(results_path):
    text = _terminal(results_path)
    lines = text.splitlines()
    assert len(lines) < 30 and max(map(len, lines)) <= 120
    assert "ours ran on 4 of 9 workloads (44%); 22 rows: 15 ok, 1 wrong, 1 failed, 5 skipped" in text
    rms = next(line for line in lines if line.strip().startswith("RMSNormFwd"))
    assert rms.split()[:5] == ["RMSNormFwd", "3/4", "1.26×", "0.50×", "W2"] and rms.rstrip().endswith("1/0")
    layer = next(line for line in lines if line.strip().startswith("LayerNormFwd"))
    assert "1.50×k" in layer  # by kernel time, and marked so
    assert "5 rows skipped, by reason:" in text
    assert f"  3  {CUDA} — tilelang (ours)" in text and f"  2  {GRAPHS} — torch_compile, torch_eager" in text
    assert "failed: norm · LayerNormFwd W2 bf16 · tilelang (ours) · eager: compile timed out" in text
    assert "wrong: norm · RMSNormFwd W1 bf16 · broken · eager: output 0: 3 NaN" in text
    assert "Alternatives" not in text and "MaxPool2dFwd" not in text  # no per-op tables without --detail


def test_detail_tables_put_reasons_in_notes(results_path):
    text = _terminal(results_path, detail=True)
    lines = text.splitlines()
    assert max(map(len, lines)) <= 120 and "Alternatives" in text
    (note,) = [line for line in lines if line.endswith(f"] {CUDA}")]  # "  [3] tilelang runs on ..."
    assert f"tilelang · ours: skipped {note.split()[0]}" in text
    assert text.count(CUDA) == 2  # once in the summary, once as the note; never in a cell
    assert "broken · vendor: wrong [" in text


def test_markdown_opens_with_the_summary(results_path):
    md = render_markdown(read_results(results_path))
    assert md.index("## At a glance") < md.index("## norm · RMSNormFwd · eager")
    assert "| RMSNormFwd | 3/4 | 1.26× | 0.50× W2 | 50% | 0.50× | 0.50× W1 | 25% | 1/0 |" in md
    assert "| **pool · 1 op** | 0/3 |" in md
    assert f"- 3  {CUDA} — tilelang (ours)" in md


def test_throughput_is_blank_without_limits_and_never_rounds_to_zero(tmp_path):
    path = tmp_path / "cpu.jsonl"
    with ResultsWriter(path) as w:
        w.append({"record": "env", "run_id": "r1", "device": {"device": "cpu"}, "limits": None})
        w.append(row("RMSNormFwd", "torch_eager", "torch_eager", "eager", 20.0))
    (entry,) = build_entries(read_results(path))
    assert throughput_text(entry) == "·"
    slow = tmp_path / "slow.jsonl"
    with ResultsWriter(slow) as w:
        w.append({"record": "env", "run_id": "r1", "device": {"device": "cuda"}, "limits": LIMITS})
        w.append(row("RMSNormFwd", "torch_eager", "torch_eager", "eager", 20.0))  # 4 MB in 20 ms: 0.2 GB/s
    (entry,) = build_entries(read_results(slow))
    assert throughput_text(entry) == "0.2 GB/s†"


def test_a_catalog_sized_cpu_run_fits_one_screen(tmp_path):
    """414 workloads of 45 ops, ours skipped on all of them and most alternatives too (a CPU run):
    the first screen stays well under 100 lines at 120 columns."""
    path = tmp_path / "big.jsonl"
    with ResultsWriter(path) as w:
        w.append({"record": "env", "run_id": "r1", "device": {"device": "cpu"}, "limits": None})
        for i in range(414):
            op, family = f"Op{i % 45}Fwd", ("norm", "conv", "pool", "topk")[i % 4]
            wid = f"W{i}"
            w.append(row(op, "tilelang", "ours", "eager", None, wid, family, status="skipped", reason=CUDA))
            w.append(row(op, "torch_eager", "torch_eager", "eager", 1.0, wid, family))
            for impl in ("torch_eager", "torch_compile"):
                w.append(row(op, impl, impl, "graph", None, wid, family, status="skipped", reason=GRAPHS))
    lines = _terminal(path).splitlines()
    assert len(lines) < 40 and max(map(len, lines)) <= 120
    assert "1242 rows skipped, by reason:" in lines


def test_quick_cpu_run_then_report_fit_one_screen(capsys, monkeypatch, tmp_path):
    """`npuops run --quick` ends with the summary, and `npuops report` prints it alone: under 100
    lines at 120 columns, blank throughput and SOL on an uncalibrated CPU. (Two ops keep it short.)"""
    monkeypatch.setenv("COLUMNS", "120")
    out = tmp_path / "q.jsonl"
    code = main(["run", "--quick", "--device", "cpu", "--op", "MaxPool1dFwd,AvgPool1dFwd", "--out", str(out),
                 "--no-progress", "--budget", "0.05"])
    run_text = capsys.readouterr().out
    assert code == 0 and "ours ran on 0 of 2 workloads" in run_text and "rows skipped, by reason:" in run_text
    assert len(run_text.splitlines()) < 100
    assert main(["report", str(out)]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert len(lines) < 100 and max(map(len, lines)) <= 120
    assert "rows skipped, by reason:" in text and "tilelang (ours)" in text
    assert "Alternatives" not in text and "GB/s" not in text
    assert main(["report", str(out), "--detail"]) == 0
    detail = capsys.readouterr().out
    assert "Alternatives" in detail and "0 GB/s" not in detail and max(map(len, detail.splitlines())) <= 120
    records = json.loads(main(["report", str(out), "--format", "json"]) == 0 and capsys.readouterr().out)
    assert len(records) == len(read_results(out).rows)
