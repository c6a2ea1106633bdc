"""Entry point of the ``norm`` plugin: its ops with their catalog workloads, our kernels and
Liger-Kernel's where installed."""

from npuops import hookimpl, package_ops
from npuops.kernels import kernel_implementations

from .liger import liger_implementations


@hookimpl
def npuops_ops():
    return package_ops(__package__)


@hookimpl
def npuops_implementations(ops):
    return liger_implementations(ops) + kernel_implementations(ops, __package__, "TileLang row kernel")
