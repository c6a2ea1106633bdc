"""The results file: JSON lines, appended and fsynced as each row finishes.

Two record kinds: ``{"record": "env", ...}`` once per run (device, versions, git revision, the
limits used for SOL) and ``{"record": "row", ...}`` per (workload, implementation, regime). A row's
key never repeats: a rerun skips keys already present, so an interrupted run resumes where it
stopped. A line cut short by a kill is ignored on reading and never glued to the next record.
A finished file may be kept gzip-compressed (``.gz``, as the committed benchmark results are): it
reads the same.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RowKey = tuple[str, str, str, str, str, str]


def row_key(row: dict[str, Any]) -> RowKey:
    return (row["op"], row["workload"], row["fingerprint"], row["impl"], row["regime"], row["device"])


@dataclass
class Results:
    env: dict[str, dict[str, Any]] = field(default_factory=dict)  # run_id -> env record
    rows: list[dict[str, Any]] = field(default_factory=list)
    skipped_lines: int = 0

    def keys(self) -> set[RowKey]:
        return {row_key(r) for r in self.rows}


def read_results(path: str | Path) -> Results:
    results = Results()
    path = Path(path)
    if not path.exists():
        return results
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            results.skipped_lines += 1  # a line cut short by an interrupt
            continue
        if record.get("record") == "env":
            results.env[record["run_id"]] = record
        elif record.get("record") == "row":
            results.rows.append(record)
    # Latest row per key wins, so a deliberate rerun (--rerun) replaces older rows in reports.
    latest: dict[RowKey, dict[str, Any]] = {}
    for row in results.rows:
        latest[row_key(row)] = row
    results.rows = list(latest.values())
    return results


class ResultsWriter:
    """Appends records durably: each is on disk before the next starts."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "ab")
        if self._file.tell() > 0:
            with open(self.path, "rb") as f:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":  # previous run was killed mid-line
                    self._file.write(b"\n")

    def append(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, sort_keys=True).encode() + b"\n")
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
