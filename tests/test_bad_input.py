"""Issue 43, "nothing lost, nothing cryptic": bad flags, paths and caches get one line saying what is
wrong and what would be right, exit status 2, never a traceback."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import warnings

import pytest

from npuops.cli import main


def one_line_error(capsys, *argv: str) -> str:
    """Run the CLI, assert exit status 2 and exactly one line on stderr, no traceback; return it."""
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's errors
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and "Traceback" not in out + err, err
    return err


# -- flags ----------------------------------------------------------------------------------------

# Should a check regress, the run it lets through stays one toy row, not the whole catalog.
TOY_RUN = ("run", "--op", "ToyScaleFwd", "--workload", "W1", "--impl", "toy_ours", "--regime", "eager",
           "--device", "cpu", "--no-progress")


@pytest.mark.parametrize("flag, value, expected", [
    ("--jobs", "0", "argument --jobs: expected a whole number of at least 1, got '0'"),
    ("--jobs", "-1", "argument --jobs: expected a whole number of at least 1, got '-1'"),
    ("--jobs", "two", "argument --jobs: expected a whole number of at least 1, got 'two'"),
    ("--timeout", "-5", "argument --timeout: expected a finite number of seconds above 0, got '-5'"),
    ("--timeout", "0", "argument --timeout: expected a finite number of seconds above 0, got '0'"),
    ("--timeout", "nan", "argument --timeout: expected a finite number of seconds above 0, got 'nan'"),
    ("--budget", "-1", "argument --budget: expected a finite number of seconds above 0, got '-1'"),
    ("--budget", "inf", "argument --budget: expected a finite number of seconds above 0, got 'inf'"),
])
def test_bad_numeric_flags_are_refused_up_front(capsys, toy, tmp_path, flag, value, expected):
    out = tmp_path / "r.jsonl"
    err = one_line_error(capsys, *TOY_RUN, "--out", str(out), f"{flag}={value}")
    assert expected in err and "npuops run --help" in err
    assert not out.exists()  # nothing ran, nothing was recorded as done


# -- paths ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("out, expected", [
    ("{tmp}", "is a folder; name a file in it, e.g."),
    ("", "--out is empty; name a file"),
    ("/sys/npuops-results.jsonl", "is under /sys, a kernel filesystem"),
    ("/proc/self/npuops-results.jsonl", "is under /proc, a kernel filesystem"),
    ("{tmp}/a-file/r.jsonl", "is a file, not a folder"),
])
def test_bad_out_paths(capsys, toy, tmp_path, out, expected):
    (tmp_path / "a-file").write_text("x")
    err = one_line_error(capsys, *TOY_RUN, "--out", out.format(tmp=tmp_path))
    assert expected in err


def _unwritable(path) -> None:
    """Make ``path`` a file this process cannot append to: immutable as root, read-only otherwise."""
    path.write_text("")
    if os.geteuid() == 0:
        if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode:
            pytest.skip("root, and chattr +i is not available on this filesystem")
    else:
        path.chmod(0o444)


def test_an_unwritable_out_file(capsys, toy, tmp_path):
    path = tmp_path / "r.jsonl"
    _unwritable(path)
    try:
        err = one_line_error(capsys, *TOY_RUN, "--out", str(path))
        assert f"--out '{path}' cannot be written" in err
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(path)], capture_output=True)


def test_a_second_run_on_one_results_file_refuses(capsys, toy, tmp_path):
    path = tmp_path / "r.jsonl"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)  # a first run holding the file
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        err = one_line_error(capsys, *TOY_RUN, "--out", str(path))
        assert f"another `npuops run` is writing '{path}'" in err and "another --out" in err
    finally:
        os.close(fd)
    assert path.read_text() == ""  # the refused run measured and wrote nothing


@pytest.fixture
def results_file(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"record": "env", "run_id": "x"}) + "\n")
    return path


@pytest.mark.parametrize("argv, expected", [
    (["report", "{tmp}"], "results file '{tmp}' is a folder; give a file"),
    (["report", "{results}", "-o", "{tmp}/missing/report.md", "--format", "markdown"],
     "folder '{tmp}/missing' does not exist; create it or name another file"),
    (["report", "{results}", "-o", "{tmp}", "--format", "html"], "is a folder; name a file in it, e.g. {tmp}/report.html"),
    (["report", "{results}", "-o", "/proc/self/report.md", "--format", "markdown"], "is under /proc"),
])
def test_bad_report_paths(capsys, tmp_path, results_file, argv, expected):
    names = {"tmp": tmp_path, "results": results_file}
    err = one_line_error(capsys, *[a.format(**names) for a in argv])
    assert expected.format(**names) in " ".join(err.split())


@pytest.mark.parametrize("content", [bytes(range(256)) * 4, b"\x1f\x8b\x08\x00garbage"])
def test_a_binary_results_file(capsys, tmp_path, content):
    path = tmp_path / ("r.jsonl.gz" if content.startswith(b"\x1f\x8b") else "r.jsonl")
    path.write_bytes(content)
    code = main(["report", str(path)])
    out, err = capsys.readouterr()
    # Skipped lines may be warned about first (results.py's business); then one error line naming the file.
    assert code == 2 and "Traceback" not in out + err
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: results file") and str(path) in last


@pytest.mark.parametrize("name, content, expected", [
    ("w.toml", bytes(range(256)), "is not UTF-8 text"),
    ("w.json", b"\x00\x01\xff\xfe" * 64, "is not UTF-8 text"),
    ("w.json", b"[" * 100_000 + b"]" * 100_000, "nests too deeply to read"),
    ("w.toml", b"x = " + b"[" * 100_000 + b"]" * 100_000, "nests too deeply to read"),
    # Written as text: encoding so deep a value with json.dumps needs the recursion limit it tests.
    ("w.json", b'[{"op": "RMSNormFwd", "id": "U1", "dtype": "f32", "shapes": {"x": [4, 8]}, "params": {"eps": '
     + b"[" * 950 + b"]" * 950 + b"}}]", "nests too deeply"),
    ("w.bin", b"[]", "use a .toml or .json file"),
])
def test_unreadable_workload_files(capsys, tmp_path, name, content, expected):
    path = tmp_path / name
    path.write_bytes(content)
    err = one_line_error(capsys, "list", "--workloads", str(path))
    assert f"workload file '{path}'" in err and expected in err


def test_a_workloads_folder(capsys, tmp_path):
    err = one_line_error(capsys, "list", "--workloads", str(tmp_path))
    assert "is a folder; give a .toml or .json file" in err


def test_a_mistyped_disable_flag_names_the_closest_plugins(capsys, monkeypatch):
    code = main(["--disable", "cnov", "list", "--family", "pool"])
    out, err = capsys.readouterr()
    assert code == 0 and "1 families" in out
    assert err.strip() == "warning: npuops: cannot disable plugin: unknown plugin 'cnov'; did you mean 'conv', 'norm'?"


# -- the calibration cache ------------------------------------------------------------------------

@pytest.mark.parametrize("content", [
    '{"copy_bandwidth": 1e11, "flo',  # cut short by a kill mid-write
    '{"copy_bandwidth": 1e11}',
    '{"copy_bandwidth": "fast", "flops": {}, "source": "x"}',
    '{"copy_bandwidth": NaN, "flops": {}, "source": "x"}',
    '[1, 2]',
    '\udcff',
])
def test_a_bad_calibration_cache_is_ignored_with_a_warning_naming_it(tmp_path, monkeypatch, content):
    from npuops.calibrate import _cache_file, cached_limits, device_limits
    from npuops.registry import load_registry

    monkeypatch.setenv("NPUOPS_CACHE_DIR", str(tmp_path))
    device = load_registry().device("cpu")
    path = _cache_file(device)
    path.write_bytes(content.encode("utf-8", "surrogateescape"))
    with pytest.warns(RuntimeWarning, match=f"ignoring the calibration cache '{path}'.*npuops calibrate --device cpu"):
        assert cached_limits(device) is None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert device_limits(device) == device.datasheet()


def test_a_bad_calibration_cache_does_not_fail_a_run(tmp_path, monkeypatch):
    from npuops.calibrate import _cache_file
    from npuops.registry import load_registry
    from npuops.runner import environment

    monkeypatch.setenv("NPUOPS_CACHE_DIR", str(tmp_path))
    registry = load_registry()
    device = registry.device("cpu")
    _cache_file(device).write_text("{")
    with pytest.warns(RuntimeWarning, match="ignoring the calibration cache"):
        env = environment(registry, device, "run", [])
    assert env["record"] == "env"


def test_the_calibration_cache_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    from npuops import calibrate
    from npuops.devices import Limits
    from npuops.registry import load_registry

    monkeypatch.setenv("NPUOPS_CACHE_DIR", str(tmp_path))
    device = load_registry().device("cpu")
    path = calibrate._cache_file(device)
    calibrate._write_atomically(path, json.dumps({"copy_bandwidth": 1e10, "flops": {"f32": 1e11}, "source": "old"}))
    assert calibrate.cached_limits(device) == Limits(1e10, {"f32": 1e11}, "old")

    def killed(fd):  # a kill between writing and renaming
        raise OSError("killed")

    monkeypatch.setattr(calibrate.os, "fsync", killed)
    with pytest.raises(OSError):
        calibrate._write_atomically(path, '{"copy_bandwidth": 2e10, "fl')
    assert calibrate.cached_limits(device) == Limits(1e10, {"f32": 1e11}, "old")  # the previous cache, intact
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind


def test_the_results_lock_lets_one_run_through_and_is_released(capsys, toy, tmp_path):
    path = tmp_path / "runs" / "r.jsonl"  # a missing folder for the results is made
    assert main([*TOY_RUN, "--out", str(path)]) == 0
    assert main([*TOY_RUN, "--out", str(path)]) == 0  # the first run's lock went with it
    out, err = capsys.readouterr()
    assert "1 already in" in out and "error" not in err
    rows = [json.loads(line) for line in path.read_text().splitlines() if '"row"' in line]
    assert [(r["impl"], r["status"]) for r in rows] == [("toy_ours", "ok")]
