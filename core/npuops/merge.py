"""``npuops merge``: results files (the slices of ``npuops run --shard I/N`` run on N machines, or
any runs) joined into one.

Every row is kept once, by the runner's key (:func:`npuops.results.row_key`). Where several files
hold a key, the row that finished latest (its ``finished`` time) is kept, as a rerun's row replaces
an older one in a file; a row without a readable time counts as oldest, and between equal times
the file named later wins. Every env record is kept (once per run id). Files of different git
revisions or calibrations (the env records' ``git`` and ``limits``) measure different things: they
are refused unless forced. The output is written whole or not at all (:mod:`npuops.files`).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

from .errors import NpuopsError
from .files import replaced
from .results import RowKey, read_results, row_key

_OLDEST = datetime.min.replace(tzinfo=UTC)


@dataclass
class Merged:
    env: dict[str, dict[str, Any]] = field(default_factory=dict)  # run_id -> env record
    rows: list[dict[str, Any]] = field(default_factory=list)
    overlaps: int = 0  # row keys found in more than one file
    differing: int = 0  # of those, keys whose rows were not identical
    notes: list[str] = field(default_factory=list)  # what a user should hear (a forced mismatch, a missing shard)


def _finished(row: dict[str, Any]) -> datetime:
    try:
        return datetime.strptime(str(row.get("finished")), "%Y-%m-%dT%H:%M:%S%z")
    except ValueError:
        return _OLDEST


def _calibration(limits: Any) -> str:
    """A short, distinct name for an env record's limits."""
    if not limits:
        return "none"
    digest = hashlib.sha256(json.dumps(limits, sort_keys=True).encode()).hexdigest()[:6]
    return f"{limits.get('source', '?')} [{digest}]"


def _differences(what: str, per_file: dict[str, set[str]]) -> str | None:
    """One clause naming each value and the files holding it, where the files hold more than one."""
    files: dict[str, list[str]] = {}
    for name, values in per_file.items():
        for value in sorted(values):
            files.setdefault(value, []).append(name)
    if len(files) <= 1:
        return None
    return f"{what}: " + "; ".join(f"{value} in {', '.join(names)}" for value, names in files.items())


def merge_results(paths: Sequence[str | Path], force: bool = False) -> Merged:
    """The rows and env records of ``paths`` merged (see the module's docstring). Malformed lines are
    skipped with the reader's warning. Raises NpuopsError for a file that is missing or holds no
    record (nothing `npuops run` wrote), and where the files' revisions or calibrations differ,
    unless ``force``."""
    merged = Merged()
    found: dict[RowKey, list[dict[str, Any]]] = {}  # every file's row of each key, in input order
    revisions: dict[str, set[str]] = {}
    calibrations: dict[str, set[str]] = {}
    shards: set[str] = set()
    for number, path in enumerate(paths, 1):
        if not Path(path).exists():
            raise NpuopsError(f"results file {str(path)!r} does not exist; name the files `npuops run --out` wrote")
        results = read_results(path)
        if not results.env and not results.rows:
            lines = results.skipped_lines
            what = f"{lines} malformed line{'s' * (lines != 1)}" if lines else "it is empty"
            raise NpuopsError(f"results file {str(path)!r} holds no records ({what}): not a file `npuops run --out` wrote")
        name = str(path) if str(path) not in revisions else f"{path} (input {number})"
        revisions[name] = {str(env.get("git") or "unknown") for env in results.env.values()}
        calibrations[name] = {_calibration(env.get("limits")) for env in results.env.values()}
        for run_id, env in results.env.items():
            merged.env.setdefault(run_id, env)
            if isinstance(env.get("shard"), str):
                shards.add(env["shard"])
        for row in results.rows:
            found.setdefault(row_key(row), []).append(row)
    revision, calibration = _differences("git revision", revisions), _differences("calibration", calibrations)
    if revision or calibration:
        message = f"inputs differ in {' and in '.join(d for d in (revision, calibration) if d)}"
        if not force:
            fix = " and ".join(["run every slice at one revision"] * bool(revision) + [
                "copy one calibration cache (`npuops calibrate`, NPUOPS_CACHE_DIR) to every machine"] * bool(calibration))
            raise NpuopsError(f"{message}; {fix}, or pass --force to merge them anyway")
        merged.notes.append(f"{message} (merged anyway: --force)")
    merged.notes += _missing_shards(shards)
    for versions in found.values():
        kept = versions[0]
        for row in versions[1:]:
            if _finished(row) >= _finished(kept):  # a tie goes to the file named later
                kept = row
        merged.rows.append(kept)
        if len(versions) > 1:
            merged.overlaps += 1
            merged.differing += any(row != versions[0] for row in versions[1:])
    return merged


def _missing_shards(shards: Iterable[str]) -> list[str]:
    """A note per slice count whose slices are not all among the inputs' runs."""
    by_count: dict[int, set[int]] = {}
    for text in shards:
        try:
            index, count = (int(part) for part in text.split("/"))
        except ValueError:
            continue
        by_count.setdefault(count, set()).add(index)
    notes = []
    for count, present in sorted(by_count.items()):
        missing = sorted(set(range(1, count + 1)) - present)
        if missing:
            notes.append(f"no run of shard {', '.join(f'{i}/{count}' for i in missing)} is among the inputs: "
                         "their rows are missing")
    return notes


def write_records(f: BinaryIO, env: dict[str, dict[str, Any]], rows: Iterable[dict[str, Any]], compressed: bool) -> None:
    """The env records, then the rows, as a results file into ``f``: gzip with no name and time in
    its header where ``compressed`` (the bytes depend on the records alone, as ``gzip -9n``'s do)."""
    with gzip.GzipFile(fileobj=f, mode="wb", mtime=0) if compressed else contextlib.nullcontext(f) as out:
        for record in [*env.values(), *rows]:
            out.write(json.dumps(record, sort_keys=True).encode() + b"\n")


def write_results(path: str | Path, env: dict[str, dict[str, Any]], rows: Iterable[dict[str, Any]]) -> None:
    """:func:`write_records` as a results file at ``path`` (gzip if it ends with .gz), written whole
    or not at all (:func:`npuops.files.replaced`)."""
    path = Path(path)
    try:
        with replaced(path) as (f,):
            write_records(f, env, rows, compressed=path.suffix == ".gz")
    except OSError as exc:
        raise NpuopsError(f"{str(path)!r} cannot be written: {exc.strerror or exc}") from None
