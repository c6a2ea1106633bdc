"""Compile, on a machine without a GPU, every TileLang kernel a benchmark run of the catalog builds,
into a TileLang cache that ships to the GPU machine: there each kernel loads instead of compiling
(the GPU machine's compile time is most of a run's). Keys match when the TileLang version, the
kernel's TIR, the target ({"kind": "cuda", "arch": "sm_90a"}) and the execution backend do; a miss
just compiles. The backend is the GPU machine's, TileLang's cython one: its host library is linked
here against a stand-in for the CUDA driver (``-lcuda`` with none installed; the kernels' host code
calls the CUDA runtime, which finds the real driver where they run).

    python scripts/warm-kernel-cache.py [--family norm,pool] [--op RMSNormFwd,...] [--variants]
                                        [--launch-classes] [--jobs 2]
                                        [--workloads benchmarks/off-catalog.toml] [--workload OP/ID,...]
                                        [--archive off-catalog.tar.xz | --into DIR]

Writes .kcache/cache.tar.xz (git-ignored; --archive names another), adding to what it held
(--fresh: starting empty); carry ".kcache" with the device call and scripts/h200-session.sh
unpacks it into the run's TILELANG_CACHE_DIR. ``--workloads`` takes a workloads file's instead of
the catalog's (as ``npuops run --workloads``), ``--workload`` some of them. ``--into`` builds into
a TileLang cache directory as it is, no archive: on the GPU machine itself, its TILELANG_CACHE_DIR,
for the kernels of many workloads at once (``npuops warm`` builds them one after another).
"""

import argparse
import multiprocessing
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ARCH = "sm_90a"


class _WithoutInit:
    """A kernel's host library as loaded, but for ``init()``: it sets the kernel's launch attributes
    (dynamic shared memory) on the GPU the library runs on, and here there is none. The GPU machine
    calls it when it loads the kernel from the cache."""

    def __init__(self, lib):
        self._lib = lib

    def __getattr__(self, name):
        return getattr(self._lib, name)

    @staticmethod
    def init() -> int:
        return 0


def _load_without_init() -> None:
    from tilelang.jit.adapter.libgen import LibraryGenerator

    load = LibraryGenerator.load_lib
    LibraryGenerator.load_lib = lambda self, *args, **kwargs: _WithoutInit(load(self, *args, **kwargs))


def _registry(workloads_file: str | None):
    """The registry, with ``workloads_file``'s workloads added (and those: None without a file)."""
    from npuops.registry import load_registry
    from npuops.workload import load_workload_file

    registry = load_registry()
    return registry, registry.add_workloads(load_workload_file(workloads_file)) if workloads_file else None


def build(job: tuple[str, bool, bool, str | None]) -> str | None:
    import torch

    _load_without_init()

    key, variants, classes, workloads_file = job
    registry, _ = _registry(workloads_file)
    op_name, wid = key.split("/")
    op, impl = registry.op(op_name), registry.implementation(op_name, "tilelang")
    w, cpu = op.workload(wid), torch.device("cpu")
    try:
        impl.builds(op, w, cpu, tune=variants)  # binding needs no GPU
        if classes and impl.launch_classes is not None:  # the builds a function's first call starts behind it
            built = {impl.build_key(op, w)}
            for other in impl.launch_classes(op, w):
                if (build_key := impl.build_key(op, other)) not in built:
                    built.add(build_key)
                    impl.build(op, other, cpu)
    except Exception as exc:  # reported; the rest go on
        return f"{key}: {type(exc).__name__}: {exc}"[:300]
    return None


def stand_in_driver(folder: Path) -> None:
    """Where no CUDA driver is installed, a library named as it is (libcuda.so, soname libcuda.so.1)
    for the host libraries' ``-lcuda`` to link against and load with, put on this process's (and
    its workers') library paths."""
    if subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout.count("libcuda.so.1"):
        return
    (folder / "stand_in.c").write_text("void npuops_stand_in_cuda_driver(void) {}\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(folder / "libcuda.so"),
                    str(folder / "stand_in.c")], check=True)
    (folder / "libcuda.so.1").symlink_to("libcuda.so")
    for name in ("LIBRARY_PATH", "LD_LIBRARY_PATH"):
        os.environ[name] = os.pathsep.join(filter(None, (str(folder), os.environ.get(name))))


def build_all(keys: list[str], args: argparse.Namespace, cache: str) -> None:
    """Build ``keys``' kernels into the TileLang cache ``cache``, ``args.jobs`` at a time."""
    os.environ.update(TILELANG_CACHE_DIR=cache, NPUOPS_CUDA_ARCH=ARCH, TILELANG_EXECUTION_BACKEND="cython")
    with tempfile.TemporaryDirectory() as driver:
        stand_in_driver(Path(driver))
        with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            jobs = [(key, args.variants, args.launch_classes, args.workloads) for key in keys]
            for done, error in enumerate(pool.map(build, jobs), 1):
                print(f"[{done}/{len(keys)}] {error or 'ok'}", file=sys.stderr if error else sys.stdout, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", help="families, e.g. norm,pool (default: all with kernels)")
    parser.add_argument("--op", help="ops, e.g. RMSNormFwd,LayerNormFwd (default: every op of the families)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--variants", action="store_true", help="every launch variant too (for npuops run --tune)")
    parser.add_argument("--launch-classes", action="store_true",
                        help="each workload's other launch classes too (what the functions for model code build)")
    parser.add_argument("--fresh", action="store_true", help="drop the kernels the archive already holds")
    parser.add_argument("--workloads", help="a workloads file (TOML or JSON) whose workloads to build instead of the catalog's")
    parser.add_argument("--workload", help="only these workloads, e.g. RMSNormFwd/X5,LayerNormFwd/X3")
    parser.add_argument("--archive", default="cache.tar.xz", help="the archive's name in .kcache")
    parser.add_argument("--into", help="a TileLang cache directory to build into, instead of an archive")
    args = parser.parse_args()

    registry, added = _registry(args.workloads)
    families = set(args.family.split(",")) if args.family else None
    ops = set(args.op.split(",")) if args.op else None
    chosen = set(args.workload.split(",")) if args.workload else None
    user = None if added is None else {w.key for w in added}
    keys = []
    for name, impls in sorted(registry.implementations.items()):
        op = registry.op(name)
        if (families and op.family not in families) or (ops and name not in ops) \
                or not any(i.name == "tilelang" for i in impls):
            continue
        keys += [w.key for w in op.workloads if op.kernel_unsupported(w) is None
                 and (user is None or w.key in user) and (chosen is None or w.key in chosen)]

    if args.into:
        Path(args.into).mkdir(parents=True, exist_ok=True)
        build_all(keys, args, args.into)
        return 0
    out = Path(".kcache")
    out.mkdir(exist_ok=True)
    archive = out / args.archive
    with tempfile.TemporaryDirectory() as cache:
        if archive.exists() and not args.fresh:
            subprocess.run(["tar", "-C", cache, "-xJf", str(archive)], check=True)
        try:
            build_all(keys, args, cache)
        finally:  # interrupted too: the kernels compiled so far are kept
            # xz -9e: half the size of the default level, so more fits in a device call's carry limit.
            # Without TileLang's cuda-binaries (cubins keyed by CUDA source, which only spare nvcc
            # a compile on a kernel-cache miss): a hit loads the kernel's own directory alone, and
            # the norm family's archive took 20.9 MB with them, 12.0 without.
            subprocess.run(["tar", "-C", cache, "-cJf", str(archive), "--exclude=./*/cuda-binaries", "."], check=True,
                           env={**os.environ, "XZ_OPT": "-9e -T2"})
            print(f"wrote {archive} ({archive.stat().st_size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
