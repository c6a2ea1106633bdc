"""Two results files side by side: ``npuops report A --against B``, a change's effect in one command.

Rows are matched by (op, workload, fingerprint, implementation, regime): the same measurement in
both files, whatever the device. Per row: the time in B (the baseline) and in A, and the speed-up
B / A (above 1, A is faster), by median device time; beside it the same by kernel time where both
rows have one (``npuops run --kernel-time``). Rows present in one file only and rows whose status
changed (ok → wrong, failed → ok, ...) are listed.

The comparison opens with the files' runs (device, git revision, calibration of each) and a line
where they differ (a speed-up between two devices measures the devices, not a change), then a short
summary: how many rows are faster or slower by more than the report's noise level (``LEVEL``), the
geometric mean of the speed-up per family (all implementations, and ours alone), the worst
regressions named. Then the table: terminal (only the rows that changed, unless ``--detail`` or a
filter), markdown, csv and json.
"""

from __future__ import annotations

import io
import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from .report import (
    LEVEL,
    _geomean,
    _median,
    _quotient,
    _workload_order,
    fmt_ms,
    fmt_ratio,
    kernel_ms,
    markdown_text,
    plain,
    ratio_class,
)
from .results import Results

PairKey = tuple[str, str, str, str, str]
FORMATS = ("terminal", "markdown", "csv", "json")
SHOWN_REGRESSIONS = 5  # the worst regressions named in the summary
SHOWN_CHANGES = 10  # status changes named in the summary, and ops named for rows of one file; the rest are counted
SHOWN_ONLY = 5  # rows of one file named one by one; past that, counted per op


def pair_key(row: dict[str, Any]) -> PairKey:
    """:func:`npuops.results.row_key` without the device: the same measurement on another machine."""
    return (row["op"], row["workload"], row["fingerprint"], row["impl"], row["regime"])


@dataclass
class Pair:
    """One row key, in A and in B (None where the file lacks it)."""

    a: dict[str, Any] | None
    b: dict[str, Any] | None
    speedup: float | None = None  # B's median device time over A's; above 1, A is faster
    kernel_speedup: float | None = None  # the same by kernel time, where both rows have one

    @property
    def row(self) -> dict[str, Any]:
        return self.a or self.b  # type: ignore[return-value]

    @property
    def status_change(self) -> str | None:
        if self.a is None or self.b is None or self.a["status"] == self.b["status"]:
            return None
        return f"{self.b['status']} → {self.a['status']}"

    @property
    def change(self) -> str:
        """faster, slower, level (within LEVEL) or none (not timed in both)."""
        return ratio_class(self.speedup)

    def status_text(self) -> str:
        if self.b is None:
            return "only in A"
        if self.a is None:
            return "only in B"
        return self.status_change or self.a["status"]

    def name(self) -> str:
        r = self.row
        impl = f"{r['impl']} (ours)" if r["tier"] == "ours" else r["impl"]
        return f"{r['family']} · {r['op']} {r['workload']} {r['label']} {r['dtype']} · {impl} · {r['regime']}"


@dataclass
class FamilyChange:
    family: str
    compared: int
    faster: int
    slower: int
    geomean: float | None
    ours_compared: int = 0
    ours_geomean: float | None = None
    kernel_geomean: float | None = None  # where every compared row has a kernel speed-up


@dataclass
class Comparison:
    a_name: str
    b_name: str
    a: Results
    b: Results
    pairs: list[Pair]
    families: list[FamilyChange] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # the runs, and where they differ

    def compared(self) -> list[Pair]:
        return [p for p in self.pairs if p.speedup is not None]

    def counts(self) -> dict[str, int]:
        c = Counter(p.change for p in self.compared())
        return {"compared": len(self.compared()), "faster": c["faster"], "slower": c["slower"], "level": c["level"],
                "only_in_a": sum(p.b is None for p in self.pairs), "only_in_b": sum(p.a is None for p in self.pairs),
                "status_changes": sum(p.status_change is not None for p in self.pairs)}

    def regressions(self) -> list[Pair]:
        slower = [p for p in self.compared() if p.change == "slower"]
        return sorted(slower, key=lambda p: p.speedup)[:SHOWN_REGRESSIONS]  # type: ignore[arg-type, return-value]


def _ok(row: dict[str, Any] | None) -> bool:
    return row is not None and row["status"] == "ok"


def _by_key(results: Results) -> tuple[dict[PairKey, dict[str, Any]], int]:
    """The rows by :func:`pair_key`, and how many shared a key with another (a file of several
    devices: the last read is compared)."""
    rows: dict[PairKey, dict[str, Any]] = {}
    shared = 0
    for row in results.rows:
        key = pair_key(row)
        shared += key in rows
        rows[key] = row
    return rows, shared


def _runs(results: Results) -> list[dict[str, Any]]:
    """The env records of the runs the file's rows came from, with a stand-in for a run whose env
    record is missing."""
    ids = sorted({str(r.get("run_id", "")) for r in results.rows})
    return [results.env.get(run_id) or {"run_id": run_id or "?"} for run_id in ids]


def _device(env: dict[str, Any]) -> str:
    d = env.get("device") or {}
    return str(d.get("model") or d.get("device") or "unknown device")


def _calibration(env: dict[str, Any]) -> str:
    lim = env.get("limits")
    if not lim:
        return "no limits"
    return f"{lim['copy_bandwidth'] / 1e12:.2f} TB/s copy, {lim['flops'].get('bf16', 0) / 1e12:.0f} TFLOP/s bf16 ({lim['source']})"


def run_lines(name: str, label: str, results: Results) -> list[str]:
    runs = _runs(results)
    lines = [f"{label}: {name} ({len(results.rows)} rows, {len(runs)} run{'s' * (len(runs) != 1)})"]
    for env in runs:
        lines.append(f"  run {env.get('run_id')} {env.get('started', '')}: {_device(env)} · git {env.get('git')} · "
                     f"{_calibration(env)}")
    return lines


def _differences(a: Results, b: Results) -> list[str]:
    """Lines for what differs between the files' runs, beyond the revision a comparison is for."""
    out = []
    runs_a, runs_b = _runs(a), _runs(b)
    devices_a, devices_b = {_device(e) for e in runs_a}, {_device(e) for e in runs_b}
    if devices_a != devices_b:
        out.append(f"devices differ (A: {', '.join(sorted(devices_a))}; B: {', '.join(sorted(devices_b))}): "
                   "speed-ups compare the machines as much as the code")
    cal_a, cal_b = {_calibration(e) for e in runs_a}, {_calibration(e) for e in runs_b}
    if cal_a != cal_b:
        out.append("calibrations differ: the files' SOL figures use different limits (times are compared as measured)")
    git_a, git_b = {str(e.get("git")) for e in runs_a}, {str(e.get("git")) for e in runs_b}
    if git_a == git_b:
        out.append(f"same git revision ({', '.join(sorted(git_a))}): differences are run-to-run noise or the machine")
    return out


def compare(a: Results, b: Results, a_name: str = "A", b_name: str = "B") -> Comparison:
    rows_a, shared_a = _by_key(a)
    rows_b, shared_b = _by_key(b)
    pairs = []
    for key in rows_a.keys() | rows_b.keys():
        pair = Pair(rows_a.get(key), rows_b.get(key))
        if _ok(pair.a) and _ok(pair.b):
            pair.speedup = _quotient(_median(pair.b), _median(pair.a))
            ka, kb = kernel_ms(pair.a), kernel_ms(pair.b)
            pair.kernel_speedup = _quotient(kb, ka) if ka and kb else None
        pairs.append(pair)
    pairs.sort(key=lambda p: (p.row["family"], p.row["op"], _workload_order(p.row["workload"]), p.row["workload"],
                              p.row["regime"], p.row["tier"] != "ours", p.row["impl"]))
    comparison = Comparison(a_name, b_name, a, b, pairs)
    comparison.notes = run_lines(a_name, "A", a) + run_lines(b_name, "B (baseline)", b) + _differences(a, b)
    for name, shared in (("A", shared_a), ("B", shared_b)):
        if shared:
            comparison.notes.append(f"{shared} rows of {name} share a key with another device's row: the last read is compared")
    by_family: dict[str, list[Pair]] = defaultdict(list)
    for p in comparison.compared():
        by_family[p.row["family"]].append(p)
    for family in sorted(by_family):
        group = by_family[family]
        ours = [p.speedup for p in group if p.row["tier"] == "ours"]
        kernels = [p.kernel_speedup for p in group]
        comparison.families.append(FamilyChange(
            family, len(group), sum(p.change == "faster" for p in group), sum(p.change == "slower" for p in group),
            _geomean([p.speedup for p in group]), len(ours), _geomean(ours) if ours else None,
            _geomean(kernels) if None not in kernels else None))  # type: ignore[arg-type]
    return comparison


# -- text shared by the formats -----------------------------------------------------------------------

SPEEDUP_NOTE = (f"speed-up: B's median device time over A's (above 1, A is faster); faster or slower: beyond "
                f"{LEVEL:.0%}, the report's noise level. kernels: the same by kernel time (npuops run --kernel-time), "
                "where both rows have one.")


def overview_text(c: Comparison) -> str:
    n = c.counts()
    return (f"{n['compared']} rows timed in both: {n['faster']} faster in A, {n['slower']} slower, {n['level']} within "
            f"{LEVEL:.0%}; {n['status_changes']} status changes; {n['only_in_a']} rows only in A, {n['only_in_b']} only in B")


FAMILY_HEADERS = ("Family", "Rows", "Faster", "Slower", "Geomean speed-up", "Ours: rows", "Ours: geomean")


def family_cells(f: FamilyChange) -> list[str]:
    geomean = fmt_ratio(f.geomean) + ("" if f.kernel_geomean is None else f" (kernels {fmt_ratio(f.kernel_geomean)})")
    return [f.family, str(f.compared), str(f.faster), str(f.slower), geomean, str(f.ours_compared), fmt_ratio(f.ours_geomean)]


def regression_lines(c: Comparison) -> list[str]:
    return [f"{p.name()}: {fmt_ms(_median(p.b))} → {fmt_ms(_median(p.a))} ms ({fmt_ratio(p.speedup)})"  # type: ignore[arg-type]
            for p in c.regressions()]


def change_lines(c: Comparison) -> list[str]:
    """The status changes, then the rows of one file only, named up to SHOWN_CHANGES each."""
    lines = []
    changed = [p for p in c.pairs if p.status_change]
    for p in changed[:SHOWN_CHANGES]:
        reason = (p.a or {}).get("reason") if p.a["status"] != "ok" else None  # type: ignore[index]
        lines.append(f"{p.status_change}: {p.name()}" + (f": {reason}" if reason else ""))
    if len(changed) > SHOWN_CHANGES:
        lines.append(f"and {len(changed) - SHOWN_CHANGES} more status changes")
    for label, only in (("only in A", [p for p in c.pairs if p.b is None]), ("only in B", [p for p in c.pairs if p.a is None])):
        if len(only) <= SHOWN_ONLY:
            lines += [f"{label}: {p.name()} ({p.row['status']})" for p in only]
            continue
        ops = Counter(f"{p.row['family']} · {p.row['op']}" for p in only)
        named = ", ".join(f"{op} {n}" for op, n in ops.most_common(SHOWN_CHANGES))
        more = len(ops) - SHOWN_CHANGES
        lines.append(f"{label}: {len(only)} rows, by op: {named}" + (f" and {more} more ops" if more > 0 else ""))
    return lines


ROW_HEADERS = ("Workload", "Implementation", "Regime", "B ms", "A ms", "Speed-up B/A", "Kernels B → A ms", "Status")
# The same in the terminal, on two lines so that the cells set the widths.
TERMINAL_HEADERS = ("Workload", "Implemen-\ntation", "Regime", "B ms", "A ms", "Speed-up\nB/A", "Kernels ms\nB → A", "Status")


def _time(row: dict[str, Any] | None) -> str:
    return fmt_ms(_median(row)) if _ok(row) else "·"


def row_cells(p: Pair) -> list[str]:
    r = p.row
    impl = r["impl"] if r["impl"] == r["tier"] else f"{r['impl']} · {r['tier']}"
    ka, kb = (kernel_ms(p.a) if _ok(p.a) else None), (kernel_ms(p.b) if _ok(p.b) else None)
    kernels = "·" if ka is None and kb is None else f"{fmt_ms(kb)} → {fmt_ms(ka)}"
    if p.kernel_speedup is not None:
        kernels += f" ({fmt_ratio(p.kernel_speedup)})"
    return [f"{r['workload']} {r['label']} {r['dtype']}", impl, r["regime"], _time(p.b), _time(p.a),
            fmt_ratio(p.speedup), kernels, p.status_text()]


def interesting(p: Pair) -> bool:
    """Changed beyond the noise level, changed status, or in one file only."""
    return p.change in ("faster", "slower") or p.status_change is not None or p.a is None or p.b is None


def _grouped(pairs: list[Pair]) -> dict[tuple[str, str], list[Pair]]:
    out: dict[tuple[str, str], list[Pair]] = defaultdict(list)
    for p in pairs:
        out[(p.row["family"], p.row["op"])].append(p)
    return out


# -- formats ---------------------------------------------------------------------------------------

def render_terminal(c: Comparison, console: Any, detail: bool = False) -> None:
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    def esc(text: str) -> str:
        return escape(plain(text))

    colors = {"faster": "green", "slower": "red", "level": "", "none": ""}
    for line in c.notes:
        warn = line.startswith(("devices differ", "calibrations differ"))
        console.print(f"[yellow]{esc(line)}[/yellow]" if warn else f"[dim]{esc(line)}[/dim]", highlight=False)
    console.print(f"[bold]{esc(overview_text(c))}[/bold]", highlight=False)
    if c.families:
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1, 0, 0), show_edge=False)
        for h in FAMILY_HEADERS:
            table.add_column(h, justify="left" if h == "Family" else "right")
        for f in c.families:
            cells = [esc(x) for x in family_cells(f)]
            for i, value in ((4, f.geomean), (6, f.ours_geomean)):
                style = colors[ratio_class(value)]
                cells[i] = f"[{style}]{cells[i]}[/{style}]" if style else cells[i]
            table.add_row(*cells)
        console.print(table)
    regressions = regression_lines(c)
    if regressions:
        console.print("[bold]worst regressions:[/bold]")
        for text in regressions:
            console.print(f"[red]  {esc(text)}[/red]", highlight=False)
    for text in change_lines(c):
        console.print(esc(text), highlight=False)
    shown = c.pairs if detail else [p for p in c.pairs if interesting(p)]
    for (family, op), pairs in _grouped(shown).items():
        table = Table(title=esc(f"{family} · {op}"), title_justify="left", box=box.SIMPLE_HEAD, show_edge=False,
                      pad_edge=False, padding=(0, 1, 0, 0))
        kernels = any(row_cells(p)[6] != "·" for p in pairs)  # the column only where a row has kernel times
        for i, h in enumerate(TERMINAL_HEADERS):
            if i == 6 and not kernels:
                continue
            if i in (0, 1):  # names fold; figures never do
                table.add_column(h, overflow="fold", min_width=10)
            else:
                table.add_column(h, no_wrap=True, justify="right" if 3 <= i <= 6 else "left")
        for p in pairs:
            cells = [esc(x) for x in row_cells(p)]
            style = colors[p.change]
            if style:
                cells[5] = f"[{style}]{cells[5]}[/{style}]"
            if p.status_change or p.a is None or p.b is None:
                cells[7] = f"[yellow]{cells[7]}[/yellow]"
            table.add_row(*(cells if kernels else cells[:6] + cells[7:]))
        console.print(table)
    hidden = len(c.pairs) - len(shown)
    if hidden:
        console.print(f"[dim]{hidden} rows within {LEVEL:.0%} or not timed in either file not shown "
                      "(--detail shows every row)[/dim]", highlight=False)
    console.print(f"[dim]{esc(SPEEDUP_NOTE)}[/dim]", highlight=False)


def render_markdown(c: Comparison) -> str:
    esc = markdown_text
    out = io.StringIO()
    out.write("# npuops comparison: A against B\n\n")
    for line in c.notes:
        out.write(f"- {esc(line.strip())}\n")
    out.write(f"\n{esc(overview_text(c))}\n\n{esc(SPEEDUP_NOTE)}\n")
    if c.families:
        out.write("\n| " + " | ".join(FAMILY_HEADERS) + " |\n|" + "---|" * len(FAMILY_HEADERS) + "\n")
        for f in c.families:
            out.write("| " + " | ".join(map(esc, family_cells(f))) + " |\n")
    regressions = regression_lines(c)
    if regressions:
        out.write("\nWorst regressions:\n\n" + "".join(f"- {esc(t)}\n" for t in regressions))
    changes = change_lines(c)
    if changes:
        out.write("\nStatus changes and rows of one file:\n\n" + "".join(f"- {esc(t)}\n" for t in changes))
    for (family, op), pairs in _grouped(c.pairs).items():
        out.write(f"\n## {esc(f'{family} · {op}')}\n\n")
        out.write("| " + " | ".join(ROW_HEADERS) + " |\n|" + "---|" * len(ROW_HEADERS) + "\n")
        for p in pairs:
            out.write("| " + " | ".join(map(esc, row_cells(p))) + " |\n")
    return out.getvalue()


def records(c: Comparison) -> list[dict[str, Any]]:
    out = []
    for p in c.pairs:
        r = p.row
        out.append({"family": r["family"], "op": r["op"], "workload": r["workload"], "label": r["label"],
                    "dtype": r["dtype"], "fingerprint": r["fingerprint"], "impl": r["impl"], "tier": r["tier"],
                    "regime": r["regime"], "in_a": p.a is not None, "in_b": p.b is not None,
                    "status_a": p.a["status"] if p.a else None, "status_b": p.b["status"] if p.b else None,
                    "median_ms_a": _median(p.a) if _ok(p.a) else None, "median_ms_b": _median(p.b) if _ok(p.b) else None,
                    "kernel_ms_a": kernel_ms(p.a) if _ok(p.a) else None, "kernel_ms_b": kernel_ms(p.b) if _ok(p.b) else None,
                    "speedup": p.speedup, "kernel_speedup": p.kernel_speedup, "change": p.change,
                    "status_change": p.status_change})
    return out


def render_json(c: Comparison) -> str:
    def runs(results: Results) -> list[dict[str, Any]]:
        return [{"run_id": e.get("run_id"), "device": _device(e), "git": e.get("git"), "limits": e.get("limits")}
                for e in _runs(results)]

    doc = {"a": {"file": c.a_name, "runs": runs(c.a)}, "b": {"file": c.b_name, "runs": runs(c.b)},
           "notes": c.notes, "level": LEVEL, "counts": c.counts(),
           "families": [{"family": f.family, "compared": f.compared, "faster": f.faster, "slower": f.slower,
                         "geomean_speedup": f.geomean, "kernel_geomean_speedup": f.kernel_geomean,
                         "ours_compared": f.ours_compared, "ours_geomean_speedup": f.ours_geomean} for f in c.families],
           "worst_regressions": [p.name() for p in c.regressions()],
           "rows": records(c)}
    return json.dumps(doc, indent=1)


def render_csv(c: Comparison) -> str:
    from .report import records_csv

    return records_csv(records(c))
