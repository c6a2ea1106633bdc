"""`npuops merge`: every row once (the latest finished where files overlap), every env record, files
of different revisions or calibrations refused unless --force, the output whole or not at all."""

from __future__ import annotations

import gzip
import json
import os

import pytest

from npuops import merge
from npuops.cli import main
from npuops.errors import NpuopsError
from npuops.merge import merge_results, write_results
from npuops.results import read_results, row_key

LIMITS = {"copy_bandwidth": 4e12, "flops": {"bf16": 800e12}, "source": "calibrated 2025-01-01"}


def env(run_id, git="abc123", limits=LIMITS, **extra):
    return {"record": "env", "run_id": run_id, "device": {"device": "cuda"}, "versions": {}, "git": git,
            "limits": limits, **extra}


def row(workload, run_id, finished="2025-01-01T10:00:00+0000", median_ms=0.002, impl="ours_kernel", **extra):
    return {"record": "row", "run_id": run_id, "family": "norm", "op": "RMSNormFwd", "workload": workload,
            "label": "decode", "dtype": "bf16", "fingerprint": "f", "source": "catalog", "impl": impl,
            "tier": "ours", "plugin": "p", "regime": "eager", "device": "cuda", "bytes": 4_000_000, "flops": 0,
            "compute_dtype": "bf16", "status": "ok", "finished": finished,
            "timing": {"median_ms": median_ms, "min_ms": median_ms, "n": 50}, **extra}


def write(path, *records, garbage=b""):
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in records) + garbage)
    return path


def one_line(capsys, *argv):
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, " ".join(out.split()), err


def test_every_row_once_the_latest_finished_kept_and_every_env(tmp_path, capsys):
    a = write(tmp_path / "a.jsonl", env("r1"), row("W1", "r1"), row("W2", "r1", finished="2025-01-01T12:00:00+0000"))
    b = write(tmp_path / "b.jsonl", env("r2"), row("W2", "r2", finished="2025-01-01T11:00:00+0000", median_ms=0.5),
              row("W3", "r2"))
    # Same key, later in another file and in another time zone: 13:30+0200 is 11:30 UTC, before 12:00 UTC.
    c = write(tmp_path / "c.jsonl", env("r3"), row("W1", "r3", finished="2025-01-01T13:30:00+0200", median_ms=0.7),
              row("W1", "r3", impl="torch_eager"))
    merged = merge_results([a, b, c])
    by = {(r["workload"], r["impl"]): r for r in merged.rows}
    assert len(merged.rows) == len({row_key(r) for r in merged.rows}) == 4
    assert by[("W2", "ours_kernel")]["run_id"] == "r1"  # a's finished later than b's
    assert by[("W1", "ours_kernel")]["run_id"] == "r3"  # 11:30 UTC beats 10:00 UTC
    assert merged.overlaps == 2 and merged.differing == 2
    assert set(merged.env) == {"r1", "r2", "r3"}

    code, out, _ = one_line(capsys, "merge", str(a), str(b), str(c), "-o", str(tmp_path / "out.jsonl"))
    assert code == 0 and "4 rows, 3 env records; 2 row key(s) in several files, the latest finished kept" in out
    back = read_results(tmp_path / "out.jsonl")
    assert back.keys() == {row_key(r) for r in merged.rows} and set(back.env) == {"r1", "r2", "r3"}


def test_a_tie_goes_to_the_file_named_later_and_identical_copies_count_as_overlaps(tmp_path):
    a = write(tmp_path / "a.jsonl", env("r1"), row("W1", "r1"))
    b = write(tmp_path / "b.jsonl", env("r2"), row("W1", "r2"))
    assert merge_results([a, b]).rows[0]["run_id"] == "r2"
    assert merge_results([b, a]).rows[0]["run_id"] == "r1"
    same = merge_results([a, a])
    assert (len(same.rows), same.overlaps, same.differing) == (1, 1, 0)


@pytest.mark.parametrize("other, differs", [
    (env("r2", git="def456"), "git revision: abc123 in {a}; def456 in {b}"),
    (env("r2", limits={**LIMITS, "copy_bandwidth": 3e12}), "calibration: calibrated 2025-01-01 ["),
    (env("r2", limits=None), "calibration: "),
])
def test_files_of_different_revisions_or_calibrations_are_refused_unless_forced(tmp_path, capsys, other, differs):
    a = write(tmp_path / "a.jsonl", env("r1"), row("W1", "r1"))
    b = write(tmp_path / "b.jsonl", other, row("W2", "r2"))
    out = tmp_path / "out.jsonl"
    code, _, err = one_line(capsys, "merge", str(a), str(b), "-o", str(out))
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert differs.format(a=a, b=b) in err and "--force" in err and str(a) in err and str(b) in err
    assert not out.exists() or out.read_bytes() == b""  # nothing merged
    code, text, _ = one_line(capsys, "merge", str(a), str(b), "-o", str(out), "--force")
    assert code == 0 and "merged anyway: --force" in text
    assert len(read_results(out).rows) == 2


def test_gzip_output_when_it_ends_with_gz_and_out_may_be_an_input(tmp_path, capsys):
    a = write(tmp_path / "a.jsonl", env("r1"), row("W1", "r1"))
    out = tmp_path / "all.jsonl.gz"
    with gzip.open(out, "wb") as f:
        f.write(json.dumps(env("r0")).encode() + b"\n" + json.dumps(row("W0", "r0")).encode() + b"\n")
    code, _, _ = one_line(capsys, "merge", str(out), str(a), "-o", str(out))
    assert code == 0 and out.read_bytes()[:2] == b"\x1f\x8b"
    back = read_results(out)
    assert {r["workload"] for r in back.rows} == {"W0", "W1"} and set(back.env) == {"r0", "r1"}
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_malformed_lines_are_skipped_with_the_reader_s_warning(tmp_path, capsys):
    a = write(tmp_path / "a.jsonl", env("r1"), row("W1", "r1"), garbage=b'{"record": "row", "op": "RMSN\n[1, 2]\n')
    b = write(tmp_path / "b.jsonl", env("r2"), row("W2", "r2"), garbage=b"\xff\xfe not json\n")
    code, out, err = one_line(capsys, "merge", str(a), str(b), "-o", str(tmp_path / "out.jsonl"))
    assert code == 0 and "2 rows" in out and "Traceback" not in err
    assert "skipped 2 malformed lines" in " ".join(err.split()) and "skipped 1 malformed line" in " ".join(err.split())
    assert len(read_results(tmp_path / "out.jsonl").rows) == 2


def test_an_interrupted_merge_leaves_the_old_output_and_no_temporary_file(tmp_path, monkeypatch):
    out = write(tmp_path / "out.jsonl", env("r0"), row("W0", "r0"))
    before = out.read_bytes()
    a = write(tmp_path / "a.jsonl", env("r1"), *(row(f"W{i}", "r1") for i in range(1, 50)))
    merged = merge_results([a])
    calls = []

    def dumps(record, **kwargs):
        calls.append(record)
        if len(calls) == 20:
            raise KeyboardInterrupt
        return json.dumps(record, **kwargs)

    monkeypatch.setattr(merge.json, "dumps", dumps)
    with pytest.raises(KeyboardInterrupt):
        write_results(out, merged.env, merged.rows)
    assert out.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["a.jsonl", "out.jsonl"]


@pytest.mark.parametrize("argv, message", [
    (["merge", "missing.jsonl", "-o", "out.jsonl"], "results file 'missing.jsonl' does not exist"),
    (["merge", "{dir}", "-o", "out.jsonl"], "is a folder"),
    (["merge", "{a}", "-o", "{dir}"], "--output"),
    (["merge", "{a}", "{empty}", "-o", "out.jsonl"], "results file '{empty}' holds no records (it is empty)"),
])
def test_bad_inputs_get_one_line(tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    a = write(tmp_path / "a.jsonl", env("r1"), row("W1", "r1"))
    (tmp_path / "d").mkdir()
    empty = write(tmp_path / "empty.jsonl")
    argv = [v.format(a=a, dir=tmp_path / "d", empty=empty) for v in argv]
    code, _, err = one_line(capsys, *argv)
    assert code == 2 and err.count("\n") == 1 and message.format(empty=empty) in err
    assert not (tmp_path / "out.jsonl").exists()


def test_a_file_of_no_records_is_refused_after_the_reader_s_warning(tmp_path, capsys):
    a = write(tmp_path / "a.jsonl", env("r1"), row("W1", "r1"))
    garbage = write(tmp_path / "garbage.jsonl", garbage=b"\x89PNG\x00\n\xff\xfe\n")
    code, _, err = one_line(capsys, "merge", str(a), str(garbage), "-o", str(tmp_path / "out.jsonl"))
    assert code == 2 and "Traceback" not in err and not (tmp_path / "out.jsonl").exists()
    assert err.splitlines()[-1].endswith(f"results file '{garbage}' holds no records (2 malformed lines): not a file "
                                         "`npuops run --out` wrote")


def test_merge_results_raises_for_mismatches_without_the_cli(tmp_path):
    a = write(tmp_path / "a.jsonl", env("r1"), row("W1", "r1"))
    b = write(tmp_path / "b.jsonl", env("r2", git=None), row("W2", "r2"))
    with pytest.raises(NpuopsError, match="unknown in"):
        merge_results([a, b])
    assert len(merge_results([a, b], force=True).rows) == 2
