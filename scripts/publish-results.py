"""Publish a sweep: the results files of one sweep (the shards of `npuops run --shard I/N`, or any
runs of one revision and calibration) as the set a user reads, in benchmarks/DEVICE/:

- results.jsonl.gz: every row once (`npuops merge`), the runs' env records first and the rows in
  key order, gzip with no name or time in its header: the same inputs give the same bytes;
- report.md and report.html: what `npuops report results.jsonl.gz --format markdown|html` writes;
- README.md: the device and host, the revision and the calibration, the commands that reproduce
  the set, the row counts and a headline table per family (the figures of `npuops.summary`).

    python scripts/publish-results.py shard1.jsonl ... shardN.jsonl --device h200 [--command "npuops run ..."]

The four files replace the previous set together, once all four are written (`npuops.files`): a
refusal or a failure leaves the previous set as it was. Inputs of several revisions or
calibrations, and a sweep missing a shard, are refused unless --force; the README then says which
share of the rows came from which.
"""

from __future__ import annotations

import argparse
import functools
import re
import shlex
import statistics
import sys
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from npuops.errors import NpuopsError
from npuops.files import replaced
from npuops.merge import Merged, merge_results, write_records
from npuops.report import markdown_text, plain, render_html, render_markdown
from npuops.results import Results, row_key
from npuops.summary import RATIO_NOTE, Summary, geomean_text, overview_text, problems_text, sol_pct_text, summarize_results

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
FILES = ("results.jsonl.gz", "report.md", "report.html", "README.md")
DEVICE_FACTS = (("{}", "device", "model"), ("{}", "device", "capability"), ("{} SMs", "device", "multiprocessors"),
                ("{} GiB", "device", "memory_gib"), ("driver {}", "device", "driver"),
                ("CUDA runtime {}", "device", "cuda_runtime"))
HOST_FACTS = (("host {}", "host"), ("Python {}", "versions", "python"), ("torch {}", "versions", "torch"),
              ("tilelang {}", "versions", "tilelang"), ("triton {}", "versions", "triton"),
              ("npuops {}", "versions", "npuops"))
LEADS_NOTE = ("Ours leads: of the workloads compared, those where the ratio is at least 1, by the same timing as "
              "the geomean beside it (kernel time where it is marked k, else device time: CUDA events around each "
              "call, docs/timing.md). SOL is by device time.")


def publish(inputs: Sequence[str], folder: Path, device: str, force: bool = False, command: str | None = None) -> Merged:
    """The published set of ``inputs`` written into ``folder`` (see the module's docstring); the
    merge, in the published order."""
    merged = merge_results(inputs, force=force)
    if merged.notes and not force:  # unforced, merge's only notes are missing shards
        raise NpuopsError(f"{'; '.join(merged.notes)}; publish the whole sweep, or pass --force to publish it anyway")
    if not merged.rows:
        raise NpuopsError("the inputs hold no rows: nothing to publish")
    merged.env = dict(sorted(merged.env.items(), key=lambda run: (str(run[1].get("started")), run[0])))
    merged.rows.sort(key=row_key)
    results = Results(merged.env, merged.rows)
    texts = [render_markdown(results), render_html(results),
             readme_text(results, merged.notes, inputs, device, force, command)]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with replaced(*(folder / name for name in FILES)) as (data, *rendered):
            write_records(data, results.env, results.rows, compressed=True)
            for f, text in zip(rendered, texts):
                f.write(text.encode())
    except OSError as exc:
        raise NpuopsError(f"{str(folder)!r} cannot be written: {exc.strerror or exc}") from None
    return merged


# -- the README ----------------------------------------------------------------------------------

def readme_text(results: Results, notes: list[str], inputs: Sequence[str], device: str, force: bool,
                command: str | None) -> str:
    envs = list(results.env.values())
    model = _facts(envs, DEVICE_FACTS[:1])
    summary = summarize_results(results)
    lines = [f"# npuops results: {markdown_text(device)} ({model})", "",
             ("The current sweep: [results.jsonl.gz](results.jsonl.gz) holds every row (`npuops report "
              "results.jsonl.gz` reads it as it is), [report.md](report.md) and [report.html](report.html) (with "
              "plots) render it. Published by `scripts/publish-results.py`; a new sweep replaces all four files "
              "(git history keeps the earlier ones)."), "",
             "## How it was produced", "",
             f"- Device: {_facts(envs, DEVICE_FACTS)}",
             f"- Host: {_facts(envs, HOST_FACTS)}"]
    clocks = sorted(row["timing"]["clock_mhz"] for row in results.rows
                    if row["status"] == "ok" and isinstance(row["timing"].get("clock_mhz"), int | float))
    if clocks:
        spread = (f"{clocks[0]:.0f} MHz on every timed row" if clocks[0] == clocks[-1] else
                  f"{clocks[0]:.0f} to {clocks[-1]:.0f} MHz, median {statistics.median(clocks):.0f}")
        lines.append(f"- SM clock when each row was timed: {spread}")
    lines += _shares_lines("Revision", results, lambda env: str(env.get("git") or "unknown"))
    lines += _shares_lines("Calibration (the limits of SOL)", results, lambda env: _limits_text(env.get("limits")))
    shards = ", ".join(dict.fromkeys(str(env["shard"]) for env in envs if env.get("shard")))
    started = f"started {envs[0].get('started')} to {envs[-1].get('started')}"
    lines.append(f"- Runs: {len(envs)}, {markdown_text(f'of shards {shards}, ' if shards else '')}{markdown_text(started)}")
    lines += [f"- {markdown_text(note)}" for note in notes]
    lines += ["", "## Reproduce", "", "```bash", *_reproduce(results, inputs, device, force, command), "```", "",
              "## Counts", "", (f"{markdown_text(overview_text(summary))}; {_families_text(summary)}; "
                                f"regimes {', '.join(map(markdown_text, summary.regimes))}."), "",
              "## Headline", "", *_headline(summary), "", markdown_text(RATIO_NOTE), LEADS_NOTE,
              "Per op and per workload: [report.md](report.md)."]
    return "\n".join(lines) + "\n"


def _facts(envs: list[dict[str, Any]], facts: Sequence[tuple[str, ...]]) -> str:
    """Each fact's label with the runs' values of it (several where the runs differ), those no run
    recorded left out."""
    parts = []
    for label, *path in facts:
        values = {functools.reduce(lambda d, key: d.get(key) if isinstance(d, dict) else None, path, env) for env in envs}
        values = sorted(str(v) for v in values if v not in (None, ""))
        if values:
            parts.append(label.format(" / ".join(values)))
    return markdown_text(", ".join(parts) or "not recorded")


def _limits_text(limits: dict[str, Any] | None) -> str:
    if not limits:
        return "none (no SOL figures)"
    rates = ", ".join(f"{dtype} {rate / 1e12:.1f}" for dtype, rate in sorted(limits["flops"].items()))
    return f"copy {limits['copy_bandwidth'] / 1e12:.2f} TB/s, matmul TFLOP/s {rates}; source: {limits['source']}"


def _shares_lines(what: str, results: Results, describe: Callable[[dict[str, Any]], str]) -> list[str]:
    """``- what: value (every row)``, or where the rows' runs differ in it (merged with --force), a
    line per value with the rows measured under it."""
    counts = Counter(describe(results.env.get(row.get("run_id"), {})) for row in results.rows).most_common()
    if len(counts) == 1:
        return [f"- {what}: {markdown_text(counts[0][0])} (every row)"]
    total = len(results.rows)
    return [f"- {what}: **several, merged with --force**; rows measured under each:"] + [
        f"  - {markdown_text(value)}: {count} rows ({100 * count / total:.0f}%)" for value, count in counts]


def _reproduce(results: Results, inputs: Sequence[str], device: str, force: bool, command: str | None) -> list[str]:
    revisions = sorted({str(env.get("git") or "unknown") for env in results.env.values()})
    if len(revisions) > 1 or revisions == ["unknown"]:
        checkout = f"# at the revisions above: {', '.join(revisions)}"
    else:
        dirty = "  # and the uncommitted changes the runs had" if revisions[0].endswith("-dirty") else ""
        checkout = f"git checkout {revisions[0].removesuffix('-dirty')}{dirty}"
    devices = sorted({str(env.get("device", {}).get("device")) for env in results.env.values()})
    runs = [command] if command else list(dict.fromkeys(
        "npuops " + shlex.join(map(str, env["argv"][1:])) if env.get("argv") else "# a run whose command was not recorded"
        for env in results.env.values()))
    names = [Path(path).name for path in inputs]
    forced = " --force" if force else ""
    return [plain(line) for line in (
        checkout, *(f"npuops calibrate --device {name}" for name in devices), *runs,
        f"npuops merge {shlex.join(names)} -o results.jsonl.gz{forced}",
        "npuops report results.jsonl.gz --format markdown -o report.md",
        "npuops report results.jsonl.gz --format html -o report.html",
        f"# or the merge, both reports and this README at once, into benchmarks/{device}/:",
        f"python scripts/publish-results.py {shlex.join(names)} --device {device}{forced}"
        + (f" --command {shlex.quote(command)}" if command else ""))]


def _families_text(summary: Summary) -> str:
    families = [line for line in summary.lines if line.op is None]
    return f"{sum(line.ops for line in families)} ops in {len(families)} families"


def _headline(summary: Summary) -> list[str]:
    """A markdown table, a line per family: its size, and per regime how many workloads ours leads,
    the geomean ratio and SOL, as :mod:`npuops.summary` computes them."""
    headers = ["Family", "Ops", "Workloads", "Ours ran"]
    for regime in summary.regimes:
        headers += [f"{regime}: ours leads", f"{regime}: geomean ratio", f"{regime}: geomean SOL"]
    table = ["| " + " | ".join(map(markdown_text, headers + ["Wrong/failed"])) + " |", "|" + "---|" * (len(headers) + 1)]
    for line in summary.lines:
        if line.op is not None:
            continue
        cells = [line.family, str(line.ops), str(line.workloads), str(line.covered)]
        for regime in summary.regimes:
            figures = line.regimes[regime]
            leads = f"{figures.leads} of {figures.compared}" if figures.compared else "·"
            cells += [leads, geomean_text(figures), sol_pct_text(figures)]
        table.append("| " + " | ".join(map(markdown_text, cells + [problems_text(line)])) + " |")
    return table


# -- command line ----------------------------------------------------------------------------------

def device_folder(text: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", text):
        raise argparse.ArgumentTypeError(f"expected a folder name such as h200, got {text!r}")
    return text


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="publish-results.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="+", metavar="SHARD", help="the sweep's results files (.jsonl or .jsonl.gz)")
    parser.add_argument("--device", required=True, type=device_folder,
                        help="the device's folder under benchmarks/, e.g. h200")
    parser.add_argument("--command", help="the `npuops run` command line of the sweep, shown in the README "
                                          "instead of each run's own (from its env record)")
    parser.add_argument("--force", action="store_true",
                        help="publish inputs of several revisions or calibrations, or a sweep missing a shard: "
                             "the README says so")
    parser.add_argument("--into", type=Path, metavar="FOLDER", help="write there instead of benchmarks/DEVICE")
    args = parser.parse_args(argv)
    folder = args.into or BENCHMARKS / args.device
    with warnings.catch_warnings(record=True) as caught:  # said after the outcome, and only with success
        warnings.simplefilter("always")
        try:
            merged = publish(args.inputs, folder, args.device, args.force, args.command)
        except NpuopsError as exc:
            print(f"error: {plain(str(exc))}", file=sys.stderr)
            return 2
    for warning in [*(str(w.message) for w in caught), *merged.notes]:
        print(f"warning: {plain(' '.join(warning.split()))}", file=sys.stderr)
    print(f"published {len(merged.rows)} rows of {len(merged.env)} runs into {folder}: {', '.join(FILES)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
