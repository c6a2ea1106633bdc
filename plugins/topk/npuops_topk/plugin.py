"""Entry point of the ``topk`` plugin: its ops with their catalog workloads, and our kernel."""

from npuops import hookimpl, kernel_implementations, package_ops


@hookimpl
def npuops_ops():
    return package_ops(__package__)


@hookimpl
def npuops_implementations(ops):
    return kernel_implementations(ops, __package__, "TileLang exact radix select, one block per row")
