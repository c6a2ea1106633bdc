"""Our TileLang kernels of the channel norms (channel_kernel) and the row-wise norms' backward ops
(backward_kernel): each compiles for sm_90a on any machine, runs on TileLang's CPU target on
small f32 shapes against the op's reference (outputs and workspaces NaN-filled, fresh random
inputs); on a GPU (marker ``gpu``) every catalog workload passes the correctness gate and the
reductions give the same bits twice."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from npuops import InputRNG, nan_filled_allocations
from npuops.check import check, clone_inputs
from npuops.kernels import CPU_TARGET
from npuops.registry import load_registry

tilelang = pytest.importorskip("tilelang")

REGISTRY = load_registry(strict=True)
CHANNEL_OPS = ["BatchNormFwd", "BatchNormInferenceFwd", "BatchNormBwd", "InstanceNormFwd", "InstanceNormBwd",
               "GroupNormFwd", "GroupNormBwd"]
ROW_BACKWARD_OPS = ["RMSNormBwd", "LayerNormBwd"]
ALL_OPS = CHANNEL_OPS + ROW_BACKWARD_OPS


def shrunk(w, shape, dtype="f32"):
    """``w`` with x of ``shape`` (its per-channel tensors resized) in ``dtype``; normalized_shape
    dropped (the last dim)."""
    shapes = {name: ([shape[1]] if name != "x" else list(shape)) for name in w.shapes}
    params = {k: v for k, v in w.params.items() if k != "normalized_shape"}
    return dataclasses.replace(w, id=f"{w.id}-{'x'.join(map(str, shape))}", shapes=shapes, params=params, dtype=dtype,
                               shape_dtypes={k: dtype for k in (w.shape_dtypes or {})})


def run_on_cpu(op, w, seed=5):
    fn = op.kernel_callable(w, torch.device("cpu"), target=CPU_TARGET)
    inputs = op.make_inputs(w, InputRNG(torch.device("cpu"), seed))
    expected = op.reference(clone_inputs(inputs), w)
    with nan_filled_allocations():
        out = fn(**inputs)
    return op.compare(out, expected, w)


def test_every_op_has_a_kernel_for_every_catalog_workload():
    for name in ALL_OPS:
        op = REGISTRY.op(name)
        assert REGISTRY.implementation(name, "tilelang")
        assert [w.id for w in op.workloads if op.kernel_unsupported(w)] == [], name


# One workload of each flavor (affine, running statistics) a op, shrunk; odd spatial sizes (no
# 16-byte vectors) and rows split into several chunks (the partial sums' fixed-order combine).
CPU_CASES = [
    ("BatchNormFwd", "W1", (3, 8, 5, 7)), ("BatchNormFwd", "W1", (2, 4, 64, 64)), ("BatchNormFwd", "W2", (6, 5)),
    ("BatchNormInferenceFwd", "W1", (3, 8, 5, 7)), ("BatchNormBwd", "W1", (3, 8, 5, 7)),
    ("BatchNormBwd", "W1", (2, 4, 64, 64)), ("InstanceNormFwd", "W1", (3, 8, 5, 7)),
    ("InstanceNormFwd", "W3", (3, 8, 5, 7)), ("InstanceNormBwd", "W1", (3, 8, 5, 7)),
    ("InstanceNormBwd", "W3", (2, 4, 64, 64)), ("GroupNormFwd", "W1", (2, 64, 5, 7)),
    ("GroupNormFwd", "W3", (2, 64, 4, 4)), ("GroupNormBwd", "W1", (2, 64, 5, 7)), ("GroupNormBwd", "W3", (2, 64, 4, 4)),
    ("RMSNormBwd", "W2", (5, 1000)), ("RMSNormBwd", "W1", (1, 256)), ("LayerNormBwd", "W2", (7, 96)),
    ("LayerNormBwd", "W1", (1, 256)),
]


@pytest.mark.parametrize("name,wid,shape", CPU_CASES)
def test_kernels_match_the_reference_on_the_cpu_target(name, wid, shape):
    op = REGISTRY.op(name)
    w = shrunk(op.workload(wid), shape)
    assert op.kernel_unsupported(w) is None
    result = run_on_cpu(op, w)
    assert result.ok, result.detail


def test_row_backward_blocks_take_equal_shares_and_a_tail():
    """Several rows a block, the last block short: its missing rows store nothing and add nothing."""
    from npuops_norm.backward_kernel import RowBackward, build_row_backward
    from npuops_norm.ops.rms_norm_bwd import rms_norm_backward_formula

    rows, hidden = 7, 64
    fn = build_row_backward(RowBackward("rms", rows, hidden, torch.float32), (hidden,), torch.device("cpu"),
                            threads=32, blocks=3, target=CPU_TARGET)
    x, dy, w = torch.randn(rows, hidden) + 0.5, torch.randn(rows, hidden), 1 + 0.1 * torch.randn(hidden)
    rstd = torch.rsqrt(x.double().square().mean(1, keepdim=True) + 1e-6)
    with nan_filled_allocations():
        grad_x, grad_w = fn(dy, x, w, rstd.float())
    ref_x, ref_w = rms_norm_backward_formula(dy.double(), x.double(), rstd, w.double(), (1,))
    torch.testing.assert_close(grad_x.double(), ref_x, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad_w.double(), ref_w, rtol=1e-5, atol=1e-5)


def test_launch_rules():
    from npuops_norm.backward_kernel import RowBackward
    from npuops_norm.backward_kernel import default_launch as row_launch
    from npuops_norm.channel_kernel import ChannelNorm, default_launch

    prefill = row_launch(RowBackward("rms", 2048, 16384, torch.bfloat16))
    assert (prefill.threads, prefill.blocks) == (1024, 128)  # 16 elements a thread, 16 rows a block
    assert row_launch(RowBackward("meanvar", 1, 4096, torch.bfloat16)).blocks == 1  # one kernel
    big = ChannelNorm("batch", "train", 4, 128, 1024 * 1024, torch.float16)
    assert default_launch(big).chunks == 64  # chunks of 16384 elements
    small = ChannelNorm("group", "train", 8, 128, 1024, torch.float16, groups=32)
    assert default_launch(small).chunks == 1


# LayerNormBwd W2: 16384-wide rows, the weight and column sums in shared memory.
COMPILE_CASES = [("RMSNormBwd", "W2"), ("LayerNormBwd", "W5"), ("LayerNormBwd", "W2"), ("BatchNormFwd", "W1"),
                 ("BatchNormInferenceFwd", "W3"),
                 ("BatchNormBwd", "W4"), ("InstanceNormFwd", "W3"), ("InstanceNormBwd", "W1"), ("GroupNormFwd", "W5"),
                 ("GroupNormBwd", "W1")]


@pytest.mark.parametrize("name,wid", COMPILE_CASES)
def test_kernels_compile_for_sm90a(name, wid, monkeypatch):
    monkeypatch.setenv("NPUOPS_CUDA_ARCH", "sm_90a")
    op = REGISTRY.op(name)
    fn = op.tilelang_build(op.workload(wid), torch.device("cpu"))
    assert fn.config["kernels"] >= 1


@pytest.mark.gpu
@pytest.mark.parametrize("name", ALL_OPS)
def test_every_catalog_workload_passes_the_gate_on_the_gpu(name):
    device = REGISTRY.device("cuda")
    op, impl = REGISTRY.op(name), REGISTRY.implementation(name, "tilelang")
    failures = []
    for w in op.workloads:
        if impl.why_not(op, w, device):
            continue
        result = check(op, w, impl.build(op, w, device.torch_device()), device, seed=13)
        if not result.ok:
            failures.append(f"{w.key} {w.shapes}: {result.detail}")
    assert not failures, "\n".join(failures)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ALL_OPS)
def test_reductions_give_the_same_bits_twice_on_the_gpu(name):
    device = REGISTRY.device("cuda")
    op = REGISTRY.op(name)
    for w in op.workloads:
        fn = op.tilelang_build(w, device.torch_device())
        inputs = op.make_inputs(w, InputRNG(device.torch_device(), 17))
        first, second = (fn(**clone_inputs(inputs)) for _ in range(2))
        first, second = (out if isinstance(out, tuple) else (out,) for out in (first, second))
        for a, b in zip(first, second, strict=True):
            assert torch.equal(a, b), f"{w.key}: bits differ"
