"""Files replaced whole or not at all: a reader, a kill or a full disk never meets one half written.

Each new file is written to a temporary file beside it (same folder, so same filesystem: the rename
is atomic), synced, then renamed over it. A set of files (a results file and the reports rendered
from it) is renamed only once every one of them is written and synced, so that a failure while
writing leaves the previous set as it was.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


@contextlib.contextmanager
def replaced(*paths: str | Path) -> Iterator[list[BinaryIO]]:
    """Binary files to write in place of ``paths``, in their order: when the block ends, each is
    synced and then each renamed over its path. An exception in the block or while writing removes
    the temporary files and leaves ``paths`` untouched; an OSError is raised as it is."""
    staged: list[tuple[BinaryIO, str]] = []
    try:
        for path in map(Path, paths):
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            staged.append((os.fdopen(fd, "wb"), tmp))
        yield [f for f, _ in staged]
        for f, tmp in staged:
            f.flush()
            os.fsync(f.fileno())
            f.close()
            os.chmod(tmp, 0o644)
        for (_, tmp), path in zip(staged, paths):
            os.replace(tmp, path)
    except BaseException:
        for f, tmp in staged:
            f.close()
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
