"""Entry point of the ``pool`` plugin: its ops with their catalog workloads, and our kernels."""

from importlib.resources import files

from npuops import discover_op_classes, hookimpl, load_catalog, ops_from_catalog
from npuops.kernels import tilelang_implementation


@hookimpl
def npuops_ops():
    catalog = load_catalog(files(__package__) / "workloads.json")
    return ops_from_catalog(discover_op_classes(f"{__package__}.ops"), catalog)


@hookimpl
def npuops_implementations(ops):
    return [
        tilelang_implementation(op.name, lambda op, w, device: op.tilelang_build(w, device),
                                supports=lambda op, w: op.kernel_unsupported(w),
                                description="TileLang pooling: one thread per output, window taps bounds-checked")
        for op in ops.values() if op.family == "pool"
    ]
