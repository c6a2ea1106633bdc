"""Entry point of the ``norm`` plugin: its ops with their catalog workloads, and our kernels."""

from importlib.resources import files

from npuops import discover_op_classes, hookimpl, load_catalog, ops_from_catalog
from npuops.kernels import tilelang_implementation

from .liger import liger_implementations
from .ops._single_pass import SinglePassNormOp


@hookimpl
def npuops_ops():
    catalog = load_catalog(files(__package__) / "workloads.json")
    return ops_from_catalog(discover_op_classes(f"{__package__}.ops"), catalog)


@hookimpl
def npuops_implementations(ops):
    ours = [op for op in ops.values()
            if isinstance(op, SinglePassNormOp) and any(op.kernel_unsupported(w) is None for w in op.workloads)]
    return liger_implementations(ops) + [
        tilelang_implementation(op.name, lambda op, w, device: op.tilelang_build(w, device),
                                supports=lambda op, w: op.kernel_unsupported(w), description=op.kernel_description)
        for op in ours
    ]
