"""Entry point of the ``topk`` plugin: its ops with their catalog workloads, and our kernel."""

from importlib.resources import files

from npuops import discover_op_classes, hookimpl, load_catalog, ops_from_catalog
from npuops.kernels import kernel_implementations


@hookimpl
def npuops_ops():
    catalog = load_catalog(files(__package__) / "workloads.json")
    return ops_from_catalog(discover_op_classes(f"{__package__}.ops"), catalog)


@hookimpl
def npuops_implementations(ops):
    mine = [op for op in ops.values() if type(op).__module__.startswith(__package__)]
    return kernel_implementations(mine, "TileLang exact radix select: four byte rounds, one block per row")
