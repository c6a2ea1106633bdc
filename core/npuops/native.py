"""``npuops._torch_fast``: the functions' fast path reading tensors through torch's C++ objects
(``_torch_fast.cpp``), built on the machine it runs on, against the torch installed there.

Why at run time: its code includes torch's headers, whose ABI is the installed torch's own, and a
package build (``pip install``, isolated from the environment's torch) cannot see them. The first
process that builds a CUDA kernel of ours starts this build behind its calls (a C++ compiler and
torch's headers are all it needs; about 20 s), and later processes load the library from
``$NPUOPS_CACHE_DIR/native`` (by default ``~/.cache/npuops/native``), keyed by the source, torch's
and Python's versions. Until it is loaded, and where it cannot build (no compiler), the fast path
reads tensors through Python's attributes as before: the same calls, about 1.4 µs more each on
a CPU host.
``NPUOPS_NATIVE=0`` turns it off.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path

import torch

from .calibrate import cache_dir

_HERE = Path(__file__).parent
SOURCES = (_HERE / "_torch_fast.cpp", _HERE / "_torch_fast.h")
ENV = "NPUOPS_NATIVE"
_MODULE = "_torch_fast"
COMPILE_TIMEOUT_S = 300

_lock = threading.Lock()  # held through a build
_start_lock = threading.Lock()
_started: threading.Thread | None = None
state: dict[str, object] = {"loaded": False, "why_not": "not built yet"}  # what accelerate() found


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


def library_path() -> Path:
    """Where the library built for this torch and Python is cached."""
    digest = hashlib.sha256()
    for source in SOURCES:
        digest.update(source.read_bytes())
    digest.update(f"{torch.__version__} {torch.version.git_version} {sys.version}".encode())
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    return cache_dir() / "native" / f"{_MODULE}-{digest.hexdigest()[:16]}{suffix}"


def _compile(target: Path) -> None:
    """Compile the library to ``target`` (atomically: a build interrupted leaves no file there)."""
    from torch.utils import cpp_extension

    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        raise RuntimeError("no C++ compiler (c++ or g++ on PATH, or $CXX)")
    libraries = cpp_extension.library_paths()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        built = Path(scratch) / target.name
        command = [compiler, "-O2", "-shared", "-fPIC", "-std=c++17", "-w",
                   f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
                   f"-I{sysconfig.get_paths()['include']}", f"-I{_HERE}",
                   *(f"-I{path}" for path in cpp_extension.include_paths()),
                   str(SOURCES[0]), "-o", str(built),
                   *(f"-L{path}" for path in libraries), *(f"-Wl,-rpath,{path}" for path in libraries),
                   "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]
        # A compiler that hangs must not hold finish_builds() (and warm()) for good.
        done = subprocess.run(command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        if done.returncode:
            raise RuntimeError(f"{Path(compiler).name} failed: {done.stderr.strip()[-400:]}")
        os.replace(built, target)


def load() -> object:
    """The library's module, built first where it is not cached (raises where it cannot be)."""
    target = library_path()
    if not target.exists():
        _compile(target)
    spec = importlib.util.spec_from_file_location(_MODULE, target)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def accelerate() -> bool:
    """Load (or build) the library and hand it to the C fast path, whose fast calls filed before
    are forgotten (their keys change form): whether it is in use. Once per process."""
    from . import functional

    with _lock:
        if state["loaded"]:
            return True
        if not enabled():
            state["why_not"] = f"off ({ENV}=0)"
            return False
        if functional._fastpath is None:
            state["why_not"] = "the C fast path was not built"
            return False
        try:
            module = load()
            functional._fastpath.accelerate(module.api)
        except Exception as exc:  # noqa: BLE001 - the fast path works without it, slower
            state["why_not"] = f"{type(exc).__name__}: {exc}"
            return False
        functional.forget_fast_paths()
        state.update(loaded=True, why_not=None)
        return True


def accelerate_behind() -> None:
    """Start :func:`accelerate` in a thread, once per process."""
    global _started
    with _start_lock:
        if _started is not None or not enabled():
            return
        _started = threading.Thread(target=accelerate, name="npuops native build", daemon=True)
        _started.start()


def wait(timeout: float | None = None) -> bool:
    """Wait for a build :func:`accelerate_behind` started (at most ``timeout`` s): whether none runs."""
    thread = _started
    if thread is not None:
        thread.join(timeout)
        return not thread.is_alive()
    return True
