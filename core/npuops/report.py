"""Reports from a results file: the seed's table per op, in five formats.

Terminal, markdown and HTML reports open with the first screen of :mod:`npuops.summary` (per family
and op: ours' coverage, geomean and worst ratio per regime, SOL, skipped rows by reason, wrong and
failed rows named); the terminal shows the per-op tables only when asked (``render_terminal``'s
``detail``: ``npuops report --detail``, ``--op``, ``--family``). Markdown and HTML then give the
summary per op and regime (the geometric mean of the ratio, the slowest workload, how many
workloads ours is behind on, and the geometric mean SOL) and every table.

Per op and regime, one line per workload: Ratio (fastest alternative / ours, same regime, same
run), ours' device time, every alternative with its time (each with its kernel and call time where
recorded), throughput, % of the device limit (SOL) and what bounds it. Until an op has an
implementation of ours, throughput and SOL are those of the fastest alternative (marked †).
"""

from __future__ import annotations

import csv
import html
import io
import json
import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .results import Results

FORMATS = ("terminal", "markdown", "csv", "json", "html")
LEVEL = 0.02  # ratios within 2% of 1.0 are "level", neither green nor red


@dataclass
class Entry:
    """One workload of one op in one regime."""

    family: str
    op: str
    workload: str
    label: str
    dtype: str
    regime: str
    rows: list[dict[str, Any]]
    limits: dict[str, Any] | None
    ours: dict[str, Any] | None = None
    best_alt: dict[str, Any] | None = None
    ratio: float | None = None
    kernel_ratio: float | None = None  # the same comparison by kernel time, where every row has one
    subject: dict[str, Any] | None = None  # the row whose throughput/SOL is shown
    metrics: dict[str, Any] = field(default_factory=dict)


def _ok(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["status"] == "ok"]


def _median(row: dict[str, Any]) -> float:
    return row["timing"]["median_ms"]


def kernel_ms(row: dict[str, Any]) -> float | None:
    """The row's median kernel time (``npuops run --kernel-time``), if it has one."""
    return (row.get("kernel_time") or {}).get("median_ms")


def call_ms(row: dict[str, Any]) -> float | None:
    """The row's median wall time per back-to-back call (eager rows since ``call_time`` was recorded)."""
    return (row.get("call_time") or {}).get("median_ms")


def _quotient(a: float, b: float) -> float | None:
    """a / b (b > 0) where that is a finite number above 0, else None: the rows are checked on
    reading (times finite and positive), but extreme values still overflow to inf or underflow to 0,
    and such a figure is left out rather than shown or fed to a logarithm."""
    q = a / b
    return q if 0 < q < math.inf else None


def row_metrics(row: dict[str, Any], limits: dict[str, Any] | None) -> dict[str, Any]:
    """Throughput, SOL (% of the time no kernel can beat) and the bounding resource; where the row
    has a kernel time, its SOL too (``kernel_sol_pct``): the event time carries the launch and the
    events' own cost (2.4 µs eager, 2.6 replayed on an H200), which no kernel sheds."""
    ms = _median(row)  # every division is by a time as read, never by one derived (which could underflow to 0)
    out: dict[str, Any] = {"gbps": _quotient(row["bytes"] / 1e6, ms), "tflops": _quotient(row["flops"] / 1e9, ms),
                           "sol_pct": None, "kernel_sol_pct": None, "bound": None}
    if not limits:
        return out
    memory_s = row["bytes"] / limits["copy_bandwidth"]
    peak = limits["flops"].get(row["compute_dtype"]) or limits["flops"].get("f32")
    compute_s = row["flops"] / peak if peak and row["flops"] else 0.0
    out["bound"] = "memory" if memory_s >= compute_s else "compute"
    out["sol_pct"] = _quotient(1e5 * max(memory_s, compute_s), ms)  # 100% × seconds / (ms / 1e3)
    kernels = kernel_ms(row)
    if kernels:
        out["kernel_sol_pct"] = _quotient(1e5 * max(memory_s, compute_s), kernels)
    return out


def measurements(results: Results) -> dict[str, Any]:
    """Each run's measurement: the runs whose rows one ratio may compare. Runs of one revision, one
    calibration, one device model and one software stack measure alike (the shards of a sweep, or a
    run resumed after a kill, as ``npuops merge`` requires them to be); a run of an unknown revision
    is a measurement of its own."""
    def key(run_id: str, env: dict[str, Any]) -> Any:
        if not env.get("git"):
            return run_id
        device = env.get("device") or {}
        return json.dumps([env["git"], env.get("limits"), device.get("model", device.get("name")),
                           env.get("versions")], sort_keys=True)

    return {run_id: key(run_id, env) for run_id, env in results.env.items()}


def _alternatives(rows: list[dict[str, Any]], ours: dict[str, Any] | None,
                  measured: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The non-ours rows that ran; when comparing with ``ours``, only those of ours' measurement
    (``measured``, see :func:`measurements`; without it, ours' run): a ratio never mixes revisions,
    calibrations or devices."""
    def measurement(row: dict[str, Any]) -> Any:
        run_id = row.get("run_id")
        return measured.get(run_id, run_id) if measured else run_id

    return [r for r in _ok(rows) if r["tier"] != "ours" and (ours is None or measurement(r) == measurement(ours))]


def fastest_alternative(rows: list[dict[str, Any]], ours: dict[str, Any] | None,
                        measured: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The fastest of :func:`_alternatives`."""
    alts = _alternatives(rows, ours, measured)
    return min(alts, key=_median) if alts else None


def kernel_ratio(rows: list[dict[str, Any]], ours: dict[str, Any], measured: dict[str, Any] | None = None) -> float | None:
    """The fastest alternative's kernel time over ours' (:func:`_alternatives`), where ours and
    every alternative have one: a ratio that skipped an alternative would flatter ours."""
    alts = _alternatives(rows, ours, measured)
    times = [kernel_ms(r) for r in alts]
    if not alts or kernel_ms(ours) is None or None in times:
        return None
    return _quotient(min(times), kernel_ms(ours))


def build_entries(results: Results) -> list[Entry]:
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    measured = measurements(results)
    for row in results.rows:
        groups[(row["family"], row["op"], row["device"], row["regime"], row["workload"])].append(row)
    entries = []
    for (family, op, device, regime, workload), rows in groups.items():
        first = rows[0]
        env = results.env.get(first.get("run_id", ""), {})
        entry = Entry(family, op, workload, first["label"], first["dtype"], regime,
                      sorted(rows, key=lambda r: (r["tier"] != "ours", r["impl"])), env.get("limits"))
        ours = [r for r in _ok(rows) if r["tier"] == "ours"]
        entry.ours = min(ours, key=_median) if ours else None
        entry.best_alt = fastest_alternative(rows, entry.ours, measured)
        if entry.ours and entry.best_alt:
            entry.ratio = _quotient(_median(entry.best_alt), _median(entry.ours))
            entry.kernel_ratio = kernel_ratio(rows, entry.ours, measured)
        entry.subject = entry.ours or entry.best_alt
        if entry.subject:
            entry.metrics = row_metrics(entry.subject, entry.limits)
        entries.append(entry)
    return sorted(entries, key=lambda e: (e.family, e.op, e.regime, _workload_order(e.workload)))


@dataclass
class OpSummary:
    """How ours fared on one op in one regime, over the workloads where both ours and an
    alternative ran."""

    family: str
    op: str
    regime: str
    workloads: int
    geomean_ratio: float
    slowest: Entry  # the workload with the lowest ratio
    behind: int  # workloads where ours is slower than the fastest alternative
    geomean_sol_pct: float | None
    # by kernel time, where every workload has a kernel ratio
    kernel_geomean_ratio: float | None = None
    kernel_behind: int | None = None


def _geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def summarize(entries: list[Entry]) -> list[OpSummary]:
    groups: dict[tuple[str, str, str], list[Entry]] = defaultdict(list)
    for e in entries:
        if e.ratio is not None:
            groups[(e.family, e.op, e.regime)].append(e)
    summaries = []
    for (family, op, regime), group in groups.items():
        sols = [e.metrics["sol_pct"] for e in group if e.metrics.get("sol_pct")]
        kernel_ratios = [e.kernel_ratio for e in group]
        by_kernels = None not in kernel_ratios
        summaries.append(OpSummary(family, op, regime, len(group), _geomean([e.ratio for e in group]),
                                   min(group, key=lambda e: e.ratio), sum(e.ratio < 1 for e in group),
                                   _geomean(sols) if sols else None,
                                   _geomean(kernel_ratios) if by_kernels else None,
                                   sum(r < 1 for r in kernel_ratios) if by_kernels else None))
    return summaries


SUMMARY_HEADERS = ("Op", "Regime", "Workloads", "Geomean ratio", "Slowest (ratio)", "Behind", "Geomean SOL")


def summary_cells(s: OpSummary) -> list[str]:
    slowest = f"{s.slowest.workload} {s.slowest.label} {s.slowest.dtype} ({fmt_ratio(s.slowest.ratio)})"
    sol = "·" if s.geomean_sol_pct is None else f"{s.geomean_sol_pct:.1f}%"
    ratio = fmt_ratio(s.geomean_ratio) + _kernels_suffix(s.kernel_geomean_ratio, fmt_ratio)
    behind = str(s.behind) + _kernels_suffix(s.kernel_behind, str)
    return [f"{s.family} · {s.op}", s.regime, str(s.workloads), ratio, slowest, behind, sol]


def _kernels_suffix(value: Any, fmt: Callable[[Any], str]) -> str:
    """`` (kernels fmt(value))`` beside an event-time figure, where its kernel-time ``value`` is known."""
    return "" if value is None else f" (kernels {fmt(value)})"


def ratio_text(e: Entry) -> str:
    """Ours against the fastest alternative, and by kernel time where every row has one."""
    return fmt_ratio(e.ratio) + _kernels_suffix(e.kernel_ratio, fmt_ratio)


def _workload_order(wid: str) -> tuple:
    digits = "".join(ch for ch in wid if ch.isdigit())
    return (float(digits) if digits else math.inf, wid)  # float: an id of 5,000 digits is no int() can take


def json_records(results: Results) -> list[dict[str, Any]]:
    """The machine-readable contract: one record per (workload, implementation, regime)."""
    records, measured = [], measurements(results)
    for e in build_entries(results):
        for row in e.rows:
            ok = row["status"] == "ok"
            metrics = row_metrics(row, e.limits) if ok else {}
            ratio = by_kernels = None
            if ok and row["tier"] == "ours":
                best = fastest_alternative(e.rows, row, measured)
                ratio = _quotient(_median(best), _median(row)) if best else None
                by_kernels = kernel_ratio(e.rows, row, measured)
            records.append({
                "family": e.family, "op": e.op, "workload": e.workload, "impl": row["impl"],
                "tier": row["tier"], "regime": e.regime, "status": row["status"],
                "median_ms": _median(row) if ok else None, "kernel_ms": kernel_ms(row) if ok else None,
                "call_ms": call_ms(row) if ok else None,
                "ratio": ratio, "kernel_ratio": by_kernels,
                "sol_pct": metrics.get("sol_pct"), "kernel_sol_pct": metrics.get("kernel_sol_pct"),
                "bound": metrics.get("bound"),
                "label": e.label, "dtype": e.dtype, "device": row["device"],
                "min_ms": row["timing"]["min_ms"] if ok else None, "n": row["timing"]["n"] if ok else None,
                "reason": row.get("reason"), "config": row.get("config"), "tuning": row.get("tuning"),
            })
    return records


# -- shared cell text ------------------------------------------------------------------------------

# Every text from a results file (names, labels, reasons, the env) is shown as text, never obeyed:
# control characters (escape sequences that drive a terminal, bidi overrides that reorder what is
# seen) and lone surrogates (no encoder takes them) are shown as Python escapes, in every format;
# then each renderer escapes its own syntax in every cell, heading and line it builds from them.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def plain(text: str) -> str:
    """``text`` with control characters shown as escapes (``\\x1b``)."""
    return _UNSAFE.sub(lambda m: m.group().encode("unicode_escape").decode(), text)


def markdown_text(text: str) -> str:
    """``text`` as markdown shows it: no HTML, no cell cut by a '|', no code span, link or emphasis."""
    return re.sub(r"([\\`*\[\]<>|&])", r"\\\1", plain(text))


def html_text(text: str) -> str:
    return html.escape(plain(text))


def fmt_ms(ms: float | None) -> str:
    if ms is None:
        return "·"
    return f"{ms:.4f}" if ms < 1 else f"{ms:.3f}" if ms < 100 else f"{ms:.1f}"


def fmt_ratio(ratio: float | None) -> str:
    return "—" if ratio is None else f"{ratio:.2f}×"


def ratio_class(ratio: float | None) -> str:
    if ratio is None:
        return "none"
    return "faster" if ratio > 1 + LEVEL else "slower" if ratio < 1 - LEVEL else "level"


def time_text(row: dict[str, Any]) -> str:
    """The row's median device time, then its kernel time and its call time where it has them:
    "0.0043 (kernels 0.0018, call 0.0110)"."""
    beside = [f"{name} {fmt_ms(ms)}" for name, ms in (("kernels", kernel_ms(row)), ("call", call_ms(row))) if ms is not None]
    return fmt_ms(_median(row)) + (f" ({', '.join(beside)})" if beside else "")


def alternative_cells(e: Entry) -> list[tuple[str, str]]:
    """(``name · tier``, time or "status: reason") for every implementation except the ours shown."""
    return [(name, text if reason is None else f"{text}: {reason}") for name, text, reason in _alternative_notes(e)]


def _figure(value: float) -> str:
    """Three significant digits at most, never rounded to 0: 1234, 12.3, 0.123, 0.00123."""
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def throughput_text(e: Entry) -> str:
    """The subject row's bytes or FLOPs per second, by what bounds it; "·" where nothing was timed,
    and where the run knew no device limits (a CPU run not calibrated): without them the bound, and
    so the figure that matters, is unknown."""
    m = e.metrics
    if not m or not e.limits:
        return "·"
    mark = "" if e.ours else "†"
    if m.get("bound") == "compute" and m.get("tflops"):
        return f"{_figure(m['tflops'])} TFLOP/s{mark}"
    return f"{_figure(m['gbps'])} GB/s{mark}" if m.get("gbps") else "·"


def sol_text(e: Entry) -> str:
    sol = e.metrics.get("sol_pct") if e.metrics else None
    if sol is None:
        return "·"
    kernel_sol = e.metrics.get("kernel_sol_pct")
    return f"{sol:.1f}%{'' if e.ours else '†'}" + _kernels_suffix(kernel_sol, "{:.1f}%".format)


def ours_text(e: Entry) -> str:
    """Ours' time, and the memory layout its kernel took where it declares one (an implementation
    whose inputs are converted outside the timed calls, as a model in that layout has them)."""
    if not e.ours:
        return "·"
    layout = (e.ours.get("config") or {}).get("layout")
    return time_text(e.ours) + (f" [{layout}]" if layout else "")


def _grouped(entries: list[Entry]) -> dict[tuple[str, str, str], list[Entry]]:
    tables: dict[tuple[str, str, str], list[Entry]] = defaultdict(list)
    for e in entries:
        tables[(e.family, e.op, e.regime)].append(e)
    return tables


def _env_lines(results: Results) -> list[str]:
    lines = []
    for env in results.env.values():
        d, v = env.get("device", {}), env.get("versions", {})
        lim = env.get("limits")
        limit_text = (f"limits: {lim['copy_bandwidth'] / 1e12:.2f} TB/s copy, "
                      f"{lim['flops'].get('bf16', 0) / 1e12:.0f} TFLOP/s bf16 ({lim['source']})") if lim else "limits: unknown (no SOL)"
        lines.append(f"run {env['run_id']} {env.get('started', '')}: {d.get('model', d.get('device'))} · torch {v.get('torch')} · "
                     f"tilelang {v.get('tilelang')} · npuops {v.get('npuops')} · git {env.get('git')} · {limit_text}")
    return lines


FOOTNOTE = "† no implementation of ours yet: throughput and SOL of the fastest alternative."
KERNELS_NOTE = ("(kernels t): the call's device activity alone, as the profiler reports it (npuops run --kernel-time); "
                "SOL (kernels p%): the same limit against that time; ratios and the summary (kernels ...): the same "
                "comparison by kernel time, where ours and every alternative have one.")
CALL_NOTE = ("(call t): wall time per call of eager calls made back to back, neither flushed nor held: what a model "
             "running eagerly pays per call, never less than the call's host cost (docs/timing.md).")


def footnote(entries: list[Entry]) -> str:
    ok = [row for e in entries for row in e.rows if row["status"] == "ok"]
    notes = [(KERNELS_NOTE, kernel_ms), (CALL_NOTE, call_ms)]
    return " ".join([FOOTNOTE] + [note for note, figure in notes if any(figure(row) is not None for row in ok)])


HEADERS = ("Workload", "Ratio alt/ours", "Device time ms", "Alternatives (name · tier: ms)", "Throughput", "SOL", "Bound")


# -- formats ---------------------------------------------------------------------------------------

def render_terminal(results: Results, console: Any, detail: bool = True) -> None:
    """The summary (:mod:`npuops.summary`), then with ``detail`` a table per op and regime, fitted to
    the console's width: names and numbers never wrap mid-word, and the reasons rows were skipped,
    wrong or failed are numbered notes below each table rather than sentences folded into a cell."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    from .summary import render_summary_terminal

    def esc(text: str) -> str:
        return escape(plain(text))

    all_entries = build_entries(results)
    render_summary_terminal(results, console, all_entries)
    if not detail:
        return
    for line in _env_lines(results)[3:]:  # the summary showed the first three
        console.print(f"[dim]{esc(line)}[/dim]")
    colors = {"faster": "green", "slower": "red", "level": "", "none": ""}
    notes: dict[str, int] = {}  # reason -> its number, the same in every table
    for (family, op, regime), entries in _grouped(all_entries).items():
        rows, used = [], []
        for e in entries:
            alts = []
            for name, text, reason in _alternative_notes(e):
                if reason is not None:
                    number = notes.setdefault(reason, len(notes) + 1)
                    used += [reason] if reason not in used else []
                    text = f"{text} [{number}]"
                alts.append(plain(f"{name}: {text}"))
            rows.append((e, [plain(f"{e.workload} {e.label} {e.dtype}"), ratio_text(e), plain(ours_text(e)),
                             "\n".join(alts), throughput_text(e), sol_text(e), e.metrics.get("bound") or "·"]))
        table = Table(title=esc(f"{family} · {op} · {regime}"), title_justify="left", box=box.SIMPLE_HEAD,
                      show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))
        between = 2 * (len(TERMINAL_HEADERS) - 1)  # a pad and a divider between columns
        widths = _fit_widths(TERMINAL_HEADERS, [cells for _, cells in rows], console.width - between)
        for header, width in zip(TERMINAL_HEADERS, widths):
            table.add_column(header, width=width, overflow="fold")
        for e, cells in rows:
            style = colors[ratio_class(e.ratio)]
            cells = [escape(c) for c in cells]
            if style:
                cells[1] = f"[{style}]{cells[1]}[/{style}]"
            table.add_row(*cells)
        console.print(table)
        for reason in sorted(used, key=notes.get):
            console.print(esc(f"  [{notes[reason]}] {reason}"), highlight=False)
    console.print(f"[dim]{footnote(all_entries)}[/dim]")


# The per-op table's columns in the terminal, headers on two lines so that the cells set the widths.
TERMINAL_HEADERS = ("Workload", "Ratio\nalt/ours", "Device\ntime ms", "Alternatives\n(name · tier: ms)",
                    "Through-\nput", "SOL", "Bound")
ALTERNATIVES = 3  # the column of TERMINAL_HEADERS that gives up width first and last


def _fit_widths(headers: Iterable[str], rows: list[list[str]], available: int) -> list[int]:
    """Column widths for ``rows`` within ``available`` characters, each column's widest line where
    they fit. Else the workload gives up width down to 16, the alternatives down to 40, then the
    other columns (the workload last) down to their longest word (so that a line wraps between words, never
    inside one), then the alternatives down to 16; past that, the widest column gives up one at a
    time."""
    from rich.cells import cell_len

    columns = [[h, *(r[i] for r in rows)] for i, h in enumerate(headers)]
    natural = [max(cell_len(line) for text in col for line in text.split("\n")) for col in columns]
    words = [max((cell_len(word) for text in col for word in text.split()), default=1) for col in columns]
    others = [2, 1, 5, 4, 6, 0]  # device time, ratio, SOL, throughput, bound, workload
    steps = [(0, max(words[0], 16)), (ALTERNATIVES, 40)] + [(i, words[i]) for i in others] + [(ALTERNATIVES, 16)]
    widths = list(natural)
    for i, floor in steps:
        excess = sum(widths) - available
        if excess <= 0:
            return widths
        widths[i] -= max(0, min(excess, widths[i] - floor))
    while sum(widths) > available and max(widths) > 4:
        widths[widths.index(max(widths))] -= 1
    return widths


def _alternative_notes(e: Entry) -> list[tuple[str, str, str | None]]:
    """:func:`alternative_cells` with a row's reason apart: (name, time or status, reason or None)."""
    cells = []
    for row in e.rows:
        if e.ours is not None and row is e.ours:
            continue
        name = row["impl"] if row["impl"] == row["tier"] else f"{row['impl']} · {row['tier']}"
        if row["status"] == "ok":
            cells.append((name, time_text(row), None))
        else:
            cells.append((name, row["status"], str(row.get("reason") or "no reason given")))
    return cells


def render_markdown(results: Results) -> str:
    esc = markdown_text
    out = io.StringIO()
    out.write("# npuops results\n\n")
    for line in _env_lines(results):
        out.write(f"- {esc(line)}\n")
    all_entries = build_entries(results)
    from .summary import summary_markdown

    out.write("\n" + summary_markdown(results, all_entries))
    out.write(f"\n{footnote(all_entries)}\n")
    summaries = summarize(all_entries)
    if summaries:
        out.write("\n## Summary: ours against the fastest alternative, per op\n\n")
        out.write("| " + " | ".join(SUMMARY_HEADERS) + " |\n|" + "---|" * len(SUMMARY_HEADERS) + "\n")
        for summary in summaries:
            out.write("| " + " | ".join(map(esc, summary_cells(summary))) + " |\n")
    for (family, op, regime), entries in _grouped(all_entries).items():
        out.write(f"\n## {esc(f'{family} · {op} · {regime}')}\n\n")
        out.write("| " + " | ".join(HEADERS) + " |\n|" + "---|" * len(HEADERS) + "\n")
        for e in entries:
            alts = "<br>".join(esc(f"{n}: {t}") for n, t in alternative_cells(e))
            cells = [esc(f"{e.workload} {e.label} {e.dtype}"), ratio_text(e), ours_text(e), alts,
                     throughput_text(e), sol_text(e), e.metrics.get("bound") or "·"]
            out.write("| " + " | ".join(cells) + " |\n")
    return out.getvalue()


def csv_text(text: str) -> str:
    """A text cell as a spreadsheet shows it, never runs it: control characters escaped, and a
    leading ``= + - @`` (a formula to Excel and its kind) quoted with an apostrophe."""
    text = plain(text)
    return f"'{text}" if text[:1] in ("=", "+", "-", "@") else text


def render_csv(results: Results) -> str:
    return records_csv(json_records(results))


def records_csv(records: list[dict[str, Any]]) -> str:
    """JSON-like records as CSV, text cells guarded against spreadsheet formulas (:func:`csv_text`)."""
    out = io.StringIO()
    if records:
        writer = csv.DictWriter(out, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows({k: csv_text(v) if isinstance(v, str) else v for k, v in r.items()} for r in records)
    return out.getvalue()


def render_json(results: Results) -> str:
    return json.dumps(json_records(results), indent=1)


_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:0 0 2em}
th,td{border-bottom:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.faster{background:#d9f2d9;color:#145214;font-weight:600}
.slower{background:#f8d7d7;color:#7a1010;font-weight:600}
.alt{font-size:12px;color:#444}
.env{color:#666;font-size:12px}
h2{font-size:16px;margin-top:1.6em}
"""


def render_html(results: Results) -> str:
    esc = html_text
    all_entries = build_entries(results)
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>npuops results</title>",
             f"<style>{_CSS}</style></head><body><h1>npuops results</h1>"]
    parts += [f"<p class='env'>{esc(line)}</p>" for line in _env_lines(results)]
    from .summary import summary_html

    parts.append(summary_html(results, all_entries))
    from .plots import plots_html

    parts.append(plots_html(results, all_entries))
    parts.append(f"<p class='env'>Green: faster than the best alternative; red: slower; plain: within {LEVEL:.0%}. "
                 f"Times in ms (median device time). {esc(footnote(all_entries))}</p>")
    summaries = summarize(all_entries)
    if summaries:
        parts.append("<h2>Summary: ours against the fastest alternative, per op</h2><table><tr>")
        parts += [f"<th>{esc(h)}</th>" for h in SUMMARY_HEADERS]
        parts.append("</tr>")
        for summary in summaries:
            cells = [f"<td>{esc(c)}</td>" for c in summary_cells(summary)]
            cells[3] = f"<td class='num {ratio_class(summary.geomean_ratio)}'>{esc(summary_cells(summary)[3])}</td>"
            parts.append("<tr>" + "".join(cells) + "</tr>")
        parts.append("</table>")
    for (family, op, regime), entries in _grouped(all_entries).items():
        parts.append(f"<h2>{esc(family)} · {esc(op)} · {esc(regime)}</h2><table><tr>")
        parts += [f"<th>{esc(h)}</th>" for h in HEADERS]
        parts.append("</tr>")
        for e in entries:
            alts = "<br>".join(f"{esc(n)}: {esc(t)}" for n, t in alternative_cells(e))
            parts.append(
                f"<tr><td>{esc(e.workload)} {esc(e.label)} {esc(e.dtype)}</td>"
                f"<td class='num {ratio_class(e.ratio)}'>{esc(ratio_text(e))}</td>"
                f"<td class='num'>{esc(ours_text(e))}</td><td class='alt'>{alts}</td>"
                f"<td class='num'>{esc(throughput_text(e))}</td><td class='num'>{esc(sol_text(e))}</td>"
                f"<td>{esc(e.metrics.get('bound') or '·')}</td></tr>")
        parts.append("</table>")
    parts.append("</body></html>")
    return "".join(parts)
