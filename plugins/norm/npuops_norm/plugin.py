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


def row_kernel_spec(op, w):
    from .rowwise_kernel import rowwise_kernel

    return rowwise_kernel(op.row_norm(w), w.shapes["x"], w.dtype_of("x"), samples=op.kernel_samples(w))


@hookimpl
def npuops_implementations(ops):
    return liger_implementations(ops) + [
        tilelang_implementation(op.name, row_kernel_spec, supports=lambda op, w: op.kernel_unsupported(w),
                                description="TileLang row kernel: one block per row, row held in registers")
        for op in ops.values()
        if isinstance(op, SinglePassNormOp) and any(op.row_norm(w) is not None for w in op.workloads)
    ]
