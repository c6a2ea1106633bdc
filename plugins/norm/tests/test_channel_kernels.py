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


def run_on_cpu(op, w, seed=5, config=None):
    fn = op.kernel_callable(w, torch.device("cpu"), config=config, target=CPU_TARGET)
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


# The same channel cases through the three-kernel chain, which the rule now gives only units past
# UNIT_ELEMENTS (every CPU case's unit is smaller).
@pytest.mark.parametrize("name,wid,shape", [case for case in CPU_CASES if case[0] in CHANNEL_OPS
                                            and case[0] != "BatchNormInferenceFwd"])
def test_the_chain_matches_the_reference_on_the_cpu_target(name, wid, shape):
    op = REGISTRY.op(name)
    w = shrunk(op.workload(wid), shape)
    result = run_on_cpu(op, w, config={"kernel": "chain"})
    assert result.ok, result.detail


# The "unit" kernel (a block a unit), as the rule takes it for small units: each kind, forward and
# backward, affine or not, running statistics (batch norm's in the block, instance norm's through
# "running"), weight gradients in the block (batch norm) or per row through "columns" (instance,
# group), group norm's rows kept apart (2 and 8 segments); masked tails (105, 30, 120 elements a
# unit), unmasked 16-byte vectors (4096: 256 threads), the largest unit (16384: 512 threads, 32
# elements a thread), a unit of one element a row (hw = 1) and one of a single element a thread.
UNIT_CASES = [
    ("BatchNormFwd", "W1", (3, 8, 5, 7)), ("BatchNormFwd", "W2", (6, 5)), ("BatchNormFwd", "W1", (4, 2, 64, 64)),
    ("BatchNormBwd", "W1", (3, 8, 5, 7)), ("BatchNormBwd", "W2", (32, 6)), ("BatchNormBwd", "W1", (4, 3, 32, 32)),
    ("InstanceNormFwd", "W1", (3, 8, 5, 7)), ("InstanceNormFwd", "W3", (3, 8, 5, 7)),
    ("InstanceNormFwd", "W3", (2, 3, 64, 64)), ("InstanceNormBwd", "W1", (3, 8, 5, 7)),
    ("InstanceNormBwd", "W3", (3, 8, 5, 7)), ("InstanceNormBwd", "W1", (2, 3, 64, 64)),
    ("GroupNormFwd", "W1", (2, 64, 5, 7)), ("GroupNormFwd", "W3", (2, 64, 4, 4)), ("GroupNormFwd", "W5", (2, 32, 3, 5)),
    ("GroupNormBwd", "W1", (2, 64, 5, 7)), ("GroupNormBwd", "W3", (2, 64, 4, 4)), ("GroupNormBwd", "W5", (2, 128, 3, 5)),
]


@pytest.mark.parametrize("name,wid,shape", UNIT_CASES)
def test_the_unit_kernel_matches_the_reference_on_the_cpu_target(name, wid, shape):
    from npuops_norm.channel_kernel import default_launch

    op = REGISTRY.op(name)
    w = shrunk(op.workload(wid), shape)
    rule = default_launch(op.channel_norm(w))
    assert rule.kernel == "unit"
    fn = op.kernel_callable(w, torch.device("cpu"), target=CPU_TARGET)
    assert fn.config["kernel"] == "unit" and fn.config["unit_threads"] == rule.unit_threads
    result = run_on_cpu(op, w)
    assert result.ok, result.detail


@pytest.mark.parametrize("name,wid,shape", [("BatchNormBwd", "W1", (3, 8, 5, 7)), ("GroupNormFwd", "W1", (2, 64, 16, 16)),
                                            ("InstanceNormFwd", "W3", (2, 4, 32, 32))])
def test_every_launch_variant_matches_the_reference_on_the_cpu_target(name, wid, shape):
    """What ``npuops run --tune`` compares: the unit kernel at other block sizes and the chain."""
    op = REGISTRY.op(name)
    w = shrunk(op.workload(wid), shape)
    variants = op.tilelang_variants(w)
    assert {v["kernel"] for v in variants} == {"unit", "chain"} and variants[0]["kernel"] == "unit"
    for config in variants:
        result = run_on_cpu(op, w, config=config)
        assert result.ok, f"{config}: {result.detail}"


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


def test_channel_launch_rule_takes_the_unit_kernel_for_every_small_catalog_workload():
    """One launch where a unit fits a block's registers; the large-spatial workloads (units of 4M
    elements) and inference (one kernel already) keep theirs."""
    from npuops_norm.channel_kernel import UNIT_ELEMENTS, ChannelNorm, default_launch

    for name in CHANNEL_OPS:
        op = REGISTRY.op(name)
        for w in op.workloads:
            spec = op.channel_norm(w)
            unit = spec.mode != "eval" and w.label != "large-spatial"
            assert (default_launch(spec).kernel == "unit") == unit, (name, w.id)
    threads = {(name, wid): default_launch(REGISTRY.op(name).channel_norm(REGISTRY.op(name).workload(wid))).unit_threads
               for name, wid in [("BatchNormFwd", "W2"), ("BatchNormFwd", "W3"), ("BatchNormFwd", "W5"),
                                 ("InstanceNormBwd", "W6"), ("GroupNormBwd", "W5")]}
    assert threads == {("BatchNormFwd", "W2"): 32, ("BatchNormFwd", "W3"): 512, ("BatchNormFwd", "W5"): 256,
                       ("InstanceNormBwd", "W6"): 64, ("GroupNormBwd", "W5"): 512}
    # Past UNIT_ELEMENTS, or a group norm backward with a weight and more than 8 channels a group: the chain.
    assert default_launch(ChannelNorm("batch", "train", 2, 8, UNIT_ELEMENTS // 2 + 1, torch.float16)).kernel == "chain"
    assert default_launch(ChannelNorm("batch", "train", 2, 8, UNIT_ELEMENTS // 2, torch.float16)).kernel == "unit"
    assert default_launch(ChannelNorm("group", "backward", 2, 64, 16, torch.float16, groups=4,
                                      affine=True)).kernel == "chain"
    assert default_launch(ChannelNorm("group", "backward", 2, 64, 16, torch.float16, groups=4)).kernel == "unit"


# LayerNormBwd W2: 16384-wide rows, the weight and column sums in shared memory. The channel
# norms: the rule's kernels (the chain for large-spatial W1, else the unit kernel: with "running"
# for InstanceNormFwd W3 and W6, with "columns" for the affine instance and group backward, 8
# segments for GroupNormBwd W5, one element a row for BatchNormBwd W2, the largest block for
# BatchNormFwd W3), and the chain where the rule now takes the unit kernel.
CHAIN = {"kernel": "chain"}
COMPILE_CASES = [("RMSNormBwd", "W2", None), ("LayerNormBwd", "W5", None), ("LayerNormBwd", "W2", None),
                 ("BatchNormFwd", "W1", None), ("BatchNormFwd", "W3", None), ("BatchNormInferenceFwd", "W3", None),
                 ("BatchNormBwd", "W1", None), ("BatchNormBwd", "W2", None), ("BatchNormBwd", "W5", None),
                 ("BatchNormBwd", "W4", CHAIN), ("InstanceNormFwd", "W3", None), ("InstanceNormFwd", "W6", None),
                 ("InstanceNormFwd", "W3", CHAIN), ("InstanceNormBwd", "W1", None), ("InstanceNormBwd", "W6", None),
                 ("InstanceNormBwd", "W1", CHAIN), ("GroupNormFwd", "W5", None), ("GroupNormFwd", "W5", CHAIN),
                 ("GroupNormBwd", "W1", None), ("GroupNormBwd", "W5", None), ("GroupNormBwd", "W6", None),
                 ("GroupNormBwd", "W1", CHAIN)]
UNIT_KERNELS = {("BatchNormFwd", "W3"): 1, ("BatchNormBwd", "W2"): 1, ("BatchNormBwd", "W5"): 1,
                ("InstanceNormFwd", "W3"): 2, ("InstanceNormFwd", "W6"): 2, ("InstanceNormBwd", "W1"): 2,
                ("InstanceNormBwd", "W6"): 1, ("GroupNormFwd", "W5"): 1, ("GroupNormBwd", "W1"): 2,
                ("GroupNormBwd", "W5"): 2, ("GroupNormBwd", "W6"): 1}


@pytest.mark.parametrize("name,wid,config", COMPILE_CASES)
def test_kernels_compile_for_sm90a(name, wid, config, monkeypatch):
    monkeypatch.setenv("NPUOPS_CUDA_ARCH", "sm_90a")
    op = REGISTRY.op(name)
    fn = op.tilelang_build(op.workload(wid), torch.device("cpu"), config)
    assert fn.config["kernels"] >= 1
    if name in CHANNEL_OPS and config is None and (name, wid) in UNIT_KERNELS:
        assert (fn.config["kernel"], fn.config["kernels"]) == ("unit", UNIT_KERNELS[name, wid])
    elif name in CHANNEL_OPS and name != "BatchNormInferenceFwd":
        assert (fn.config["kernel"], fn.config["kernels"]) == ("chain", 3)


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
