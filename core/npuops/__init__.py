"""npuops core: op interfaces, workload schemas, the timing protocol and the plugin framework.

The core knows no op family. Families ship as plugins (``npuops-norm``, ``npuops-conv``, ...)
registered under the ``npuops`` entry-point group; see :mod:`npuops.hookspecs`.
"""

from importlib.metadata import PackageNotFoundError, version

from .data import InputRNG, high_precision, nan_filled_allocations, reference_math
from .devices import Device, Limits
from .errors import NpuopsError, PluginLoadError, UnknownNameError, WorkloadError
from .hookspecs import hookimpl
from .impl import TIERS, Implementation, KernelKey
from .op import CheckResult, Cost, KernelOp, Op, Param, Tolerance, compare_tensors, discover_op_classes, ops_from_catalog, package_ops, tensor_bytes
from .patching import Patch, patch
from .workload import DTYPES, Workload, load_catalog, load_workload_file, torch_dtype

try:
    __version__ = version("npuops")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"

__all__ = [
    "DTYPES", "TIERS", "CheckResult", "Cost", "Device", "Implementation", "InputRNG", "KernelKey", "KernelOp", "Limits",
    "NpuopsError", "Op", "Param", "Patch", "PluginLoadError", "Tolerance", "UnknownNameError", "Workload",
    "WorkloadError", "compare_tensors", "discover_op_classes", "high_precision", "hookimpl", "load_catalog",
    "load_workload_file", "nan_filled_allocations", "ops_from_catalog", "package_ops", "patch", "reference_math",
    "tensor_bytes", "torch_dtype",
]
