"""Entry point of the ``topk`` plugin: its ops with their catalog workloads."""

from importlib.resources import files

from npuops import discover_op_classes, hookimpl, load_catalog, ops_from_catalog


@hookimpl
def npuops_ops():
    catalog = load_catalog(files(__package__) / "workloads.json")
    return ops_from_catalog(discover_op_classes(f"{__package__}.ops"), catalog)
