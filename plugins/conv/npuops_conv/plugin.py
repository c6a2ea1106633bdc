"""Entry point of the ``conv`` plugin: its ops with their catalog workloads, and the cuDNN
channels-last baseline."""

from importlib.resources import files

from npuops import discover_op_classes, hookimpl, load_catalog, ops_from_catalog

from .baselines import channels_last_implementations


@hookimpl
def npuops_ops():
    catalog = load_catalog(files(__package__) / "workloads.json")
    return ops_from_catalog(discover_op_classes(f"{__package__}.ops"), catalog)


@hookimpl
def npuops_implementations(ops):
    return channels_last_implementations(ops)
