"""``npuops``: list, run, merge, report, plugins, warm, calibrate."""

from __future__ import annotations

import argparse
import contextlib
import errno
import fcntl
import json
import math
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .errors import NpuopsError
from .registry import Registry, load_registry
from .report import FORMATS
from .results import kernel_filesystem
from .timing import REGIMES

DEFAULT_RESULTS = "npuops-results.jsonl"


# -- flags and paths, checked up front ---------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: what is wrong and where to look, exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds above 0, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds above 0, got {text!r}")
    return value


def shard(text: str):
    from .runner import Shard

    try:
        return Shard.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def devices(text: str):
    from .runner import parse_devices

    try:
        return parse_devices(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


positive_int.__name__ = "positive integer"  # argparse names the type in its errors
positive_seconds.__name__ = "positive number of seconds"
shard.__name__ = "shard I/N"
devices.__name__ = "device list"

def _output_path(flag: str, value: str, create_parents: bool, example: str = DEFAULT_RESULTS) -> Path:
    """``value`` as a file we may write, or an NpuopsError saying why not (one line)."""
    if not value.strip():
        raise NpuopsError(f"{flag} is empty; name a file, e.g. {flag} {example}")
    path = Path(value)
    root = kernel_filesystem(path)
    if root is not None:
        raise NpuopsError(f"{flag} {value!r} is under {root}, a kernel filesystem, not a place for files; "
                          "name a file in an ordinary folder")
    if path.is_dir():
        raise NpuopsError(f"{flag} {value!r} is a folder; name a file in it, e.g. {path / example}")
    parent = path.parent
    if not parent.exists() and not create_parents:
        raise NpuopsError(f"{flag} {value!r}: folder {str(parent)!r} does not exist; create it or name another file")
    if parent.exists() and not parent.is_dir():
        raise NpuopsError(f"{flag} {value!r}: {str(parent)!r} is a file, not a folder")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        if path.exists() or create_parents:  # opened for appending: nothing already there is lost
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
        elif not os.access(parent, os.W_OK):
            raise PermissionError(errno.EACCES, f"folder {str(parent)!r} is not writable")
    except OSError as exc:
        raise NpuopsError(f"{flag} {value!r} cannot be written: {exc.strerror or exc}") from None
    return path


@contextlib.contextmanager
def _results_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive, non-blocking flock on the results file for the run: a second run on the
    same file would measure every row the first has not written yet, twice. The kernel drops the
    lock when this process ends, however it ends."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise NpuopsError(f"another `npuops run` is writing {str(path)!r}; wait for it to finish "
                                  "(it resumes from there), or give this run another --out") from None
            raise NpuopsError(f"--out {str(path)!r} cannot be locked: {exc.strerror or exc}") from None
        yield
    finally:
        os.close(fd)


def _input_file(what: str, value: str) -> Path:
    path = Path(value)
    if not path.exists():
        return path  # the command's own check says what to do
    if path.is_dir():
        raise NpuopsError(f"{what} {value!r} is a folder; give a file")
    return path


def _split(values: Sequence[str] | None) -> list[str]:
    """Repeatable options that also take comma lists: ``--op A --op B`` or ``--op A,B``."""
    return [part.strip() for v in values or () for part in v.split(",") if part.strip()]


def _registry(args: argparse.Namespace) -> Registry:
    disabled = _split(args.disable) if args.disable else None
    return load_registry(strict=args.strict or None, disabled=disabled)


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
    text = " ".join(str(message).split())
    prefix = "" if text.startswith("npuops") else f"{category.__name__}: "
    print(f"warning: {prefix}{text}", file=sys.stderr if file is None else file)


def _warn_plugin_errors(registry: Registry, console: Console) -> None:
    for error in registry.errors:
        console.print(f"[yellow]warning:[/yellow] {error} (skipped; `npuops plugins` lists load errors)")


def _add_filters(p: argparse.ArgumentParser) -> None:
    p.add_argument("--family", action="append", help="family name(s), e.g. norm or norm,pool")
    p.add_argument("--op", action="append", help="op name(s), e.g. RMSNormFwd")
    p.add_argument("--workload", action="append", help="workload id(s): W3 (with --op) or RMSNormFwd/W3")


def _selection(registry: Registry, args: argparse.Namespace):
    from .runner import selected_workloads

    return selected_workloads(registry, _split(args.family), _split(args.op), _split(args.workload))


# -- list ------------------------------------------------------------------------------------------

def cmd_list(args: argparse.Namespace, console: Console) -> int:
    registry = _registry(args)
    if args.workloads:
        from .workload import load_workload_file

        registry.add_workloads(load_workload_file(args.workloads))
    workloads = _selection(registry, args)
    if args.json:
        records = []
        for w in workloads:
            op = registry.op(w.op)
            records.append({"family": op.family, "op": op.name, "id": w.id, "label": w.label, "dtype": w.dtype,
                            "implementations": [i.name for i in registry.impls_for(op.name)]})
        print(json.dumps(records, indent=1))
        return 0
    _warn_plugin_errors(registry, console)
    ops = sorted({w.op for w in workloads}, key=lambda n: (registry.op(n).family, n))
    families = sorted({registry.op(n).family for n in ops})
    console.print(f"[bold]{len(families)} families, {len(ops)} ops, {len(workloads)} workloads[/bold]")
    detailed = bool(args.op or args.workload)
    if detailed:
        table = Table("op", "workload", "label", "dtype", "shapes", "params")
        for w in workloads:
            shapes = " ".join(f"{k}{list(v)}" for k, v in w.shapes.items())
            params = ", ".join(f"{k}={v}" for k, v in {**w.chosen, **w.params}.items())
            table.add_row(w.op, w.id, w.label, w.dtype, shapes, params)
        console.print(table)
    table = Table("family", "op", "workloads", "implementations", "semantics")
    for name in ops:
        op = registry.op(name)
        count = sum(1 for w in workloads if w.op == name)
        impls = ", ".join(f"{i.name}" for i in registry.impls_for(name)) or "[red]none[/red]"
        table.add_row(op.family, name, str(count), impls, op.summary)
    console.print(table)
    return 0


# -- run -------------------------------------------------------------------------------------------

def _quick(registry: Registry, workloads):
    """One workload per op: the one needing the least memory."""
    by_op = {}
    for w in workloads:
        op = registry.op(w.op)
        if w.op not in by_op or op.memory_bytes(w) < op.memory_bytes(by_op[w.op]):
            by_op[w.op] = w
    return list(by_op.values())


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from .runner import Runner, RunOptions, check_same_model, resolve_devices
    from .timing import TimingOptions
    from .workload import load_workload_file

    out = _output_path("--out", args.out, create_parents=True)
    registry = _registry(args)
    _warn_plugin_errors(registry, console)
    user = []
    if args.workloads:
        user = registry.add_workloads(load_workload_file(args.workloads))
    indices = None
    if args.devices is not None:
        named, indices = args.devices
        if named is not None and args.device is not None and named != args.device:
            raise NpuopsError(f"--devices names {named} devices but --device is {args.device}; drop --device, "
                              f"or name {args.device} devices (e.g. --devices {args.device}:0,{args.device}:1)")
        device = registry.device(args.device or named)
        indices = resolve_devices(device, indices)
        check_same_model(device, indices)
    else:
        device = registry.device(args.device)
    workloads = _selection(registry, args)
    if args.workloads and not (args.family or args.op or args.workload):
        workloads = user  # a workload file alone means: run those
    if args.quick:
        workloads = _quick(registry, workloads)
    impls = _split(args.impl) or None
    if impls:
        known = {i.name for w in workloads for i in registry.impls_for(w.op)}
        for name in impls:
            if name not in known:
                from .errors import unknown

                raise unknown("implementation", name, known)
    regimes = tuple(_split(args.regime)) or REGIMES
    for regime in regimes:
        if regime not in REGIMES:
            from .errors import unknown

            raise unknown("regime", regime, REGIMES)
    options = RunOptions(device=device.name, regimes=regimes, jobs=args.jobs, seed=args.seed,
                         timing=TimingOptions(budget_s=args.budget), task_timeout_s=args.timeout, rerun=args.rerun,
                         tune=args.tune, kernel_time=args.kernel_time, shard=args.shard, devices=indices)
    if args.kernel_time and device.profiler_activity() is None:
        console.print(f"[yellow]--kernel-time: torch.profiler records no kernels of {device.name}; "
                      "the rows will have none[/yellow]")
    on = device.name if indices is None else ",".join(device.at(i).label for i in indices)
    described = device if indices is None else device.at(indices[0])
    jobs = args.jobs if indices is None else max(args.jobs, len(indices))
    console.print(f"npuops run: {len(workloads)} workloads on {on} "
                  f"({described.describe().get('model')}), regimes {', '.join(regimes)}, {jobs} job(s)"
                  f"{', tuning launch variants' if args.tune else ''}{', kernel times' if args.kernel_time else ''}"
                  f"{f', shard {args.shard} of the planned rows' if args.shard else ''} → {args.out}")
    columns = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("eta"), TimeRemainingColumn()]
    with _results_lock(out), Progress(*columns, console=console, transient=False, disable=args.no_progress) as progress:
        runner = Runner(registry, options, args.out, user_workloads=user, progress=progress)
        try:
            counts = runner.run(workloads, impls, argv=sys.argv)
        except KeyboardInterrupt:
            console.print(f"[yellow]interrupted[/yellow]: finished rows are in {args.out}; rerun the same command to resume")
            return 130
    console.print(f"done: {counts['ok']} ok, {counts['wrong']} wrong, {counts['failed']} failed, "
                  f"{counts['skipped']} skipped, {counts['resumed']} already in {args.out}.")
    for row in runner.wrong:
        console.print(f"[red]wrong:[/red] {row['op']}/{row['workload']} {row['impl']} ({row['tier']}, "
                      f"{row['regime']}): {row.get('reason', '')}", highlight=False)
    _run_summary(out, workloads, console)
    console.print(f"`npuops report {args.out} --detail` shows every row; --op or --family picks some.", highlight=False)
    # A wrong kernel of ours fails the command; a wrong alternative is a finding about it.
    return 1 if any(row["tier"] == "ours" for row in runner.wrong) else 0


def _run_summary(path: Path, workloads, console: Console) -> None:
    """The report's summary (:mod:`npuops.summary`) of the rows of ``path`` for the workloads just
    run, those resumed from earlier runs included."""
    from .results import read_results
    from .summary import render_summary_terminal

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a malformed line is named by `npuops report`
        results = read_results(path)
    keys = {(w.op, w.id) for w in workloads}
    results.rows = [r for r in results.rows if (r["op"], r["workload"]) in keys]
    runs = {r.get("run_id") for r in results.rows}
    results.env = {run: env for run, env in results.env.items() if run in runs}
    if results.rows:
        console.print()
        render_summary_terminal(results, console)


# -- merge -----------------------------------------------------------------------------------------

def cmd_merge(args: argparse.Namespace, console: Console) -> int:
    from rich.markup import escape

    from .merge import merge_results, write_results

    inputs = [_input_file("results file", value) for value in args.inputs]
    out = _output_path("--output", args.output, create_parents=False)
    merged = merge_results(inputs, force=args.force)
    for line in merged.notes:
        console.print(f"[yellow]warning:[/yellow] {escape(line)}", highlight=False)
    write_results(out, merged.env, merged.rows)
    overlap = (f"; {merged.overlaps} row key(s) in several files, the latest finished kept"
               f" ({merged.differing} of them differed)" if merged.overlaps else "")
    console.print(f"merged {len(inputs)} files: {len(merged.rows)} rows, {len(merged.env)} env record"
                  f"{'s' if len(merged.env) != 1 else ''}"
                  f"{overlap} → {escape(args.output)}", highlight=False)
    return 0


# -- report ----------------------------------------------------------------------------------------

def cmd_report(args: argparse.Namespace, console: Console) -> int:
    from . import report
    from .results import Results, read_results

    families, ops = set(_split(args.family)), set(_split(args.op))

    def load(value: str) -> Results:
        path = _input_file("results file", value)
        if not path.exists():
            raise NpuopsError(f"results file {str(path)!r} does not exist; create it with `npuops run --out {path}`")
        results = read_results(path)  # a malformed line is skipped, with a warning naming it
        if families or ops:
            results.rows = [r for r in results.rows if (not families or r["family"] in families) and (not ops or r["op"] in ops)]
        if not results.rows:
            raise NpuopsError(f"results file {str(path)!r} holds no rows{' matching the filters' if families or ops else ''}")
        return results

    if args.against is not None and args.format == "html":
        raise NpuopsError("--against renders terminal, markdown, csv or json, not html")
    output = None
    if args.output is not None:
        output = _output_path("--output", args.output, create_parents=False,
                              example=f"report.{ {'markdown': 'md', 'terminal': 'txt'}.get(args.format, args.format) }")
    results = load(args.file)
    if args.against is not None:
        from . import compare

        comparison = compare.compare(results, load(args.against), args.file, args.against)
        if args.format == "terminal":
            compare.render_terminal(comparison, console, detail=bool(args.detail or families or ops))
            return 0
        text = {"markdown": compare.render_markdown, "csv": compare.render_csv, "json": compare.render_json}[args.format](comparison)
    elif args.format == "terminal":
        report.render_terminal(results, console, detail=bool(args.detail or families or ops))
        return 0
    else:
        render = {"markdown": report.render_markdown, "csv": report.render_csv, "json": report.render_json,
                  "html": report.render_html}[args.format]
        text = render(results)
    if output is not None:
        try:
            output.write_text(text)
        except OSError as exc:
            raise NpuopsError(f"--output {args.output!r} cannot be written: {exc.strerror or exc}") from None
        console.print(f"wrote {args.output}")
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


# -- plugins ---------------------------------------------------------------------------------------

def cmd_plugins(args: argparse.Namespace, console: Console) -> int:
    registry = _registry(args)
    if args.json:
        print(json.dumps([vars(p) for p in registry.plugins.values()], indent=1))
        return 0
    table = Table("plugin", "distribution", "version", "ops", "implementations", "devices", "status")
    for p in registry.plugins.values():
        status = "disabled" if p.disabled else f"[red]{len(p.errors)} error(s)[/red]" if p.errors else "[green]ok[/green]"
        table.add_row(p.name + (" (built-in)" if p.builtin else ""), p.distribution or "·", p.version or "·",
                      str(len(p.ops)), str(len(p.implementations)), ", ".join(p.devices) or "·", status)
    console.print(table)
    for error in registry.errors:
        console.print(f"[red]error:[/red] {error}")
    return 1 if registry.errors else 0


# -- calibrate -------------------------------------------------------------------------------------

def cmd_calibrate(args: argparse.Namespace, console: Console) -> int:
    from .calibrate import _cache_file, calibrate

    registry = _registry(args)
    device = registry.device(args.device)
    console.print(f"calibrating {device.name} ({device.describe().get('model')}) ...")
    try:
        limits = calibrate(device)
    except OSError as exc:  # the cache could not be written: the measurement is worth saying
        raise NpuopsError(f"cannot save the calibration to {str(_cache_file(device))!r}: {exc.strerror or exc}; "
                          "set NPUOPS_CACHE_DIR to a writable folder") from None
    datasheet = device.datasheet()
    console.print(f"copy bandwidth: {limits.copy_bandwidth / 1e9:.0f} GB/s"
                  + (f" (datasheet {datasheet.copy_bandwidth / 1e9:.0f})" if datasheet else ""))
    for dtype, rate in limits.flops.items():
        sheet = datasheet.flops.get(dtype) if datasheet else None
        console.print(f"matmul {dtype}: {rate / 1e12:.1f} TFLOP/s" + (f" (datasheet {sheet / 1e12:.0f})" if sheet else ""))
    console.print(f"saved to {_cache_file(device)}")
    return 0


# -- entry point -----------------------------------------------------------------------------------

def cmd_warm(args: argparse.Namespace, console: Console) -> int:
    from . import native
    from .functional import warm
    from .workload import load_workload_file

    registry = _registry(args)
    _warn_plugin_errors(registry, console)
    registry.device("cuda")  # our kernels are built on the GPU they run on: an error without one
    user = registry.add_workloads(load_workload_file(args.workloads)) if args.workloads else []
    workloads = user if args.workloads and not (args.family or args.op or args.workload) else _selection(registry, args)

    def progress(w, why):
        console.print(f"{w.key}: {'ok' if why is None else why}", highlight=False)

    counts = warm(workloads, progress)
    console.print(f"[bold]{counts.get('with a kernel', 0)} of {len(workloads)} workloads have our kernel, "
                  f"{counts['built']} kernels built or loaded[/bold] (TileLang's cache keeps them for later processes)")
    if counts.get("with a kernel"):
        why = native.state["why_not"]
        console.print("The functions' fast path reads tensors through torch's C++ objects "
                      f"({native.library_path().parent} keeps the library for later processes)" if why is None else
                      f"The functions' fast path reads tensors through Python's attributes: {why}", highlight=False)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="npuops", description="npuops: fast kernels, their baselines, honest benchmarks")
    parser.add_argument("--strict", action="store_true", help="fail on any plugin load error (also NPUOPS_STRICT=1)")
    parser.add_argument("--disable", action="append", help="plugin name(s) to skip (also NPUOPS_DISABLE_PLUGINS=a,b)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("list", help="families, ops, workloads and implementations")
    _add_filters(p)
    p.add_argument("--workloads", metavar="FILE", help="also list the workloads of a TOML/JSON file")
    p.add_argument("--json", action="store_true", help="one JSON array, a record per workload")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("run", help="verify and time implementations on workloads")
    _add_filters(p)
    p.add_argument("--impl", action="append", help="implementation name(s), e.g. torch_eager")
    p.add_argument("--device", help="cuda, cpu or npu (default: the best available)")
    p.add_argument("--regime", action="append", help=f"timing regime(s): {', '.join(REGIMES)} (default: both)")
    p.add_argument("--jobs", type=positive_int, default=1,
                   help="worker processes compiling in parallel (timing stays one at a time per device; with "
                        "--devices, the total of workers, at least one per device)")
    p.add_argument("--out", default=DEFAULT_RESULTS, help=f"results file, appended and resumed (default {DEFAULT_RESULTS})")
    p.add_argument("--workloads", metavar="FILE", help="run workloads from a TOML or JSON file")
    p.add_argument("--quick", action="store_true", help="one workload per op (the smallest)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--budget", type=positive_seconds, default=0.5, help="seconds per measurement before settling for an unstable median")
    p.add_argument("--timeout", type=positive_seconds, default=600.0, help="seconds per implementation-workload before it fails, naming the stage it reached")
    p.add_argument("--rerun", action="store_true", help="measure again rows the results file already has")
    p.add_argument("--tune", action="store_true",
                   help="for implementations with launch variants: check every variant, time each, measure the fastest "
                        "(where the graph regime is timed, near ties go to the least sum of both regimes)")
    p.add_argument("--kernel-time", action="store_true",
                   help="also record each measured call's device activity as the device's profiler reports it "
                        "(CUPTI on CUDA): first kernel start to last kernel end, no launch or event cost")
    p.add_argument("--shard", type=shard, metavar="I/N",
                   help="run only slice I of N of the planned rows (an implementation-workload pair with all its "
                        "regimes goes to one slice, pairs dealt round-robin in a stable hashed order): N machines "
                        "each run one slice, `npuops merge` joins their files")
    p.add_argument("--devices", type=devices, metavar="LIST",
                   help="time on several devices of one kind and model at once, e.g. cuda:0,cuda:1, or all: a timing "
                        "worker and a device lock per device, tasks to whichever device is free, one results file; "
                        "each row records its device_index (combines with --shard: one slice per machine)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("merge", help="join results files (the slices of a --shard run) into one")
    p.add_argument("inputs", nargs="+", metavar="FILE", help="results files (.jsonl or .jsonl.gz)")
    p.add_argument("-o", "--output", required=True, metavar="OUT",
                   help="merged results file, written whole or not at all (gzip if it ends with .gz); "
                        "it may be one of the inputs")
    p.add_argument("--force", action="store_true",
                   help="merge files of different git revisions or calibrations anyway")
    p.set_defaults(func=cmd_merge)

    p = sub.add_parser("report", help="render a results file")
    p.add_argument("file", nargs="?", default=DEFAULT_RESULTS, help=f"results file (default {DEFAULT_RESULTS})")
    p.add_argument("--format", choices=FORMATS, default="terminal")
    p.add_argument("--output", "-o", help="write to this file instead of stdout")
    p.add_argument("--family", action="append", help="only these families")
    p.add_argument("--op", action="append", help="only these ops")
    p.add_argument("--detail", action="store_true",
                   help="terminal: after the summary, a table per op and regime (--op and --family show them too)")
    p.add_argument("--against", metavar="BASELINE",
                   help="compare with this results file row by row: its time, FILE's, the speed-up (baseline / FILE), "
                        "status changes, rows of one file only (terminal: changed rows unless --detail)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("plugins", help="installed plugins, what each contributes, load errors")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plugins)

    p = sub.add_parser("warm", help="build our kernels for workloads ahead, so model code's first calls do not stall")
    _add_filters(p)
    p.add_argument("--workloads", metavar="FILE", help="the shapes your model calls, as a TOML/JSON workloads file")
    p.set_defaults(func=cmd_warm)

    p = sub.add_parser("calibrate", help="measure the device's copy bandwidth and matmul rates (cached for SOL)")
    p.add_argument("--device", help="cuda, cpu or npu (default: the best available)")
    p.set_defaults(func=cmd_calibrate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Bad input (a flag, a path, a name, a workload file) gets one line on stderr saying what is wrong
    and what would be right, and exit status 2; never a traceback."""
    args = build_parser().parse_args(argv)
    console = Console(stderr=False)
    with warnings.catch_warnings():
        warnings.showwarning = _one_line_warning
        try:
            return args.func(args, console)
        except NpuopsError as exc:
            _error(exc)
            return 2


def _error(exc: BaseException) -> None:
    from rich.markup import escape

    Console(stderr=True, soft_wrap=True).print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)


if __name__ == "__main__":
    sys.exit(main())
