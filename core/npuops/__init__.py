"""npuops core: op interfaces, workload schemas, the timing protocol and the plugin framework.

The core knows no op family. Families ship as plugins (``npuops-norm``, ``npuops-conv``, ...)
registered under the ``npuops`` entry-point group; see :mod:`npuops.hookspecs`.

``__all__`` is the API a plugin (and a user's script) may rely on: plugins import from ``npuops``
only, never from its modules. The kernel-building helpers (:mod:`npuops.kernels`), the functions
for model code (:mod:`npuops.functional`), the registry and the results reader load on first use,
so ``import npuops`` stays light (TileLang itself loads only when a kernel is compiled).
"""

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from .data import InputRNG, high_precision, nan_filled_allocations, reference_math
from .devices import AcceleratorDevice, CPUDevice, Device, Limits
from .errors import NpuopsError, PluginLoadError, UnknownNameError, WorkloadError
from .hookspecs import hookimpl
from .impl import TIERS, Implementation, KernelKey
from .op import CheckResult, Cost, KernelOp, Op, Param, Tolerance, compare_tensors, discover_op_classes, ops_from_catalog, package_ops, tensor_bytes
from .patching import Patch, patch
from .workload import DTYPES, Workload, dtype_name, load_catalog, load_workload_file, torch_dtype

if TYPE_CHECKING:
    from .functional import (OpFunction, batched, coverage, define_function, drop_in, finish_builds, int_tuple,
                             reset_coverage, torch_call, unbatched)
    from .kernels import (CPU_TARGET, EVICT_LAST_LOAD, VECTOR_BYTES, KernelSpec, compile_kernel, in_order,
                          interleaved_vectors, kernel_implementations, launcher, load_vectors_evict_last, multiprocessors, thread_owned,
                          tilelang_dtype, wide_indices)
    from .registry import load_registry
    from .results import read_results

try:
    __version__ = version("npuops")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"

# Exported names loaded on first access: name -> the module defining it.
_LAZY = {
    **dict.fromkeys(("CPU_TARGET", "EVICT_LAST_LOAD", "VECTOR_BYTES", "KernelSpec", "compile_kernel", "in_order",
                     "interleaved_vectors", "kernel_implementations", "launcher", "load_vectors_evict_last",
                     "multiprocessors", "thread_owned", "tilelang_dtype", "wide_indices"), ".kernels"),
    **dict.fromkeys(("OpFunction", "batched", "coverage", "define_function", "drop_in", "finish_builds", "int_tuple",
                     "reset_coverage", "torch_call", "unbatched"), ".functional"),
    "load_registry": ".registry",
    "read_results": ".results",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'npuops' has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value  # later accesses skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    # ops, workloads and what an op's definition uses
    "DTYPES", "TIERS", "CheckResult", "Cost", "InputRNG", "KernelKey", "KernelOp", "Op", "Param", "Tolerance", "Workload",
    "compare_tensors", "discover_op_classes", "dtype_name", "high_precision", "load_catalog", "load_workload_file",
    "nan_filled_allocations", "ops_from_catalog", "package_ops", "reference_math", "tensor_bytes", "torch_dtype",
    # the plugin contract (npuops.hookspecs)
    "AcceleratorDevice", "CPUDevice", "Device", "Implementation", "Limits", "hookimpl",
    # errors
    "NpuopsError", "PluginLoadError", "UnknownNameError", "WorkloadError",
    # TileLang kernels (npuops.kernels, loaded on first use)
    "CPU_TARGET", "EVICT_LAST_LOAD", "VECTOR_BYTES", "KernelSpec", "compile_kernel", "in_order",
    "interleaved_vectors", "kernel_implementations", "launcher", "load_vectors_evict_last", "multiprocessors", "thread_owned",
    "tilelang_dtype", "wide_indices",
    # ops as functions for model code (npuops.functional, loaded on first use) and module patching
    "OpFunction", "Patch", "batched", "coverage", "define_function", "drop_in", "finish_builds", "int_tuple", "patch",
    "reset_coverage", "torch_call", "unbatched",
    # the registry and results files (loaded on first use)
    "load_registry", "read_results",
]
