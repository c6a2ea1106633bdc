"""Entry point of the ``norm`` plugin: its ops with their catalog workloads, our kernels and
Liger-Kernel's where installed, and the norm modules :func:`npuops.patch` can swap."""

from npuops import hookimpl, kernel_implementations, package_ops

from .liger import liger_implementations


@hookimpl
def npuops_ops():
    return package_ops(__package__)


@hookimpl
def npuops_implementations(ops):
    return liger_implementations(ops) + kernel_implementations(ops, __package__, "TileLang row kernel")


@hookimpl
def npuops_module_forwards():
    from .modules import norm_forward  # imported on use: it defines the functions' custom ops

    return [norm_forward]


@hookimpl
def npuops_module_workloads(module):
    from .modules import norm_workloads

    return norm_workloads(module)
