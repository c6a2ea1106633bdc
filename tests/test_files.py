"""npuops.files.replaced: a set of files replaced together once all are written, or not at all."""

from __future__ import annotations

import os
import stat

import pytest

from npuops import files
from npuops.files import replaced


def test_the_set_is_put_in_place_once_every_file_is_written(tmp_path):
    old, new = tmp_path / "old.jsonl.gz", tmp_path / "new.md"
    old.write_bytes(b"old")
    with replaced(old, new) as (first, second):
        first.write(b"first")
        second.write(b"second")
        assert old.read_bytes() == b"old" and not new.exists()  # nothing in place before the block ends
    assert (old.read_bytes(), new.read_bytes()) == (b"first", b"second")
    assert sorted(os.listdir(tmp_path)) == ["new.md", "old.jsonl.gz"]
    assert stat.S_IMODE(new.stat().st_mode) == 0o644


@pytest.mark.parametrize("failure", ["an interrupt in the block", "the disk, syncing the second file"])
def test_a_failure_leaves_every_file_as_it_was_and_no_temporary_file(tmp_path, monkeypatch, failure):
    paths = [tmp_path / "a", tmp_path / "b"]
    for path in paths:
        path.write_bytes(b"before")
    synced = []

    def fsync(fd):
        synced.append(fd)
        if len(synced) == 2:
            raise OSError(28, "No space left on device")

    if failure.startswith("the disk"):
        monkeypatch.setattr(files.os, "fsync", fsync)
    interrupted = failure.startswith("an interrupt")
    with pytest.raises(KeyboardInterrupt if interrupted else OSError), replaced(*paths) as staged:
        for f in staged:
            f.write(b"after")
        if interrupted:
            raise KeyboardInterrupt
    assert [path.read_bytes() for path in paths] == [b"before", b"before"]
    assert sorted(os.listdir(tmp_path)) == ["a", "b"]
