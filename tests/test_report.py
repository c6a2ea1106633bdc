"""Reports: the ratio, SOL and bound arithmetic, and every format."""

from __future__ import annotations

import csv
import io
import json

import pytest

from npuops.cli import main
from npuops.results import ResultsWriter

LIMITS = {"copy_bandwidth": 4e12, "flops": {"bf16": 800e12, "f32": 50e12}, "source": "test"}


def row(impl, tier, regime, median_ms, status="ok", workload="W1", **extra):
    r = {"record": "row", "run_id": "r1", "family": "norm", "op": "RMSNormFwd", "workload": workload,
         "label": "decode", "dtype": "bf16", "fingerprint": "f", "source": "catalog", "impl": impl, "tier": tier,
         "plugin": "p", "regime": regime, "device": "cuda", "bytes": 4_000_000, "flops": 1_000_000,
         "compute_dtype": "bf16", "status": status, **extra}
    if status == "ok":
        r["timing"] = {"median_ms": median_ms, "min_ms": median_ms * 0.9, "q1_ms": median_ms, "q3_ms": median_ms,
                       "n": 50, "stable": True, "hold_us": 50.0, "clock_mhz": 1980.0}
        r["check"] = {"max_error": 0.1, "max_abs_error": 0.01}
    return r


@pytest.fixture
def results_file(tmp_path):
    path = tmp_path / "r.jsonl"
    with ResultsWriter(path) as w:
        w.append({"record": "env", "run_id": "r1", "device": {"device": "cuda", "model": "H200"}, "limits": LIMITS,
                  "versions": {"torch": "2.11"}, "git": "abc"})
        for r in [row("ours_kernel", "ours", "eager", 0.002), row("torch_eager", "torch_eager", "eager", 0.004),
                  row("torch_compile", "torch_compile", "eager", 0.003),
                  row("broken", "vendor", "eager", None, status="wrong", reason="output 0: 3 NaN"),
                  row("ours_kernel", "ours", "graph", 0.004), row("torch_eager", "torch_eager", "graph", 0.002),
                  row("torch_eager", "torch_eager", "eager", 0.010, workload="W2")]:
            w.append(r)
    return path


def report(capsys, path, fmt):
    assert main(["report", str(path), "--format", fmt]) == 0
    return capsys.readouterr().out


def test_json_contract_and_arithmetic(capsys, results_file):
    records = json.loads(report(capsys, results_file, "json"))
    keys = {"family", "op", "workload", "impl", "tier", "regime", "status", "median_ms", "ratio", "sol_pct", "bound"}
    assert all(keys <= set(r) for r in records) and len(records) == 7
    by = {(r["workload"], r["impl"], r["regime"]): r for r in records}
    ours = by[("W1", "ours_kernel", "eager")]
    assert ours["ratio"] == pytest.approx(0.003 / 0.002)  # the fastest alternative over ours
    # 4 MB at 4 TB/s = 1 us; 1 MFLOP at 800 TFLOP/s is far less: memory bound, 1 us / 2 us = 50%.
    assert ours["sol_pct"] == pytest.approx(50.0) and ours["bound"] == "memory"
    assert by[("W1", "ours_kernel", "graph")]["ratio"] == pytest.approx(0.5)
    assert by[("W1", "torch_eager", "eager")]["ratio"] is None
    assert by[("W1", "broken", "eager")]["status"] == "wrong" and by[("W1", "broken", "eager")]["median_ms"] is None
    assert by[("W2", "torch_eager", "eager")]["sol_pct"] == pytest.approx(10.0)


def two_runs(path, envs, rows):
    with ResultsWriter(path) as w:
        for run, extra in envs.items():
            w.append({"record": "env", "run_id": run, "device": {"model": "H200"}, "limits": LIMITS, "versions": {},
                      "git": "abc", **extra})
        for r in rows:
            w.append(r)
    return path


RATIO_ROWS = [
    {**row("ours_kernel", "ours", "eager", 0.002), "run_id": "r2"},
    {**row("torch_eager", "torch_eager", "eager", 0.001), "run_id": "r1"},  # faster, the other run
    {**row("torch_compile", "torch_compile", "eager", 0.004), "run_id": "r2"},
]


@pytest.mark.parametrize("other", [{"git": None}, {"git": "def"}, {"limits": {**LIMITS, "copy_bandwidth": 1e12}},
                                   {"device": {"model": "H100"}}, {"versions": {"torch": "2.12"}}],
                         ids=["unknown revision", "revision", "calibration", "device model", "software"])
def test_ratio_never_mixes_measurements(capsys, tmp_path, other):
    path = two_runs(tmp_path / "two-runs.jsonl", {"r1": other, "r2": {}}, RATIO_ROWS)
    by = {r["impl"]: r for r in json.loads(report(capsys, path, "json"))}
    assert by["ours_kernel"]["ratio"] == pytest.approx(2.0)


def test_ratio_spans_the_runs_of_one_measurement(capsys, tmp_path):
    """Shards of one sweep, or a run resumed after a kill: one revision, calibration, device model and
    software stack; ours compares with the fastest alternative whichever run timed it."""
    path = two_runs(tmp_path / "shards.jsonl", {"r1": {}, "r2": {}}, RATIO_ROWS)
    by = {r["impl"]: r for r in json.loads(report(capsys, path, "json"))}
    assert by["ours_kernel"]["ratio"] == pytest.approx(0.5)


def test_html_marks_faster_and_slower(capsys, results_file):
    page = report(capsys, results_file, "html")
    assert page.startswith("<!doctype html>") and "<script" not in page and "http" not in page
    assert "class='num faster'>1.50×" in page and "class='num slower'>0.50×" in page
    assert "wrong: output 0: 3 NaN" in page


def test_markdown_csv_and_terminal(capsys, results_file):
    md = report(capsys, results_file, "markdown")
    assert "## norm · RMSNormFwd · eager" in md and "| W1 decode bf16 | 1.50× | 0.0020 |" in md
    assert "† no implementation of ours yet" in md  # W2 has baselines only
    assert "kernels" not in md and "call" not in md  # no row has kernel or call times
    rows = list(csv.DictReader(io.StringIO(report(capsys, results_file, "csv"))))
    assert len(rows) == 7 and rows[0]["op"] == "RMSNormFwd"
    term = report(capsys, results_file, "terminal")
    assert "RMSNormFwd" in term and "1.50×" in term


def test_compressed_results_report_the_same(capsys, results_file, tmp_path):
    """Committed results are kept gzip-compressed; the report reads them as they are."""
    import gzip

    compressed = tmp_path / "r.jsonl.gz"
    compressed.write_bytes(gzip.compress(results_file.read_bytes()))
    assert report(capsys, compressed, "json") == report(capsys, results_file, "json")


def test_report_to_file(capsys, results_file, tmp_path):
    out = tmp_path / "r.html"
    assert main(["report", str(results_file), "--format", "html", "-o", str(out)]) == 0
    assert out.read_text().endswith("</html>")


def test_summary_per_op_and_regime(tmp_path):
    """Geomean over the workloads where ours ran against an alternative, the slowest one, and how
    many ours is behind on."""
    from npuops.report import build_entries, render_markdown, summarize
    from npuops.results import read_results

    path = tmp_path / "s.jsonl"
    with ResultsWriter(path) as w:
        w.append({"record": "env", "run_id": "r1", "device": {"device": "cuda"}, "limits": LIMITS, "git": "abc"})
        for wid, ours_ms, alt_ms in (("W1", 0.002, 0.008), ("W2", 0.004, 0.002), ("W3", 0.001, 0.001)):
            w.append(row("ours_kernel", "ours", "eager", ours_ms, workload=wid))
            w.append(row("torch_compile", "torch_compile", "eager", alt_ms, workload=wid))
        w.append(row("torch_eager", "torch_eager", "eager", 0.001, workload="W4"))  # no ours: not counted
    results = read_results(path)
    (summary,) = summarize(build_entries(results))
    assert summary.workloads == 3 and summary.behind == 1
    assert summary.geomean_ratio == pytest.approx((4.0 * 0.5 * 1.0) ** (1 / 3))
    assert summary.slowest.workload == "W2"
    text = render_markdown(results)
    assert "## Summary" in text and "W2 decode bf16 (0.50×)" in text


def test_kernel_times_shown_beside_device_times_where_recorded(capsys, tmp_path):
    """Rows measured with ``npuops run --kernel-time`` show the profiler's span beside the event
    time, and its SOL beside the event time's; the JSON records carry both; rows without it read
    as before."""
    path = tmp_path / "k.jsonl"
    kernels = {"median_ms": 0.0018, "min_ms": 0.0017, "activities": 1, "n": 20}
    with ResultsWriter(path) as w:
        w.append({"record": "env", "run_id": "r1", "device": {"device": "cuda"}, "limits": LIMITS})
        w.append(row("ours_kernel", "ours", "eager", 0.0043, kernel_time=kernels))
        w.append(row("liger", "open-source", "eager", 0.0045, kernel_time={**kernels, "median_ms": 0.0021}))
        w.append(row("torch_eager", "torch_eager", "eager", 0.02))
    md = report(capsys, path, "markdown")
    assert "| 0.0043 (kernels 0.0018) |" in md and "liger · open-source: 0.0045 (kernels 0.0021)" in md
    assert "torch_eager: 0.0200<br>" in md or "torch_eager: 0.0200 |" in md
    assert "npuops run --kernel-time" in md
    by = {r["impl"]: r for r in json.loads(report(capsys, path, "json"))}
    assert by["ours_kernel"]["kernel_ms"] == 0.0018 and by["torch_eager"]["kernel_ms"] is None
    # 4 MB at 4 TB/s = 1 us: 1 / 4.3 of the event time, 1 / 1.8 of the kernel time
    assert "| 23.3% (kernels 55.6%) |" in md
    assert by["ours_kernel"]["sol_pct"] == pytest.approx(100 / 4.3)
    assert by["ours_kernel"]["kernel_sol_pct"] == pytest.approx(100 / 1.8) and by["torch_eager"]["kernel_sol_pct"] is None


def test_ratios_by_kernel_time_only_where_ours_and_every_alternative_have_one(capsys, tmp_path):
    """A workload whose alternatives all have kernel times gets the kernel-time ratio beside the
    event-time one, and an op whose workloads all do gets its geomean and rows behind by kernel time
    too; an alternative without one (its profiler saw nothing) leaves the workload without it."""
    path = tmp_path / "k.jsonl"

    def kernels(us):
        return {"median_ms": us / 1e3, "min_ms": us / 1e3, "activities": 1, "n": 20}

    with ResultsWriter(path) as w:
        w.append({"record": "env", "run_id": "r1", "device": {"device": "cuda"}, "limits": LIMITS})
        w.append(row("ours_kernel", "ours", "eager", 0.0043, kernel_time=kernels(1.8)))
        w.append(row("liger", "open-source", "eager", 0.0045, kernel_time=kernels(2.1)))
        w.append(row("torch_eager", "torch_eager", "eager", 0.02))  # no kernel time
        w.append(row("ours_kernel", "ours", "graph", 0.0040, kernel_time=kernels(2.0)))
        w.append(row("liger", "open-source", "graph", 0.0038, kernel_time=kernels(2.5)))
    md = report(capsys, path, "markdown")
    # graph: behind by event time (3.8 against 4.0), ahead by kernel time (2.5 against 2.0)
    assert "| 0.95× (kernels 1.25×) |" in md and "| 1 (kernels 0) |" in md
    assert "| 1.05× |" in md  # eager: torch_eager has no kernel time
    by = {(r["impl"], r["regime"]): r for r in json.loads(report(capsys, path, "json"))}
    assert by[("ours_kernel", "graph")]["kernel_ratio"] == pytest.approx(1.25)
    assert by[("ours_kernel", "eager")]["kernel_ratio"] is None and by[("liger", "graph")]["kernel_ratio"] is None


def test_call_times_shown_beside_device_times_where_recorded(capsys, tmp_path):
    """Eager rows measured since call times were recorded show them beside the device time (after
    the kernel time, where that is recorded too) in every format; graph rows and rows from older
    files have none and read as before."""
    path = tmp_path / "c.jsonl"

    def calls(ms):
        return {"median_ms": ms, "min_ms": ms * 0.95, "calls": 256, "n": 5}

    kernels = {"median_ms": 0.0018, "min_ms": 0.0017, "activities": 1, "n": 20}
    with ResultsWriter(path) as w:
        w.append({"record": "env", "run_id": "r1", "device": {"device": "cuda"}, "limits": LIMITS})
        w.append(row("ours_kernel", "ours", "eager", 0.0043, call_time=calls(0.021)))
        w.append(row("torch_eager", "torch_eager", "eager", 0.0045, call_time=calls(0.011), kernel_time=kernels))
        w.append(row("torch_compile", "torch_compile", "eager", 0.005))  # an older file's row
        w.append(row("ours_kernel", "ours", "graph", 0.004))
    md = report(capsys, path, "markdown")
    assert "| 0.0043 (call 0.0210) |" in md and "torch_eager: 0.0045 (kernels 0.0018, call 0.0110)" in md
    assert "torch_compile: 0.0050<br>" in md or "torch_compile: 0.0050 |" in md
    assert "| 0.0040 |" in md  # graph
    assert "(call t): wall time per call" in md
    page = report(capsys, path, "html")
    assert "<td class='num'>0.0043 (call 0.0210)</td>" in page and "(call t)" in page
    from rich.console import Console

    from npuops.report import render_terminal
    from npuops.results import read_results

    console = Console(file=io.StringIO(), width=400)  # wide enough that no cell folds
    render_terminal(read_results(path), console)
    assert any(line.startswith("W1 decode bf16") and "  0.0043 (call 0.0210)  " in line
               for line in console.file.getvalue().splitlines())
    by = {(r["impl"], r["regime"]): r for r in json.loads(report(capsys, path, "json"))}
    assert by[("ours_kernel", "eager")]["call_ms"] == 0.021 and by[("torch_eager", "eager")]["call_ms"] == 0.011
    assert by[("torch_compile", "eager")]["call_ms"] is None and by[("ours_kernel", "graph")]["call_ms"] is None
    csv_rows = {(r["impl"], r["regime"]): r for r in csv.DictReader(io.StringIO(report(capsys, path, "csv")))}
    assert csv_rows[("ours_kernel", "eager")]["call_ms"] == "0.021" and csv_rows[("ours_kernel", "graph")]["call_ms"] == ""


@pytest.mark.filterwarnings("ignore:npuops. results file")
def test_extreme_and_crafted_timings_never_crash_a_report(capsys, tmp_path):
    """Times of 0, below 0, NaN or text are malformed rows, skipped on reading (tests/test_results.py);
    valid but extreme ones (a denormal time, FLOPs near the float limit, a bandwidth of 1e-300)
    render, with the figures that overflow or underflow left out."""
    def timed(impl, tier, median_ms, **extra):
        r = row(impl, tier, "eager", 1.0, **extra)
        r["timing"].update(median_ms=median_ms, min_ms=median_ms)
        return r

    path = tmp_path / "x.jsonl"
    with ResultsWriter(path) as w:
        w.append({"record": "env", "run_id": "r1", "device": {}, "limits": {**LIMITS, "copy_bandwidth": 1e-300}})
        w.append(timed("ours_kernel", "ours", 5e-324, flops=1e308, kernel_time={"median_ms": 5e-324}))
        w.append(timed("torch_eager", "torch_eager", 1e308, call_time={"median_ms": 1e308}))
        for median in (0, -1.0, "fast", float("nan"), float("inf")):
            w.append(timed("bad", "vendor", median))
        w.append({**row("nan", "vendor", "eager", 0.1), "flops": float("nan")})
    for fmt in ("csv", "markdown", "html", "terminal"):
        assert "RMSNormFwd" in report(capsys, path, fmt)
    records = json.loads(report(capsys, path, "json"))
    assert {r["impl"] for r in records} == {"ours_kernel", "torch_eager"}
    ours = next(r for r in records if r["impl"] == "ours_kernel")
    assert ours["ratio"] is None and ours["sol_pct"] is None and ours["kernel_sol_pct"] is None


HOSTILE = "\x1b[31mred\x1b]0;title\x07 [bold]b[/bold] <script>x</script> | `c` \u202egnp.exe"


def test_text_from_the_file_is_shown_never_obeyed(capsys, tmp_path):
    """A label, a name or a reason with an escape sequence, rich markup, HTML or markdown syntax is
    shown as the text it is, in every format."""
    path = tmp_path / "h.jsonl"
    with ResultsWriter(path) as w:
        w.append({"record": "env", "run_id": "r1", "device": {"model": HOSTILE}, "limits": LIMITS})
        w.append(row("ours_kernel", "ours", "eager", 0.002, label=HOSTILE))
        w.append(row("[red]alt[/red]", "torch_eager", "eager", 0.003, op="Op" + HOSTILE))
        w.append(row("broken", "vendor", "eager", None, status="failed", reason=HOSTILE))
    shown = "\\x1b[31mred\\x1b]0;title\\x07"
    for fmt in ("markdown", "html", "csv"):
        text = report(capsys, path, fmt)
        assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text and "x1b" in text and "u202e" in text
    md = report(capsys, path, "markdown")
    assert "<script>" not in md and "\\<script\\>x\\</script\\>" in md and "\\| \\`c\\`" in md
    assert "\\x1b\\[31mred" in md  # shown as \x1b[31mred
    assert all(line.count(" | ") == 6 for line in md.splitlines() if line.startswith("| W1"))
    page = report(capsys, path, "html")
    assert "<script>" not in page and "&lt;script&gt;x&lt;/script&gt;" in page and "[bold]b[/bold]" in page
    assert shown in page
    from rich.console import Console

    from npuops.report import render_terminal
    from npuops.results import read_results

    console = Console(file=io.StringIO(), width=1000)  # no terminal: any escape in the output came from the file
    render_terminal(read_results(path), console)
    term = console.file.getvalue()
    assert "\x1b" not in term and "\u202e" not in term and shown in term
    assert "[bold]b[/bold]" in term and "[red]alt[/red]" in term  # markup shown, not applied


def test_a_csv_cell_is_never_a_formula(capsys, tmp_path):
    path = tmp_path / "f.jsonl"
    with ResultsWriter(path) as w:
        w.append({"record": "env", "run_id": "r1", "device": {"model": "x"}, "limits": LIMITS})
        w.append(row("ours_kernel", "ours", "eager", 0.002, label='=HYPERLINK("http://x","y")'))
        w.append(row("@SUM(A1)", "torch_eager", "eager", 0.003))
    text = report(capsys, path, "csv")
    assert "'=HYPERLINK" in text and "'@SUM(A1)" in text and ",=HYPERLINK" not in text and ",@SUM" not in text


def test_the_layout_ours_took_is_shown_beside_its_time(capsys, tmp_path):
    path = tmp_path / "r.jsonl"
    with ResultsWriter(path) as w:
        w.append({"record": "env", "run_id": "r1", "device": {"device": "cuda", "model": "H200"}, "limits": LIMITS,
                  "versions": {"torch": "2.11"}, "git": "abc"})
        w.append(row("tilelang", "ours", "eager", 0.002, config={"kernel": "gemm", "layout": "channels-last"}))
        w.append(row("torch_eager", "torch_eager", "eager", 0.004))
    assert "0.0020 [channels-last]" in report(capsys, path, "markdown")
