"""The results file as a careless user and a hostile file meet it: a malformed line costs only
itself (skipped, named in one warning), a .gz file stays valid gzip when resumed or interrupted, a
path that is no regular file is refused in one line, and reading holds one bounded line at a time."""

from __future__ import annotations

import gzip
import json
import tracemalloc
import warnings

import pytest

from npuops.cli import main
from npuops.errors import NpuopsError
from npuops.results import MAX_LINE, ResultsWriter, read_results

ENV = {"record": "env", "run_id": "r1", "device": {"device": "cuda"}, "versions": {},
       "limits": {"copy_bandwidth": 4e12, "flops": {"bf16": 800e12}, "source": "test"}}


def row(workload="W1", **extra):
    return {"record": "row", "run_id": "r1", "family": "norm", "op": "RMSNormFwd", "workload": workload,
            "label": "decode", "dtype": "bf16", "fingerprint": "f", "source": "catalog", "impl": "ours_kernel",
            "tier": "ours", "plugin": "p", "regime": "eager", "device": "cuda", "bytes": 4_000_000, "flops": 0,
            "compute_dtype": "bf16", "status": "ok",
            "timing": {"median_ms": 0.002, "min_ms": 0.0019, "q1_ms": 0.002, "q3_ms": 0.002, "n": 50,
                       "stable": True, "hold_us": None, "clock_mhz": None}, **extra}


def line(record) -> bytes:
    return json.dumps(record).encode() + b"\n"


def read_warning(path):
    """(results, the one warning read_results gave, or None)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = read_results(path)
    assert len(caught) <= 1, [str(w.message) for w in caught]
    return results, str(caught[0].message) if caught else None


BAD_LINES = {
    "a JSON list": b"[1, 2]",
    "a JSON number": b"42",
    "a record of no known kind": b'{"record": "probe", "ms": 1}',
    "a row without its key fields": line({"record": "row", "status": "ok"}),
    "an env without a run id": line({**ENV, "run_id": None}),
    "an env with limits of zero bandwidth": line({**ENV, "limits": {**ENV["limits"], "copy_bandwidth": 0}}),
    "a non-UTF-8 byte": line(row(label="x")).replace(b'"x"', b'"\xff"'),
    "a median of text": line(row(timing={**row()["timing"], "median_ms": "fast"})),
    "a median of 0": line(row(timing={**row()["timing"], "median_ms": 0})),
    "a negative median": line(row(timing={**row()["timing"], "median_ms": -1.0})),
    "a NaN median": line(row()).replace(b'"median_ms": 0.002', b'"median_ms": NaN'),
    "an infinite median": line(row()).replace(b'"median_ms": 0.002', b'"median_ms": Infinity'),
    "an ok row without timing": line({k: v for k, v in row().items() if k != "timing"}),
    "FLOPs past any float": line(row()).replace(b'"flops": 0', b'"flops": 1' + b"0" * 400),
    "a kernel time of text": line(row(kernel_time="fast")),
    "an unknown status": line(row(status="great")),
    "a key field that is a list": line(row(workload=["W1"])),
    "thousands of nested brackets": b"[" * 100_000,
    "a line cut short by a kill": line(row())[:40],
    "a line longer than MAX_LINE": b'{"x": "' + b"y" * MAX_LINE + b'"}',
}


@pytest.mark.parametrize("bad", BAD_LINES.values(), ids=BAD_LINES.keys())
def test_a_malformed_line_is_skipped_with_a_warning_naming_file_and_line(tmp_path, bad):
    path = tmp_path / "r.jsonl"
    path.write_bytes(line(ENV) + line(row("W1")) + bad.rstrip(b"\n") + b"\n" + line(row("W2")))
    results, warning = read_warning(path)
    assert [r["workload"] for r in results.rows] == ["W1", "W2"] and results.skipped_lines == 1
    assert str(path) in warning and "skipped 1 malformed line (line 3: " in warning and "good rows read: 2" in warning


def test_many_malformed_lines_make_one_warning_with_the_first_few(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"".join([b"nonsense\n"] * 50 + [line(row())]))
    results, warning = read_warning(path)
    assert len(results.rows) == 1 and results.skipped_lines == 50
    assert "skipped 50 malformed lines (line 1: not JSON" in warning and "line 3: " in warning
    assert "line 4:" not in warning and "47 more" in warning


def test_report_reads_past_malformed_lines(capsys, tmp_path):
    """What the user sees: one warning line naming the file, then the report of the good rows."""
    path = tmp_path / "r.jsonl"
    path.write_bytes(line(ENV) + b'"just a string"\n' + line(row()) + line(row(label="x")).replace(b'"x"', b'"\xff"'))
    with warnings.catch_warnings(record=True) as caught:  # the CLI may print it itself, on stderr
        warnings.simplefilter("always")
        assert main(["report", str(path), "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert [r["workload"] for r in json.loads(out)] == ["W1"]
    shown = err + "".join(str(w.message) for w in caught)
    assert shown.count(str(path)) == 1 and "line 2: not a JSON object; line 4: not UTF-8 text" in shown


def test_a_truncated_gz_keeps_the_rows_before_the_cut(tmp_path):
    data = gzip.compress(b"".join(line(row(f"W{i}")) for i in range(200)))
    path = tmp_path / "r.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    results, warning = read_warning(path)
    assert 0 < len(results.rows) < 200 and "unreadable from here on" in warning and str(path) in warning


def test_resuming_a_gz_file_keeps_it_valid_gzip_with_old_and_new_rows(tmp_path):
    """A committed file is one gzip member; a run appends each record as a member of its own. A
    run with nothing to do leaves the file as it was."""
    path = tmp_path / "r.jsonl.gz"
    path.write_bytes(gzip.compress(line(ENV) + line(row("W1"))))
    before = path.read_bytes()
    with ResultsWriter(path):
        pass
    assert path.read_bytes() == before
    with ResultsWriter(path) as w:
        w.append({**ENV, "run_id": "r2"})
        w.append(row("W2", run_id="r2"))
    records = [json.loads(x) for x in gzip.decompress(path.read_bytes()).splitlines()]
    assert [r.get("workload") for r in records] == [None, "W1", None, "W2"]
    results, warning = read_warning(path)
    assert warning is None and sorted(results.env) == ["r1", "r2"] and len(results.rows) == 2


def test_a_torn_last_gz_member_is_read_past_and_dropped_on_resuming(tmp_path):
    """A run killed while writing a member leaves it cut short: reading keeps every row before it
    (with a warning), and the next run cuts it off before appending, so the file reads clean."""
    path = tmp_path / "r.jsonl.gz"
    with ResultsWriter(path) as w:
        w.append(ENV)
        w.append(row("W1"))
    whole = path.read_bytes()
    for cut in (1, 5, 15, 40):  # inside the header, and inside the deflate data
        path.write_bytes(whole + gzip.compress(line(row("W2")))[:cut])
        results, warning = read_warning(path)
        assert [r["workload"] for r in results.rows] == ["W1"] and "line 3: unreadable" in warning
        with ResultsWriter(path) as w:
            w.append(row("W3"))
        results, warning = read_warning(path)
        assert warning is None and [r["workload"] for r in results.rows] == ["W1", "W3"]
        path.write_bytes(whole)


def test_a_gz_file_with_plain_bytes_appended_is_refused_for_writing_and_read_up_to_them(tmp_path):
    """What an npuops before this fix left: plain lines after the gzip data. Appending behind them
    would bury them; dropping them would lose them."""
    path = tmp_path / "r.jsonl.gz"
    path.write_bytes(gzip.compress(line(ENV) + line(row("W1"))) + b"\n" + line(row("W2")))
    before = path.read_bytes()
    with pytest.raises(NpuopsError, match="not gzip data after byte"):
        ResultsWriter(path)
    assert path.read_bytes() == before
    results, warning = read_warning(path)
    assert [r["workload"] for r in results.rows] == ["W1"] and "line 3: unreadable" in warning


def test_a_run_resumes_into_a_gz_file(toy, tmp_path):
    from npuops.registry import load_registry
    from npuops.runner import Runner, RunOptions
    from npuops.timing import TimingOptions

    fast = TimingOptions(budget_s=0.05, min_reps=3, warmup_s=0.01)
    path = tmp_path / "r.jsonl.gz"

    def run():
        registry = load_registry()
        options = RunOptions(device="cpu", timing=fast, tuning_timing=fast, regimes=("eager",))
        return Runner(registry, options, path).run(registry.workloads("ToyScaleFwd")[:1], ["toy_ours"])

    assert run()["ok"] == 1
    first = path.read_bytes()
    assert run()["resumed"] == 1 and path.read_bytes() == first  # nothing to do: nothing written
    results, warning = read_warning(path)
    assert warning is None and len(results.rows) == 1 and gzip.decompress(first).count(b"\n") == 2


@pytest.mark.parametrize("where", ["/dev/full", "a directory", "/proc/self/status"])
def test_a_path_that_is_no_regular_file_is_refused_in_one_line(capsys, tmp_path, where):
    path = tmp_path if where == "a directory" else where
    with pytest.raises(NpuopsError, match="not a regular file"):
        read_results(path)
    with pytest.raises(NpuopsError, match="not a regular file"):
        ResultsWriter(path)
    assert main(["report", str(path)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert err.startswith("error: ") and "Traceback" not in err


def _bomb(path, member: bytes, members: int, tail: bytes) -> None:
    """``members`` gzip members of ``member`` each, then ``tail``: 1 MiB members make a file of a
    few hundred KB that decompresses to ``members`` MiB."""
    packed = gzip.compress(member, compresslevel=9)
    with open(path, "wb") as f:
        for _ in range(members):
            f.write(packed)
        f.write(gzip.compress(tail))


@pytest.mark.parametrize("member", [b"x" * (1 << 20), (b"y" * 65535 + b"\n") * 16], ids=["one giant line", "many lines"])
def test_a_gzip_bomb_is_read_in_bounded_memory(tmp_path, member):
    """256 MiB of decompressed data, read (and scanned for resuming) holding a few MiB."""
    path = tmp_path / "bomb.jsonl.gz"
    _bomb(path, member, 256, b"\n" + line(row()))
    assert path.stat().st_size < 2 << 20
    tracemalloc.start()
    try:
        results, warning = read_warning(path)
        ResultsWriter(path).close()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(results.rows) == 1 and "malformed" in warning
    assert peak < 24 << 20, f"peak {peak / 2**20:.0f} MiB"
