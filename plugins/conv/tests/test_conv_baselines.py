"""The torch formulation (the eager/compile baselines) and the cuDNN channels-last baseline pass
the correctness gate on small workloads of every dtype the catalog uses."""

import pytest
import torch
from conv_oracle import SMALL_CASES, small

from npuops import InputRNG
from npuops.check import check
from npuops.devices import CPUDevice
from npuops_conv.baselines import ChannelsLastCache, build_channels_last, channels_last_implementations
from npuops_conv.plugin import npuops_ops

OPS = {op.name: op for op in npuops_ops()}
CPU = CPUDevice()


def catalog_dtype_cases():
    return [
        pytest.param(name, small(name, dtype, shapes, **params), id=f"{name}-{dtype}-{case}")
        for name, op in OPS.items()
        for dtype in sorted({w.dtype for w in op.workloads})
        for case, shapes, params in SMALL_CASES[name]
    ]


@pytest.mark.parametrize("name, w", catalog_dtype_cases())
@pytest.mark.parametrize("seed", [0, 1])
def test_torch_formulation_passes_the_check(name, w, seed):
    op = OPS[name]
    result = check(op, w, op.torch_impl(w), CPU, seed)
    assert result.ok, result.detail


@pytest.mark.parametrize("name, w", catalog_dtype_cases())
def test_channels_last_baseline_passes_the_check(name, w):
    op = OPS[name]
    fn = build_channels_last(op, w, CPU.torch_device())
    result = check(op, w, fn, CPU, seed=0)
    assert result.ok, result.detail


def test_check_rejects_a_one_percent_error():
    op = OPS["Conv2dFwd"]
    _, shapes, params = SMALL_CASES["Conv2dFwd"][0]
    w = small("Conv2dFwd", "f16", shapes, **params)
    conv = op.torch_impl(w)

    def off_by_one_percent(**inputs):
        return conv(**inputs) * 1.01

    assert not check(op, w, off_by_one_percent, CPU, seed=0).ok


def test_channels_last_cache_converts_once_per_tensor():
    cache = ChannelsLastCache()
    x = torch.randn(2, 3, 4, 5)
    first = cache.get("input", x)
    assert first.is_contiguous(memory_format=torch.channels_last) and torch.equal(first, x)
    assert cache.get("input", x) is first  # same tensor again: no new conversion
    x.add_(1)  # an in-place update must not be served stale
    updated = cache.get("input", x)
    assert updated is not first and torch.equal(updated, x)
    other = x.clone()
    assert cache.get("input", other) is not updated  # a different tensor object
    volume = torch.randn(1, 2, 3, 4, 5)
    assert cache.get("volume", volume).is_contiguous(memory_format=torch.channels_last_3d)
    bias = torch.randn(7)
    assert cache.get("bias", bias) is bias


def test_channels_last_baseline_runs_on_channels_last_tensors():
    op = OPS["Conv2dFwd"]
    w = small("Conv2dFwd", "f32", {"input": [1, 8, 6, 6], "weight": [4, 8, 3, 3]}, padding=1)
    inputs = op.make_inputs(w, InputRNG("cpu", 0))
    out = build_channels_last(op, w, CPU.torch_device())(**inputs)
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert inputs["input"].is_contiguous()  # the caller's tensors are left as they were


def test_channels_last_implementation_is_cuda_only_and_refuses_1d():
    impls = {impl.op: impl for impl in channels_last_implementations(OPS)}
    assert set(impls) == set(OPS)
    for name, impl in impls.items():
        assert impl.tier == "vendor" and impl.devices == ("cuda",)
        op = OPS[name]
        reason = impl.supports(op, op.workloads[0], CPU)
        if name.startswith("Conv1d"):
            assert reason and "1-d" in reason
        else:
            assert reason is None
    conv2d = OPS["Conv2dFwd"]
    assert "cuda" in impls["Conv2dFwd"].why_not(conv2d, conv2d.workloads[0], CPU)
