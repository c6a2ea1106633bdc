"""Entry point of the ``pool`` plugin: its ops with their catalog workloads, our kernels, and the
pooling modules :func:`npuops.patch` can swap."""

from npuops import hookimpl, kernel_implementations, package_ops


@hookimpl
def npuops_ops():
    return package_ops(__package__)


@hookimpl
def npuops_implementations(ops):
    return kernel_implementations(ops, __package__, "TileLang pooling: input rows staged in shared memory, a thread per "
                                  "output visiting its taps, or whole planes staged for global windows")


@hookimpl
def npuops_module_forwards():
    from .modules import pool_forward  # imported on use: it defines the functions' custom ops

    return [pool_forward]
