"""Layouts through the conv functions: ``npuops_conv.conv2d`` of a ``torch.channels_last`` input
(``conv3d``: ``channels_last_3d``; ``conv1d``: NLC storage, such as ``x.transpose(1, 2)`` of a
[N, L, C] tensor) runs our kernel on the input's own storage, no conversion; NC[D]HW-contiguous
inputs are converted as before. Either way the output is in the layout torch's function returns
(on the GPU, cuDNN's rule: channels last where the input or the weight is; conv1d's, NLC where its
weight is), written so by our kernel: a channels-last output is the NC[D]HW view of the kernel's,
an NC[D]HW-contiguous one the kernel's own (its epilogue writes it channels first, no copy).
Gradients of channels-last inputs run our gradient kernels. The same for the functions of the
other ops, which go through the same binding: ``conv_transpose2d`` (our data-gradient kernel, its
stride phases' rows stored channels first to their positions), ``conv1d_causal``, ``conv2d_bias_relu`` (the fused epilogue) and
``conv2d_fp8``. Checked with our kernels built for TileLang's CPU target in place of the GPU's (see
conv_cpu_kernels; conv2d_fp8: the CPU target builds no fp8 GEMM, so a stand-in of the kernel
checks the call's routing), and on a GPU (marker ``gpu``) in bf16 and f16 (conv2d_fp8: fp8
e4m3)."""

from __future__ import annotations

import math

import npuops_conv as F
import pytest
import torch
import torch.nn.functional as TF
from conv_cpu_kernels import (
    FORWARD,
    GRADIENTS,
    forward_spec,
    fp8_stand_in,
    use_cpu_target_kernels,
)
from npuops.functional import coverage, reset_coverage

FORMATS = {3: None, 4: torch.channels_last, 5: torch.channels_last_3d}


def _channels_last(t: torch.Tensor) -> torch.Tensor:
    """``t`` with channels-last storage (conv1d's: NLC, which torch has no memory format for)."""
    if t.dim() == 3:
        return t.transpose(1, 2).contiguous().transpose(1, 2)
    return t.contiguous(memory_format=FORMATS[t.dim()])


def _is_channels_last(t: torch.Tensor) -> bool:
    return t.transpose(1, 2).is_contiguous() if t.dim() == 3 else t.is_contiguous(memory_format=FORMATS[t.dim()])


def _returns_channels_last(fn, x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether torch's function returns channels last for ``x`` and ``w`` (none of size 1 but the
    batch) on the GPU: where either is channels last (cuDNN's rule); the 1-d convolutions (run as a
    conv2d of the input made contiguous): where the weight is."""
    return _is_channels_last(w) if w.dim() == 3 else _is_channels_last(x) or _is_channels_last(w)


def _function(fn, b) -> str:
    """The op function ``fn`` of ``bias`` b calls, as coverage() names it (conv2d_bias_relu: one,
    its bias required)."""
    return f"{fn.__name__}{'_bias' if b is not None and fn is not F.conv2d_bias_relu else ''}"


def _causal(input, weight, bias=None, stride=1, dilation=1, groups=1):
    return TF.conv1d(TF.pad(input, ((weight.shape[-1] - 1) * dilation, 0)), weight, bias, stride, 0, dilation, groups)


def _bias_relu(input, weight, bias, **kwargs):
    return TF.conv2d(input, weight, bias, **kwargs).relu()


# torch's formulation of each function (the drop-ins: torch's function of the same name)
_FORMULATIONS = {F.conv1d_causal: _causal, F.conv2d_bias_relu: _bias_relu}


def _torch(fn):
    return _FORMULATIONS.get(fn) or getattr(TF, fn.__name__)


def _shares_storage(seen: torch.Tensor, t: torch.Tensor) -> bool:
    return seen.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()


def _randn(*shape, dtype=torch.float32, device="cpu", std=1.0):
    return (torch.randn(shape, dtype=torch.float64) * std + 0.2).to(device=device, dtype=dtype)


# (function, input shape, weight shape, bias, kwargs)
CASES = {
    "conv2d-3x3-pad-bias": (F.conv2d, (2, 8, 7, 6), (6, 8, 3, 3), True, {"padding": 1}),
    "conv2d-strided-dilated-groups": (F.conv2d, (1, 8, 9, 8), (4, 4, 3, 2), False,
                                      {"stride": (2, 1), "padding": (1, 0), "dilation": (1, 2), "groups": 2}),
    "conv3d": (F.conv3d, (1, 8, 4, 5, 6), (4, 8, 3, 3, 3), True, {"stride": (1, 2, 1), "padding": 1}),
    "conv1d-nlc": (F.conv1d, (2, 8, 11), (6, 8, 3), True, {"padding": 2, "dilation": 2}),
    # weight [C_in of x, C_out / groups, kH, kW]
    "conv-transpose2d-stride2-bias": (F.conv_transpose2d, (2, 6, 5, 4), (6, 4, 3, 3), True,
                                      {"stride": 2, "padding": 1, "output_padding": 1}),
    "conv-transpose2d-stride1": (F.conv_transpose2d, (2, 6, 5, 4), (6, 5, 3, 3), False, {"padding": 1}),
    "conv-transpose2d-groups-dilated": (F.conv_transpose2d, (1, 8, 4, 5), (8, 3, 2, 3), False,
                                        {"stride": (1, 2), "padding": (0, 1), "groups": 2, "dilation": (2, 1)}),
    "conv1d-causal-nlc-bias": (F.conv1d_causal, (2, 8, 11), (6, 8, 3), True, {"dilation": 2}),
    "conv1d-causal-nlc-strided-groups": (F.conv1d_causal, (1, 8, 13), (6, 4, 4), False, {"stride": 3, "groups": 2}),
    "conv2d-bias-relu": (F.conv2d_bias_relu, (2, 8, 7, 6), (6, 8, 3, 3), True, {"padding": 1, "stride": (1, 2)}),
}
# the op each function's kernel computes
OPS = {F.conv1d: "Conv1dFwd", F.conv2d: "Conv2dFwd", F.conv3d: "Conv3dFwd", F.conv_transpose2d: "Conv2dTranspose",
       F.conv1d_causal: "Conv1dCausal", F.conv2d_bias_relu: "Conv2dBiasRelu"}


def _out_channels(fn, w_shape, kwargs) -> int:
    """The output's channels (the bias's length): conv_transpose2d's weight is [C_in, C_out / groups, ...]."""
    return w_shape[1] * kwargs.get("groups", 1) if fn is F.conv_transpose2d else w_shape[0]


def _case(name, weight_channels_last=False, input_channels_last=True):
    fn, x_shape, w_shape, bias, kwargs = CASES[name]
    torch.manual_seed(hash(name) % 2**31)
    x, w = _randn(*x_shape), _randn(*w_shape, std=1 / math.sqrt(math.prod(w_shape[1:])))
    w = _channels_last(w) if weight_channels_last else w
    x = _channels_last(x) if input_channels_last else x
    return fn, x, w, _randn(_out_channels(fn, w_shape, kwargs)) if bias else None, kwargs


def _layout_cases():
    """(input, weight) pairs in every layout, sizes of 1 among them (a 1x1 weight, one channel, one
    position), whose strides alone tell torch their layout."""
    cl = torch.channels_last
    x, w3, w1 = torch.randn(2, 8, 5, 5), torch.randn(4, 8, 3, 3), torch.randn(4, 8, 1, 1)
    x1, k3, k1 = torch.randn(2, 8, 9), torch.randn(4, 8, 3), torch.randn(4, 8, 1)
    return [
        (x, w3), (x.to(memory_format=cl), w3), (x, w3.to(memory_format=cl)), (x, w1),
        (x, w1.to(memory_format=cl)),  # as model.to(memory_format=channels_last) converts a 1x1 weight
        (torch.randn(2, 1, 5, 5).to(memory_format=cl), torch.randn(4, 1, 3, 3)),
        (torch.randn(2, 8, 1, 1).to(memory_format=cl), w1), (x[..., ::2], w3),
        (x1, k3), (_channels_last(x1), k3), (x1, _channels_last(k3)), (x1, k1),
        (x1, torch.empty_strided(k1.shape, (8, 1, 8)).copy_(k1)),  # a 1-tap weight stored NLC
    ]


@pytest.mark.parametrize("case", range(len(_layout_cases())))
def test_the_output_layout_is_torch_s(case):
    """layouts.torch_output_layout against torch's CPU convolutions in fp32, which follow the GPU's
    rule (channels last where the input or the weight suggests it; conv1d's, where its weight does)."""
    from npuops_conv.layouts import CHANNELS_LAST, torch_output_layout
    from torch._prims_common import suggest_memory_format

    x, w = _layout_cases()[case]
    y = (TF.conv1d if x.dim() == 3 else TF.conv2d)(x, w)
    returned = y.unsqueeze(2) if y.dim() == 3 else y  # conv1d's output: its conv2d's, squeezed
    assert (torch_output_layout(x, w) == CHANNELS_LAST) == (suggest_memory_format(returned) == torch.channels_last)


@pytest.fixture
def received(monkeypatch):
    """Our forward and gradient kernels built for TileLang's CPU target; what each launch hands the
    kernel itself, per op (a list of the tensors by name, one per launch, with what the kernel
    returned as "output")."""
    seen: dict[str, list] = {}
    with use_cpu_target_kernels(monkeypatch, {**FORWARD, **GRADIENTS},
                                lambda op, tensors: seen.setdefault(op, []).append(tensors)):
        yield seen


@pytest.mark.parametrize("weight_channels_last", [False, True], ids=["weight-nchw", "weight-channels-last"])
@pytest.mark.parametrize("name", CASES)
def test_channels_last_input_runs_our_kernel_on_its_own_storage(name, weight_channels_last, received):
    fn, x, w, b, kwargs = _case(name, weight_channels_last)
    want = _torch(fn)(x, w, b, **kwargs)
    if fn is F.conv2d_bias_relu:  # the ReLU has something to do
        assert (want == 0).any() and (want > 0).any()
    reset_coverage()
    for call in range(2):  # the first call makes the plan, the second takes the drop-in's fast path
        y = fn(x, w, b, **kwargs)
        (seen,) = received.pop(OPS[fn])
        # the kernel read x's storage as it is: [N, *spatial, C], no copy
        assert _shares_storage(seen["input"], x) and seen["input"].shape == x.movedim(1, -1).shape
        assert _shares_storage(seen["weight"], w) == weight_channels_last
        _check_output(fn, x, w, y, want, seen["output"])
    assert coverage()[_function(fn, b)] == {"ours": 2, "torch": 0, "why": {}}


def _check_output(fn, x, w, y, want, written):
    """``y``, what the function returned (its kernel ``written``), is torch's ``want`` in shape,
    dtype and values, in torch's layout (the GPU's, see _returns_channels_last), the kernel's own
    output or its NC[D]HW view: no copy."""
    assert y.shape == want.shape and y.dtype == want.dtype
    torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-4)
    assert y.data_ptr() == written.data_ptr() and y.numel() == written.numel()
    if _returns_channels_last(fn, x, w):
        assert _is_channels_last(y)
    else:
        assert y.is_contiguous()
        assert y.view(len(y), -1).shape == want.view(len(want), -1).shape
    # torch's CPU conv1d/conv2d/conv_transpose2d follow the GPU's rule (its conv3d, by dtype and
    # shape, not always)
    if x.dim() < 5:
        assert y.stride() == want.stride()


@pytest.mark.parametrize("weight_channels_last", [False, True], ids=["weight-nchw", "weight-channels-last"])
@pytest.mark.parametrize("name", CASES)
def test_contiguous_input_is_converted_and_the_output_laid_out_as_torch_s(name, weight_channels_last, received):
    fn, x, w, b, kwargs = _case(name, weight_channels_last, input_channels_last=False)
    want = _torch(fn)(x, w, b, **kwargs)
    reset_coverage()
    for call in range(2):  # the plan's call, then the fast path's
        y = fn(x, w, b, **kwargs)
        (seen,) = received.pop(OPS[fn])
        assert not _shares_storage(seen["input"], x) and seen["input"].is_contiguous()  # a channels-last copy
        _check_output(fn, x, w, y, want, seen["output"])
    assert coverage()[_function(fn, b)] == {"ours": 2, "torch": 0, "why": {}}


# Each forward kernel on the CPU target (the plans above take a GEMM): split-K, its fixed-order sum
# writing the output; the direct kernel.
KERNELS = {
    "split-k": {"kernel": "split_k", "block_M": 16, "block_N": 8, "block_K": 8, "num_stages": 1, "threads": 128,
                "splits": 3},
    "direct": {"kernel": "direct", "block_M": 16, "block_N": 8, "block_K": 0, "num_stages": 0, "threads": 128},
}


@pytest.mark.parametrize("input_channels_last", [False, True], ids=["nchw", "channels-last"])
@pytest.mark.parametrize("name", ["conv2d-3x3-pad-bias", "conv3d"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_each_kernel_writes_the_output_in_torch_s_layout(kernel, name, input_channels_last, monkeypatch):
    fn, x, w, b, kwargs = _case(name, input_channels_last=input_channels_last)
    want = _torch(fn)(x, w, b, **kwargs)
    written = []
    specs = {OPS[fn]: lambda op, workload: forward_spec(op, workload, **KERNELS[kernel])}
    with use_cpu_target_kernels(monkeypatch, specs, lambda op, tensors: written.append(tensors["output"])):
        y = fn(x, w, b, **kwargs)
    assert coverage()[_function(fn, b)] == {"ours": 1, "torch": 0, "why": {}}
    _check_output(fn, x, w, y, want, *written)


def test_the_fast_path_keeps_a_kernel_per_output_layout(received):
    """One signature of shapes, in either layout, call after call: each runs ours (the fast path
    keyed by the tensors' strides too) and returns torch's layout."""
    fn, x, w, b, kwargs = _case("conv2d-3x3-pad-bias", input_channels_last=False)
    want = _torch(fn)(x, w, b, **kwargs)
    reset_coverage()
    for input in (x, _channels_last(x), x, _channels_last(x)):
        y = fn(input, w, b, **kwargs)
        assert _is_channels_last(y) == _is_channels_last(input) and y.is_contiguous() != _is_channels_last(input)
        torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-4)
    assert coverage()["conv2d_bias"] == {"ours": 4, "torch": 0, "why": {}}
    assert len(received["Conv2dFwd"]) == 4


def test_an_input_in_neither_layout_runs_torch(received):
    fn, x, w, b, kwargs = _case("conv2d-3x3-pad-bias")
    strided = torch.cat([x, x], -1)[..., ::2]  # neither NCHW- nor channels-last-contiguous
    reset_coverage()
    torch.testing.assert_close(fn(strided, w, b, **kwargs), TF.conv2d(strided, w, b, **kwargs))
    assert coverage()["conv2d_bias"]["why"] == {"non-contiguous or misaligned input": 1}
    assert "Conv2dFwd" not in received


@pytest.mark.parametrize("api", ["fp32_precision", "allow_tf32"])
def test_float32_with_tf32_off_runs_torch_s_ieee_convolution(api, received):
    """Our float32 kernels run TF32, as cuDNN does by default; a user who turns TF32 off (either
    API) gets torch's IEEE float32 convolution, the fast path's signature too, and ours again
    when it is back on."""
    from npuops_conv.functional import _IEEE

    fn, x, w, b, kwargs = _case("conv2d-3x3-pad-bias")
    assert x.dtype == torch.float32
    reset_coverage()
    fn(x, w, b, **kwargs)  # ours; the signature's fast call filed
    saved = torch.backends.cudnn.allow_tf32  # restored through the legacy API: both APIs read it again
    try:
        if api == "fp32_precision":
            torch.backends.cudnn.conv.fp32_precision = "ieee"
        else:
            torch.backends.cudnn.allow_tf32 = False
        for _ in range(2):
            torch.testing.assert_close(fn(x, w, b, **kwargs), TF.conv2d(x, w, b, **kwargs))
    finally:
        torch.backends.cudnn.allow_tf32 = saved
    fn(x, w, b, **kwargs)
    assert coverage()["conv2d_bias"] == {"ours": 2, "torch": 2, "why": {_IEEE: 2}}


def _fp8(*shape, std=1.0):
    return _randn(*shape, std=std).to(torch.float8_e4m3fn)


@pytest.mark.parametrize("weight_layout", ["channels-last", "nchw"], ids=lambda layout: f"weight-{layout}")
@pytest.mark.parametrize("layout", ["channels-last", "nchw"])
def test_fp8_input_is_routed_to_our_kernel_in_its_layout(layout, weight_layout, monkeypatch):
    """conv2d_fp8: the CPU target builds no fp8 GEMM (nor any of 16-bit tiles), so a stand-in of the
    kernel (the op's formulation on the channels-last tensors the kernel takes, its output in the
    layout the kernel is asked for) checks the routing: a channels-last fp8 input reaches the kernel
    as it is, an NCHW one converted, the scales passed, the bf16 output in torch's layout (the
    kernel's own output or its view) and values. Our fp8 kernel's arithmetic: the GPU tests."""
    seen = []
    torch.manual_seed(5)
    x, w = _fp8(2, 16, 6, 5), _fp8(8, 16, 3, 3, std=0.5)
    x = _channels_last(x) if layout == "channels-last" else x
    w = _channels_last(w) if weight_layout == "channels-last" else w
    x_scale, w_scale = torch.tensor(0.75), torch.tensor(0.125)
    kwargs = {"padding": 1, "stride": (1, 2)}
    want = TF.conv2d(x.to(torch.bfloat16) * x_scale, w.to(torch.bfloat16) * w_scale, None, **kwargs)
    with use_cpu_target_kernels(monkeypatch, {"Conv2dFp8Fwd": fp8_stand_in}, lambda op, tensors: seen.append(tensors)):
        for _ in range(2):  # the plan's call, then the fast path's
            y = F.conv2d_fp8(x, w, x_scale, w_scale, **kwargs)
            tensors = seen[-1]
            assert _shares_storage(tensors["input"], x) == (layout == "channels-last")
            assert tensors["input"].shape == x.movedim(1, -1).shape and tensors["input"].is_contiguous()
            assert _shares_storage(tensors["weight"], w) == (weight_layout == "channels-last")
            assert tensors["x_scale"] is x_scale and tensors["w_scale"] is w_scale
            assert y.dtype == torch.bfloat16
            _check_output(F.conv2d_fp8, x, w, y, want, tensors["output"])
    assert coverage()["conv2d_fp8"] == {"ours": 2, "torch": 0, "why": {}}


@pytest.mark.parametrize("weight_channels_last", [False, True], ids=["weight-nchw", "weight-channels-last"])
@pytest.mark.parametrize("name", ["conv2d-3x3-pad-bias", "conv2d-strided-dilated-groups"])
def test_channels_last_gradients_run_our_gradient_kernels(name, weight_channels_last, received):
    _, x, w, b, kwargs = _case(name, weight_channels_last)
    results = []
    for functions in (F, TF):
        leaves = [t.detach().clone(memory_format=torch.preserve_format).requires_grad_()
                  for t in (x, w, *([b] if b is not None else []))]
        y = functions.conv2d(leaves[0], leaves[1], leaves[2] if b is not None else None, **kwargs)
        upstream = _channels_last(torch.linspace(-1, 1, y.numel()).view(y.shape))  # a channels-last model's
        (y * upstream).sum().backward()
        results.append((y.detach(), [t.grad for t in leaves]))
        if functions is F:
            wgrad = f"conv2d_wgrad{'_bias' if b is not None else ''}"
            ran = coverage()
            assert all(ran[f]["ours"] == 1 and ran[f]["torch"] == 0 for f in (_function(TF.conv2d, b), "conv2d_dgrad", wgrad)), ran
            (seen,) = received["Conv2dWgrad"]
            assert _shares_storage(seen["input"], leaves[0])  # the saved channels-last input, no copy
            reset_coverage()
    (y, grads), (want_y, want_grads) = results
    torch.testing.assert_close(y, want_y, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(grads, want_grads, rtol=1e-4, atol=1e-4)
    assert _is_channels_last(grads[0])  # the input's gradient in its layout, as torch gives it


@pytest.fixture(autouse=True)
def _fresh_coverage():
    reset_coverage()


# -- on a GPU -------------------------------------------------------------------------------------
def _close(got, want, tolerance, what):
    """Within ``tolerance`` of rms(want) + |want| elementwise (as the conv kernels' tests measure)."""
    err = (got.float() - want).abs()
    allowed = tolerance * (want.square().mean().sqrt() + want.abs())
    assert not got.isnan().any() and (err <= allowed).all(), f"{what}: max error {err.max().item():.3g}"


GPU_CASES = {
    "conv2d-3x3-64": (F.conv2d, (8, 64, 28, 28), (64, 64, 3, 3), True, {"padding": 1}),
    "conv2d-1x1-stride2": (F.conv2d, (4, 128, 14, 14), (64, 128, 1, 1), False, {"stride": 2}),
    "conv2d-depthwise": (F.conv2d, (4, 96, 28, 28), (96, 1, 3, 3), True, {"groups": 96, "padding": 1}),
    "conv3d-3x3x3": (F.conv3d, (2, 32, 8, 16, 16), (64, 32, 3, 3, 3), True, {"padding": 1}),
    "conv1d-nlc": (F.conv1d, (4, 256, 128), (256, 256, 3), True, {"padding": 1}),
    "conv-transpose2d-stride2": (F.conv_transpose2d, (4, 128, 14, 14), (128, 64, 3, 3), True,
                                 {"stride": 2, "padding": 1, "output_padding": 1}),
    "conv1d-causal-nlc": (F.conv1d_causal, (4, 256, 128), (256, 256, 3), True, {"dilation": 2}),
    "conv2d-bias-relu": (F.conv2d_bias_relu, (8, 64, 28, 28), (64, 64, 3, 3), True, {"padding": 1}),
}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("name", GPU_CASES)
def test_channels_last_runs_our_kernels_without_conversion_on_the_gpu(name, dtype, monkeypatch):
    from npuops_conv import layouts

    fn, x_shape, w_shape, bias, kwargs = GPU_CASES[name]
    torch.manual_seed(17)
    x = _channels_last(_randn(*x_shape, dtype=dtype, device="cuda"))
    w = _channels_last(_randn(*w_shape, dtype=dtype, device="cuda", std=1 / math.sqrt(math.prod(w_shape[1:]))))
    b = _randn(_out_channels(fn, w_shape, kwargs), dtype=dtype, device="cuda") if bias else None
    converted = []  # what the kernels' binding converts to channels last (see layouts.ChannelsLastCache)
    convert = layouts.channels_last
    monkeypatch.setattr(layouts, "channels_last", lambda t: converted.append(t.shape) or convert(t))
    reset_coverage()
    for _ in range(2):  # the plan's call, then the fast path's
        y = fn(x, w, b, **kwargs)
    assert coverage()[_function(fn, b)] == {"ours": 2, "torch": 0, "why": {}}, coverage()
    assert converted == []
    want = _torch(fn)(x.float(), w.float(), None if b is None else b.float(), **kwargs)
    assert y.shape == want.shape and y.dtype == dtype and _is_channels_last(y)
    assert y.stride() == _torch(fn)(x, w, b, **kwargs).stride()
    _close(y, want, 3e-2, "output")
    if fn is not F.conv2d:
        return
    # gradients: our gradient kernels on the channels-last input and gradient, nothing converted
    leaves = [t.detach().clone(memory_format=torch.preserve_format).requires_grad_() for t in (x, w)]
    reset_coverage()
    y = fn(*leaves, b, **kwargs)
    upstream = _channels_last(_randn(*y.shape, dtype=dtype, device="cuda") / math.sqrt(y[0, 0].numel()))
    y.backward(upstream)
    ran = coverage()
    assert all(counts["torch"] == 0 for counts in ran.values()), ran
    assert {f for f in ran if f.startswith(("conv2d_dgrad", "conv2d_wgrad"))} == {"conv2d_dgrad", "conv2d_wgrad"}
    assert converted == []
    refs = [t.detach().float().requires_grad_() for t in (x, w)]
    getattr(TF, fn.__name__)(*refs, None if b is None else b.float(), **kwargs).backward(upstream.float())
    for got, ref, what in zip((leaves[0].grad, leaves[1].grad), refs, ("input", "weight")):
        assert got.dtype == dtype
        _close(got, ref.grad, 3e-2, f"gradient of {what}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("name", GPU_CASES)
def test_contiguous_inputs_get_torch_s_contiguous_output_on_the_gpu(name, dtype):
    """NC[D]HW-contiguous input and weight: our kernel (converting the input) writes the output
    NC[D]HW-contiguous itself, torch's strides (conv_transpose2d's: its data-gradient kernel's
    stride phases)."""
    fn, x_shape, w_shape, bias, kwargs = GPU_CASES[name]
    torch.manual_seed(19)
    x = _randn(*x_shape, dtype=dtype, device="cuda")
    w = _randn(*w_shape, dtype=dtype, device="cuda", std=1 / math.sqrt(math.prod(w_shape[1:])))
    b = _randn(_out_channels(fn, w_shape, kwargs), dtype=dtype, device="cuda") if bias else None
    reset_coverage()
    for _ in range(2):  # the plan's call, then the fast path's
        y = fn(x, w, b, **kwargs)
    assert coverage()[_function(fn, b)] == {"ours": 2, "torch": 0, "why": {}}, coverage()
    want = _torch(fn)(x.float(), w.float(), None if b is None else b.float(), **kwargs)
    assert y.shape == want.shape and y.dtype == dtype and y.is_contiguous()
    assert y.stride() == _torch(fn)(x, w, b, **kwargs).stride()
    assert y.view(len(y), -1).shape == want.view(len(want), -1).shape
    _close(y, want, 3e-2, "output")


@pytest.mark.gpu
@pytest.mark.parametrize("name, stride", [("3x3", 1), ("3x3-stride2", 2)])
def test_channels_last_fp8_runs_our_kernel_without_conversion_on_the_gpu(name, stride, monkeypatch):
    """conv2d_fp8 of a channels-last e4m3 input and weight: our kernel on their storage, a bf16
    channels-last output as torch's formulation (dequantized to bf16) returns."""
    from npuops_conv import layouts

    torch.manual_seed(23)
    x = _channels_last(_randn(4, 64, 28, 28, device="cuda").to(torch.float8_e4m3fn))
    w = _channels_last(_randn(64, 64, 3, 3, device="cuda").to(torch.float8_e4m3fn))
    x_scale = torch.tensor(0.5, device="cuda")
    w_scale = torch.tensor(1 / math.sqrt(64 * 9), device="cuda")
    converted = []
    convert = layouts.channels_last
    monkeypatch.setattr(layouts, "channels_last", lambda t: converted.append(t.shape) or convert(t))
    reset_coverage()
    for _ in range(2):  # the plan's call, then the fast path's
        y = F.conv2d_fp8(x, w, x_scale, w_scale, stride=stride, padding=1)
    assert coverage()["conv2d_fp8"] == {"ours": 2, "torch": 0, "why": {}}, coverage()
    assert converted == []
    formulation = TF.conv2d(x.to(torch.bfloat16) * x_scale, w.to(torch.bfloat16) * w_scale, None, stride, 1)
    want = TF.conv2d(x.float() * x_scale, w.float() * w_scale, None, stride, 1)
    assert y.shape == want.shape and y.dtype == torch.bfloat16 and _is_channels_last(y)
    assert y.stride() == formulation.stride()
    _close(y, want, 3e-2, "output")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["f16", "f32"])
@pytest.mark.parametrize(("x_shape", "w_shape", "groups"), [((1, 1, 4, 4, 4), (1, 1, 4, 4, 4), 1),
                                                             ((1, 1, 5, 5, 5), (1, 1, 3, 3, 3), 1),
                                                             ((3, 9, 3, 1, 9), (3, 3, 3, 1, 9), 3)])
def test_small_conv3d_with_bias_runs_ours_channels_first_on_the_gpu(x_shape, w_shape, groups, dtype):
    """OpInfo's small conv3d samples with a bias, NCDHW: the direct kernel writing the output
    channels first. Their launch sizes are read by position (a macro renamed the one-position
    output's ``batch``, and the launch failed to torch with a warning)."""
    import warnings

    torch.manual_seed(23)
    x = _randn(*x_shape, dtype=dtype, device="cuda")
    w = _randn(*w_shape, dtype=dtype, device="cuda")
    b = _randn(w_shape[0], dtype=dtype, device="cuda")
    reset_coverage()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for _ in range(2):
            y = F.conv3d(x, w, b, groups=groups)
    assert coverage()["conv3d_bias"] == {"ours": 2, "torch": 0, "why": {}}, coverage()
    _close(y, TF.conv3d(x.double(), w.double(), b.double(), groups=groups), 3e-2, "output")
