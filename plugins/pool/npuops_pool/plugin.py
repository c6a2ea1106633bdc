"""Entry point of the ``pool`` plugin: its ops with their catalog workloads, and our kernels."""

from npuops import hookimpl, package_ops
from npuops.kernels import kernel_implementations


@hookimpl
def npuops_ops():
    return package_ops(__package__)


@hookimpl
def npuops_implementations(ops):
    return kernel_implementations(ops, __package__, "TileLang pooling: input rows staged in shared memory, a thread per "
                                  "output visiting its taps, or whole planes staged for global windows")
