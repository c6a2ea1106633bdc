"""The report's first screen: the answer to "how much faster is ours, where, and why were rows
skipped?", read in ten seconds.

One line per family and per op: how many of its workloads ours ran on (an ``ours`` row that is ok,
in any regime), and per regime the geometric mean and the worst of the ratio to the fastest
alternative (its time over ours', same regime, same measurement: above 1, ours is faster), with the
geometric mean of ours' % of the device limit (SOL). A ratio is by kernel time (marked ``k``) where
ours and every alternative of every workload in the line have one, else by device time; a line never
mixes the two. Below: the rows skipped, one line per reason with its count; the rows wrong or failed,
each named with its reason.

``npuops report`` prints it first (the per-op tables follow with ``--detail``, ``--op`` or
``--family``), markdown and HTML open with it, and ``npuops run`` ends with it.
"""

from __future__ import annotations

import io
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from .report import Entry, _env_lines, _geomean, build_entries, fmt_ratio, html_text, markdown_text, plain, ratio_class
from .results import STATUSES, Results
from .timing import REGIMES

SHOWN_REASONS = 8  # skip reasons listed; the rest are counted on one line
SHOWN_PROBLEMS = 10  # wrong or failed rows named; the rest are counted
SHOWN_RUNS = 3  # runs described above the terminal summary; the rest are counted
RATIO_NOTE = ("ratio: the fastest alternative's time over ours' (same regime, same measurement: one revision, calibration, device model); above 1 ours is faster. "
              "Geomean and worst over the workloads where both ran; k: by kernel time (ours and every alternative "
              "have one), else by device time. SOL: geomean % of the device limit of ours' rows.")

NO_RATIO_NOTE = "no workload where ours and an alternative both ran: no ratio to show (the skipped rows say why)."


@dataclass
class RegimeFigures:
    """One line's comparison in one regime."""

    compared: int = 0  # workloads where ours and an alternative ran
    leads: int = 0  # of those, workloads where ours is at least as fast (ratio >= 1, by the geomean's timing)
    geomean: float | None = None
    worst: Entry | None = None
    worst_ratio: float | None = None
    by_kernels: bool = False
    sol_pct: float | None = None  # geomean SOL of ours' rows, where the limits are known


@dataclass
class Line:
    """A family (``op`` None) or one of its ops."""

    family: str
    op: str | None
    workloads: int
    covered: int  # workloads with an ours row that is ok
    regimes: dict[str, RegimeFigures]
    wrong: int = 0
    failed: int = 0
    ops: int = 1


@dataclass
class Summary:
    rows: int
    statuses: dict[str, int]
    workloads: int
    covered: int
    regimes: list[str]
    lines: list[Line]
    skipped: list[tuple[str, int, list[str]]]  # reason, rows, implementations ("tilelang (ours)")
    problems: list[dict[str, Any]] = field(default_factory=list)  # the wrong and failed rows


def _regime_order(regime: str) -> tuple:
    return (REGIMES.index(regime) if regime in REGIMES else len(REGIMES), regime)


def _figures(entries: list[Entry]) -> RegimeFigures:
    compared = [e for e in entries if e.ratio is not None]
    if not compared:
        return RegimeFigures()
    by_kernels = all(e.kernel_ratio is not None for e in compared)

    def ratio(e: Entry) -> float:
        return e.kernel_ratio if by_kernels else e.ratio

    worst = min(compared, key=ratio)
    sols = [e.metrics["sol_pct"] for e in entries if e.ours is not None and e.metrics.get("sol_pct")]
    return RegimeFigures(len(compared), sum(ratio(e) >= 1 for e in compared), _geomean([ratio(e) for e in compared]),
                         worst, ratio(worst), by_kernels, _geomean(sols) if sols else None)


def _line(family: str, op: str | None, entries: list[Entry], regimes: list[str]) -> Line:
    workloads = {(e.op, e.workload) for e in entries}
    covered = {(e.op, e.workload) for e in entries if e.ours is not None}
    statuses = Counter(r["status"] for e in entries for r in e.rows)
    return Line(family, op, len(workloads), len(covered),
                {regime: _figures([e for e in entries if e.regime == regime]) for regime in regimes},
                statuses["wrong"], statuses["failed"], len({e.op for e in entries}))


def _impl_name(row: dict[str, Any]) -> str:
    return f"{row['impl']} (ours)" if row["tier"] == "ours" else row["impl"]


def summarize_results(results: Results, entries: list[Entry] | None = None) -> Summary:
    entries = build_entries(results) if entries is None else entries
    regimes = sorted({e.regime for e in entries}, key=_regime_order)
    by_family: dict[str, list[Entry]] = defaultdict(list)
    by_op: dict[tuple[str, str], list[Entry]] = defaultdict(list)
    for e in entries:
        by_family[e.family].append(e)
        by_op[(e.family, e.op)].append(e)
    lines = []
    for family in sorted(by_family):
        head = _line(family, None, by_family[family], regimes)
        lines.append(head)
        if head.covered or head.wrong or head.failed:  # else the family's line says all its ops' lines would
            lines += [_line(family, op, group, regimes) for (fam, op), group in sorted(by_op.items()) if fam == family]
    reasons: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in results.rows:
        if row["status"] == "skipped":
            reasons[str(row.get("reason") or "no reason given")].append(row)
    skipped = sorted(((reason, len(rows), sorted({_impl_name(r) for r in rows})) for reason, rows in reasons.items()),
                     key=lambda s: (-s[1], s[0]))
    problems = [r for e in entries for r in e.rows if r["status"] in ("wrong", "failed")]
    statuses = Counter(r["status"] for r in results.rows)
    return Summary(len(results.rows), {s: statuses[s] for s in STATUSES}, sum(line.workloads for line in lines if line.op is None),
                   sum(line.covered for line in lines if line.op is None), regimes, lines, skipped,
                   sorted(problems, key=lambda r: (r["tier"] != "ours", r["status"], r["family"], r["op"], r["workload"])))


# -- text shared by the formats ----------------------------------------------------------------------

def overview_text(s: Summary) -> str:
    counts = ", ".join(f"{s.statuses[status]} {status}" for status in STATUSES)
    return (f"ours ran on {s.covered} of {s.workloads} workloads ({_pct(s.covered, s.workloads)}); "
            f"{s.rows} rows: {counts}")


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "·"


def name_text(line: Line) -> str:
    return f"{line.family} · {line.ops} op{'s' * (line.ops != 1)}" if line.op is None else f"  {line.op}"


def coverage_text(line: Line) -> str:
    return f"{line.covered}/{line.workloads}"


def geomean_text(f: RegimeFigures) -> str:
    return "—" if f.geomean is None else fmt_ratio(f.geomean) + ("k" if f.by_kernels else "")


def worst_text(f: RegimeFigures, line: Line) -> str:
    if f.worst is None:
        return "·"
    where = f.worst.workload if line.op is not None else f.worst.op  # the op's own line names the workload
    return f"{fmt_ratio(f.worst_ratio)} {where}"


def sol_pct_text(f: RegimeFigures) -> str:
    if f.sol_pct is None:
        return "·"
    return f"{f.sol_pct:.1f}%" if f.sol_pct < 10 else f"{f.sol_pct:.0f}%"


def problems_text(line: Line) -> str:
    return f"{line.wrong}/{line.failed}" if line.wrong or line.failed else "·"


def line_cells(line: Line, regimes: list[str]) -> list[str]:
    cells = [name_text(line), coverage_text(line)]
    for regime in regimes:
        f = line.regimes[regime]
        cells += [geomean_text(f), worst_text(f, line), sol_pct_text(f)]
    return cells + [problems_text(line)]


def headers(regimes: list[str], sep: str = " ") -> list[str]:
    out = ["Family / op", f"Ours{sep}ran"]
    for regime in regimes:
        out += [f"{regime}{sep}ratio", f"{regime}{sep}worst", f"{regime}{sep}SOL"]
    return out + ["Wrong/" + ("" if sep == " " else sep) + "failed"]


def _note(s: Summary) -> str:
    compared = any(f.compared for line in s.lines for f in line.regimes.values())
    return RATIO_NOTE if compared else NO_RATIO_NOTE


def skipped_lines(s: Summary) -> list[str]:
    """``N skipped:`` then one line per reason: ``  170  reason  (impl, impl)``; past SHOWN_REASONS, one
    line for the rest."""
    total = s.statuses["skipped"]
    if not total:
        return []
    lines = [f"{total} rows skipped, by reason:"]
    for reason, count, impls in s.skipped[:SHOWN_REASONS]:
        who = ", ".join(impls[:3]) + (f" and {len(impls) - 3} more" if len(impls) > 3 else "")
        lines.append(f"  {count:>{len(str(total))}}  {reason} — {who}")
    rest = s.skipped[SHOWN_REASONS:]
    if rest:
        lines.append(f"  {sum(c for _, c, _ in rest)} rows for {len(rest)} other reasons (npuops report --detail)")
    return lines


def problem_lines(s: Summary) -> list[str]:
    lines = []
    for r in s.problems[:SHOWN_PROBLEMS]:
        lines.append(f"{r['status']}: {r['family']} · {r['op']} {r['workload']} {r['dtype']} · {_impl_name(r)} · "
                     f"{r['regime']}: {r.get('reason') or 'no reason given'}")
    if len(s.problems) > SHOWN_PROBLEMS:
        lines.append(f"and {len(s.problems) - SHOWN_PROBLEMS} more wrong or failed rows (npuops report --detail)")
    return lines


# -- formats -----------------------------------------------------------------------------------------

def render_summary_terminal(results: Results, console: Any, entries: list[Entry] | None = None,
                            env: bool = True) -> None:
    """The first screen, fitted to the console's width: no cell holds a sentence."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    def esc(text: str) -> str:
        return escape(plain(text))

    s = summarize_results(results, entries)
    if env:
        runs = _env_lines(results)
        for line in runs[:SHOWN_RUNS]:
            console.print(f"[dim]{esc(line)}[/dim]", highlight=False)
        if len(runs) > SHOWN_RUNS:
            console.print(f"[dim]and {len(runs) - SHOWN_RUNS} more runs[/dim]", highlight=False)
    console.print(f"[bold]{esc(overview_text(s))}[/bold]", highlight=False)
    colors = {"faster": "green", "slower": "red", "level": "", "none": ""}
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0), show_edge=False)
    names = [name_text(line) for line in s.lines]
    cols = headers(s.regimes, "\n")
    table.add_column(cols[0], min_width=min(max(map(len, names)), 40), overflow="fold")
    table.add_column(cols[1], no_wrap=True, justify="right")
    for i, _ in enumerate(s.regimes):
        table.add_column(cols[2 + 3 * i], no_wrap=True, justify="right")
        table.add_column(cols[3 + 3 * i], min_width=8, overflow="fold")
        table.add_column(cols[4 + 3 * i], no_wrap=True, justify="right")
    table.add_column(cols[-1], no_wrap=True, justify="right")
    for line in s.lines:
        cells = [esc(c) for c in line_cells(line, s.regimes)]
        for i, regime in enumerate(s.regimes):
            style = colors[ratio_class(line.regimes[regime].geomean)]
            if style:
                cells[2 + 3 * i] = f"[{style}]{cells[2 + 3 * i]}[/{style}]"
            if ratio_class(line.regimes[regime].worst_ratio) == "slower":
                cells[3 + 3 * i] = f"[red]{cells[3 + 3 * i]}[/red]"
        if line.wrong or line.failed:
            cells[-1] = f"[red]{cells[-1]}[/red]"
        table.add_row(*cells, style="bold" if line.op is None else None)
    console.print(table)
    console.print(f"[dim]{esc(_note(s))}[/dim]", highlight=False)
    for text in problem_lines(s):
        console.print(f"[red]{esc(text)}[/red]", highlight=False)
    for text in skipped_lines(s):
        console.print(esc(text), highlight=False)


def summary_markdown(results: Results, entries: list[Entry] | None = None) -> str:
    s = summarize_results(results, entries)
    esc = markdown_text
    out = io.StringIO()
    out.write(f"## At a glance\n\n{esc(overview_text(s))}\n\n")
    cols = headers(s.regimes)
    out.write("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n")
    for line in s.lines:
        cells = [esc(c) for c in line_cells(line, s.regimes)]
        cells[0] = f"**{cells[0]}**" if line.op is None else cells[0].strip()
        out.write("| " + " | ".join(cells) + " |\n")
    out.write(f"\n{esc(_note(s))}\n")
    problems = problem_lines(s)
    if problems:
        out.write("\n" + "".join(f"- {esc(text)}\n" for text in problems))
    skipped = skipped_lines(s)
    if skipped:
        out.write(f"\n{esc(skipped[0])}\n\n" + "".join(f"- {esc(text.strip())}\n" for text in skipped[1:]))
    return out.getvalue()


def summary_html(results: Results, entries: list[Entry] | None = None) -> str:
    s = summarize_results(results, entries)
    esc = html_text
    parts = [f"<h2>At a glance</h2><p>{esc(overview_text(s))}</p><table><tr>"]
    parts += [f"<th>{esc(h)}</th>" for h in headers(s.regimes)]
    parts.append("</tr>")
    for line in s.lines:
        cells = line_cells(line, s.regimes)
        tds = [f"<td>{'<b>' + esc(cells[0]) + '</b>' if line.op is None else esc(cells[0].strip())}</td>",
               f"<td class='num'>{esc(cells[1])}</td>"]
        for i, regime in enumerate(s.regimes):
            g, w, sol = cells[2 + 3 * i: 5 + 3 * i]
            tds.append(f"<td class='num {ratio_class(line.regimes[regime].geomean)}'>{esc(g)}</td>"
                       f"<td>{esc(w)}</td><td class='num'>{esc(sol)}</td>")
        tds.append(f"<td>{esc(cells[-1])}</td>")
        parts.append("<tr>" + "".join(tds) + "</tr>")
    parts.append(f"</table><p class='env'>{esc(_note(s))}</p>")
    problems = problem_lines(s)
    if problems:
        parts.append("<ul>" + "".join(f"<li class='slower'>{esc(t)}</li>" for t in problems) + "</ul>")
    skipped = skipped_lines(s)
    if skipped:
        parts.append(f"<p>{esc(skipped[0])}</p><ul>" + "".join(f"<li>{esc(t.strip())}</li>" for t in skipped[1:]) + "</ul>")
    return "".join(parts)

