"""The results file: JSON lines, appended and fsynced as each row finishes.

Two record kinds: ``{"record": "env", ...}`` once per run (device, versions, git revision, the
limits used for SOL) and ``{"record": "row", ...}`` per (workload, implementation, regime). A row's
key never repeats: a rerun skips keys already present, so an interrupted run resumes where it
stopped. A line cut short by a kill is never glued to the next record.
A results file may be gzip-compressed (``.gz``, as the committed benchmark results are): it reads
the same, and a run appends to it each record as a gzip member of its own, so that the file stays
valid gzip however it is interrupted.

Reading trusts nothing: the file is read as a stream, line by line, each line at most MAX_LINE
bytes, and every record is checked (:func:`malformed`) before anything uses it. A malformed line
is skipped, named in one warning with its line number, and every good row is kept.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import stat
import subprocess
import warnings
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .errors import NpuopsError

RowKey = tuple[str, str, str, str, str, str]

MAX_LINE = 1 << 20  # bytes; the longest committed row is 28 KB (a tuning list): a longer line is no row of ours
STATUSES = ("ok", "wrong", "failed", "skipped")
# What the runner's key, the report's grouping and its sorting read from every row.
_ROW_TEXT = ("family", "op", "workload", "label", "dtype", "fingerprint", "impl", "tier", "regime", "device",
             "status", "compute_dtype")
_SHOWN_PROBLEMS = 3  # malformed lines named in the warning; the rest are counted


def row_key(row: dict[str, Any]) -> RowKey:
    return (row["op"], row["workload"], row["fingerprint"], row["impl"], row["regime"], row["device"])


@dataclass
class Results:
    env: dict[str, dict[str, Any]] = field(default_factory=dict)  # run_id -> env record
    rows: list[dict[str, Any]] = field(default_factory=list)
    skipped_lines: int = 0  # malformed lines, each skipped

    def keys(self) -> set[RowKey]:
        return {row_key(r) for r in self.rows}


def _positive(value: Any) -> bool:
    """A finite number above 0 (a JSON integer too large for a float is none)."""
    return _number(value) and value > 0


def _number(value: Any) -> bool:
    """A finite number of at least 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value) and value >= 0
    except OverflowError:  # an integer of hundreds of digits
        return False


def malformed(record: Any) -> str | None:
    """Why ``record`` is not one the runner and the report can use, or None: the one place that says
    what a valid record needs, so that a hand-edited or hostile line is skipped rather than met as a
    KeyError, a TypeError or a division by zero deep in a report. Times are finite positive numbers
    where present (None where absent), byte and FLOP counts finite and at least 0."""
    if not isinstance(record, dict):
        return "not a JSON object"
    kind = record.get("record")
    if kind == "env":
        if not isinstance(record.get("run_id"), str):
            return "'run_id' is missing or not text"
        for name in ("device", "versions"):
            if not isinstance(record.get(name, {}), dict):
                return f"{name!r} is not an object"
        limits = record.get("limits")
        if limits is not None and not (isinstance(limits, dict) and _positive(limits.get("copy_bandwidth"))
                                       and isinstance(limits.get("flops"), dict)
                                       and all(map(_positive, limits["flops"].values()))
                                       and isinstance(limits.get("source"), str)):
            return "'limits' is not {copy_bandwidth, flops, source} with finite positive rates"
        return None
    if kind != "row":
        return "neither an env nor a row record"
    for name in _ROW_TEXT:
        if not isinstance(record.get(name), str):
            return f"{name!r} is {'not text' if name in record else 'missing'}"
    if record["status"] not in STATUSES:
        return f"'status' is none of {', '.join(STATUSES)}"
    if not isinstance(record.get("run_id", ""), str):
        return "'run_id' is not text"
    for name in ("bytes", "flops"):
        if not _number(record.get(name)):
            return f"{name!r} is not a finite number of at least 0"
    timing = record.get("timing")
    if record["status"] == "ok" and not (isinstance(timing, dict) and _positive(timing.get("median_ms"))
                                         and _positive(timing.get("min_ms")) and _positive(timing.get("n"))):
        return "'timing' has no finite positive median_ms, min_ms and n"
    for name in ("kernel_time", "call_time"):  # absent, None, {"error": ...} or a median
        value = record.get(name) or {}
        if not isinstance(value, dict) or not (value.get("median_ms") is None or _positive(value["median_ms"])):
            return f"{name!r} is not an object with a finite positive median_ms"
    return None


def kernel_filesystem(path: str | Path) -> str | None:
    """The kernel filesystem (/proc, /sys) ``path`` lies in, or None: writes there are not files,
    and reads are not what was written (nor, at times, of any end)."""
    resolved = os.path.realpath(path)
    return next((root for root in ("/proc", "/sys") if resolved == root or resolved.startswith(root + "/")), None)


def _is_results_file(path: Path) -> bool:
    """Whether a results file is at ``path`` (False: none yet). Anything but a regular file is an
    error: a directory, a device (/dev/full and /dev/zero read without end) or a file of a kernel
    filesystem (/proc, /sys: neither what was written nor, at times, of any end)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise NpuopsError(f"results file {str(path)!r} cannot be reached: {exc.strerror or exc}") from None
    kernel = kernel_filesystem(path)
    if stat.S_ISREG(mode) and not kernel:
        return True
    what = "a directory" if stat.S_ISDIR(mode) else f"under {kernel}" if kernel else "a device, pipe or socket"
    raise NpuopsError(f"results file {str(path)!r} is {what}, not a regular file; name a file such as results.jsonl")


def _lines(f: IO[bytes]) -> Iterator[bytes | None]:
    """``f``'s lines, None for one longer than MAX_LINE, which is read past in pieces: no line,
    however long (a gzip bomb, a binary file), is ever held whole."""
    while line := f.readline(MAX_LINE + 1):
        if len(line) <= MAX_LINE or line.endswith(b"\n"):
            yield line
            continue
        while line and not line.endswith(b"\n"):
            line = f.readline(MAX_LINE)
        yield None


def _parse(line: bytes | None) -> tuple[Any, str | None]:
    """(record, None), or (None, why the line is malformed)."""
    if line is None:
        return None, f"longer than {MAX_LINE} bytes"
    try:
        record = json.loads(line.decode())
    except UnicodeDecodeError:
        return None, "not UTF-8 text"
    except (ValueError, RecursionError):  # RecursionError: thousands of nested brackets
        return None, "not JSON (cut short by a kill?)"
    return record, malformed(record)


def read_results(path: str | Path) -> Results:
    """The env records and the latest row per key of the results file at ``path`` (none where there
    is no file yet). Malformed lines are skipped, and one warning names the file, how many and the
    first few by line number; a .gz cut short or corrupt yields the rows before the damage."""
    results = Results()
    path = Path(path)
    if not _is_results_file(path):
        return results
    problems: list[str] = []

    def skip(number: int, why: str) -> None:
        results.skipped_lines += 1
        if len(problems) < _SHOWN_PROBLEMS:
            problems.append(f"line {number}: {why}")

    try:
        f = gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")
    except OSError as exc:
        raise NpuopsError(f"results file {str(path)!r} cannot be read: {exc.strerror or exc}") from None
    rows: list[dict[str, Any]] = []
    number = 0
    with f:
        try:
            for number, line in enumerate(_lines(f), 1):
                if line is not None and not line.strip():
                    continue
                record, why = _parse(line)
                if why:
                    skip(number, why)
                elif record["record"] == "env":
                    results.env[record["run_id"]] = record
                else:
                    rows.append(record)
        except (OSError, EOFError, zlib.error) as exc:  # gzip data cut short or corrupt; a failing disk
            skip(number + 1, f"unreadable from here on ({exc}); the rest of the file is skipped")
    if results.skipped_lines:
        more = results.skipped_lines - len(problems)
        warnings.warn(f"npuops: results file {str(path)!r}: skipped {results.skipped_lines} malformed "
                      f"line{'s' if results.skipped_lines > 1 else ''} ({'; '.join(problems)}"
                      f"{f'; {more} more' if more else ''}); good rows read: {len(rows)}",
                      RuntimeWarning, stacklevel=2)
    # Latest row per key wins, so a deliberate rerun (--rerun) replaces older rows in reports.
    results.rows = list({row_key(row): row for row in rows}.values())
    return results


class ResultsWriter:
    """Appends records durably: each is on disk before the next starts. To a .gz file each record
    goes as a gzip member of its own (gzip readers take concatenated members for one stream), so
    the file is valid gzip between any two records, and never gets plain bytes."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.compressed = self.path.suffix == ".gz"
        try:
            _is_results_file(self.path)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a+b")  # appends, whatever was read
        except OSError as exc:
            raise NpuopsError(f"results file {str(self.path)!r} cannot be written: {exc.strerror or exc}") from None
        if self.compressed:
            self._drop_torn_member()
        elif self._file.seek(0, os.SEEK_END) > 0:
            self._file.seek(-1, os.SEEK_END)
            if self._file.read(1) != b"\n":  # previous run was killed mid-line
                self._file.write(b"\n")

    def _drop_torn_member(self) -> None:
        """Cuts the file after its last complete gzip member: a member after it was cut short (a
        kill, a full disk), and appending behind it would make the file unreadable from there on.
        Bytes that are no gzip at all are not ours to drop: that is an error."""
        end = offset = 0  # where the last complete member ends; how far the scan has read
        member = zlib.decompressobj(wbits=31)  # 31: one gzip member, trailer (CRC, size) checked
        self._file.seek(0)
        while data := self._file.read(1 << 13):
            while data:
                try:
                    member.decompress(data)  # at most ~8 MiB from 8 KiB, thrown away
                except zlib.error:
                    self._file.close()
                    raise NpuopsError(f"results file {str(self.path)!r} is not gzip data after byte {end}; appending "
                                      "would bury it: move the file aside (`npuops report` reads what it can)") from None
                offset += len(data) - len(member.unused_data)
                if not member.eof:
                    break
                end, data, member = offset, member.unused_data, zlib.decompressobj(wbits=31)
        if end < offset:
            self._file.truncate(end)

    def append(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, sort_keys=True).encode() + b"\n"
        self._file.write(gzip.compress(line, mtime=0) if self.compressed else line)
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> ResultsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def git_revision(cwd: str | Path | None = None) -> str | None:
    """The checkout's revision; NPUOPS_GIT_REVISION names it where the tree was copied without
    its .git (a remote GPU machine)."""
    if os.environ.get("NPUOPS_GIT_REVISION"):
        return os.environ["NPUOPS_GIT_REVISION"]
    try:
        rev = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd, capture_output=True, text=True, timeout=5)
        return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None
