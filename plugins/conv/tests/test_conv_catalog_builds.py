"""Every catalog forward convolution's kernel, the launch a plain run takes (the tuned table's or
the rule's), compiles for sm_90a on any machine: CI, which has no GPU, builds each kernel key once
(one build serves the batch sizes of a geometry), in parallel processes."""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

import pytest

from npuops_conv.ops._forward import ForwardConvOp
from npuops_conv.plugin import npuops_ops


def forward_kernels() -> list[tuple[str, str]]:
    """(op, workload id) of one catalog workload per forward kernel key."""
    keys = {}
    for op in npuops_ops():
        if isinstance(op, ForwardConvOp):
            for w in op.workloads:
                keys.setdefault(op.kernel_key(w), (op.name, w.id))
    return list(keys.values())


def compile_for_sm90(item: tuple[str, str]) -> str | None:
    """What went wrong compiling the kernel of ``item`` (None: it compiled to a CUDA kernel)."""
    from npuops.kernels import compile_kernel
    from npuops_conv.conv_kernel import conv_kernel

    op = {op.name: op for op in npuops_ops()}[item[0]]
    w = op.workload(item[1])
    try:
        spec = conv_kernel(op.geometry(w), w.dtype_of("input"), op.fused_relu, output_layout=op.output_layout(w))
        source = compile_kernel(spec.prim_func, arch="sm_90a", pass_configs=spec.pass_configs).get_kernel_source()
    except Exception as error:  # reported per kernel, all of them, not the first only
        return f"{item[0]}/{item[1]}: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    return None if "__global__" in source else f"{item[0]}/{item[1]}: no CUDA kernel in the source"


def test_every_catalog_forward_kernel_compiles_for_sm90():
    pytest.importorskip("tilelang")
    kernels = forward_kernels()
    assert len(kernels) >= 90  # 115 workloads, batch sizes sharing builds
    # spawned, not forked: TVM's runtime is not fork-safe once loaded
    with ProcessPoolExecutor(max_workers=max(2, min(8, os.cpu_count() or 2)),
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        failures = [failure for failure in pool.map(compile_for_sm90, kernels) if failure]
    assert not failures, "\n".join(failures)
