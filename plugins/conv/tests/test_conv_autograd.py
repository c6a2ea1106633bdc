"""Gradients through the conv functions: ``npuops_conv.conv2d``'s backward (and
``conv_transpose2d``'s) runs our gradient ops as functions, Conv2dDgrad for the input's gradient and
Conv2dWgrad for the weight's and the bias's (Conv2dFwd for a transposed conv's input gradient),
asking only for the gradients autograd wants. Checked against torch's autograd in fp32 (fresh
random inputs, geometries of every kind), a gradcheck in fp64, under torch.compile; the same with
our gradient kernels built for TileLang's CPU target in place of the GPU's (the functions' wiring of
the kernels, checked without a GPU); and on a GPU (marker ``gpu``) our kernels, forward and
backward, against torch in bf16 and f16."""

from __future__ import annotations

import dataclasses
import math

import npuops_conv as F
import pytest
import torch
import torch.nn.functional as TF
from conv_cpu_kernels import GRADIENTS, use_cpu_target_kernels
from npuops.functional import coverage, reset_coverage


@dataclasses.dataclass(frozen=True)
class Case:
    """``conv2d`` of an input ``shape`` by a ``c_out`` x ``kernel`` weight, with ``kwargs``."""

    name: str
    shape: tuple
    c_out: int
    kernel: tuple = (3, 3)
    bias: bool = True
    kwargs: dict = dataclasses.field(default_factory=dict)

    def weight_shape(self):
        return (self.c_out, self.shape[-3] // self.kwargs.get("groups", 1), *self.kernel)


CASES = [
    Case("3x3-pad1", (2, 4, 9, 8), 6, kwargs={"padding": 1}),
    Case("no-bias", (2, 4, 9, 8), 6, bias=False, kwargs={"padding": 1}),
    Case("stride2-drops-rows", (2, 3, 10, 9), 5, bias=False, kwargs={"stride": 2, "padding": 1}),
    Case("stride-per-dim-dilated", (2, 3, 11, 10), 4, (3, 2), kwargs={"stride": (2, 3), "padding": (1, 0),
                                                                        "dilation": (1, 2)}),
    Case("groups", (1, 6, 8, 8), 9, kwargs={"groups": 3, "padding": 2, "dilation": 2}),
    Case("depthwise-stride2", (2, 4, 9, 7), 4, bias=False, kwargs={"groups": 4, "stride": 2, "padding": 1}),
    Case("pointwise", (3, 8, 5, 5), 4, (1, 1)),
    Case("5x5-same", (1, 3, 9, 9), 4, (5, 5), kwargs={"padding": "same"}),
    Case("unbatched", (4, 9, 8), 6, kwargs={"padding": 1}),
    Case("unbatched-strided-no-bias", (3, 10, 11), 2, bias=False, kwargs={"stride": 3}),
]


def _randn(*shape, dtype=torch.float32, device="cpu", std=1.0, mean=0.0, generator=None):
    return (torch.randn(shape, dtype=torch.float64, generator=generator) * std + mean).to(device=device, dtype=dtype)


def _inputs(case, dtype=torch.float32, device="cpu", seed=None):
    """Fresh random input, weight, bias and output gradient (``seed``: fixed ones)."""
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    weight_shape = case.weight_shape()
    fan_in = math.prod(weight_shape[1:])
    x = _randn(*case.shape, dtype=dtype, device=device, std=1.5, mean=0.3, generator=gen)
    w = _randn(*weight_shape, dtype=dtype, device=device, std=1 / math.sqrt(fan_in), generator=gen)
    b = _randn(case.c_out, dtype=dtype, device=device, generator=gen) if case.bias else None
    out_shape = TF.conv2d(x.double().cpu(), w.double().cpu(), None, **case.kwargs).shape
    upstream = _randn(*out_shape, dtype=torch.float64, generator=gen)
    return x, w, b, upstream


def _gradients(functions, case, x, w, b, upstream, wants=("x", "w", "b")):
    """(y, the gradients of the tensors named in ``wants``) of ``functions.conv2d``."""
    leaves = {"x": x, "w": w, "b": b}
    leaves = {k: v.detach().clone().requires_grad_(k in wants) if v is not None else None for k, v in leaves.items()}
    y = functions.conv2d(leaves["x"], leaves["w"], leaves["b"], **case.kwargs)
    (y * upstream.to(y)).sum().backward()
    return y.detach(), {k: v.grad for k, v in leaves.items() if v is not None and k in wants}


def _assert_same(ours, theirs, **tolerance):
    (y, grads), (want_y, want_grads) = ours, theirs
    assert y.shape == want_y.shape and y.dtype == want_y.dtype
    torch.testing.assert_close(y, want_y, **tolerance)
    assert grads.keys() == want_grads.keys()
    for name, got in grads.items():
        assert got is not None, f"no gradient of {name}"
        assert got.shape == want_grads[name].shape and got.dtype == want_grads[name].dtype
        torch.testing.assert_close(got, want_grads[name], **tolerance,
                                   msg=lambda m, name=name: f"gradient of {name}: {m}")


def _backward_calls():
    """Calls of the gradient functions since reset_coverage(): {function: (ours, torch's)}."""
    return {name: (counts["ours"], counts["torch"]) for name, counts in coverage().items()
            if name.startswith(("conv2d_dgrad", "conv2d_wgrad"))}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_gradients_match_torch_through_our_backward_functions(case):
    x, w, b, upstream = _inputs(case)  # fresh random values each run
    reset_coverage()
    ours = _gradients(F, case, x, w, b, upstream)
    # the gradients came through our backward functions (torch's formulation on the CPU), not
    # through torch's derivative of the forward op
    assert _backward_calls() == {"conv2d_dgrad": (0, 1), f"conv2d_wgrad{'_bias' if case.bias else ''}": (0, 1)}
    _assert_same(ours, _gradients(TF, case, x, w, b, upstream))


@pytest.mark.parametrize("wants, calls", [
    (("x",), {"conv2d_dgrad": (0, 1)}),
    (("w",), {"conv2d_wgrad": (0, 1)}),
    (("b",), {}),
    (("w", "b"), {"conv2d_wgrad_bias": (0, 1)}),
    (("x", "b"), {"conv2d_dgrad": (0, 1)}),
], ids=["input", "weight", "bias", "weight-bias", "input-bias"])
def test_only_the_gradients_autograd_asks_for_are_computed(wants, calls):
    case = CASES[3]  # strided, dilated, with a bias
    x, w, b, upstream = _inputs(case)
    reset_coverage()
    ours = _gradients(F, case, x, w, b, upstream, wants)
    assert _backward_calls() == calls
    _assert_same(ours, _gradients(TF, case, x, w, b, upstream, wants))


@pytest.mark.parametrize("kwargs, groups", [
    ({}, 1),
    ({"stride": 2, "padding": 1, "output_padding": 1}, 1),
    ({"stride": (2, 3), "padding": (0, 1), "dilation": 2}, 2),
], ids=["plain", "stride2-output-padding", "strided-dilated-groups"])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_conv_transpose2d_gradients_match_torch(kwargs, groups, bias):
    torch.manual_seed(5)
    x, w = _randn(2, 4, 6, 7), _randn(4, 6 // groups, 3, 3, std=0.3)
    b = _randn(6) if bias else None
    reset_coverage()
    results = []
    for functions in (F, TF):
        leaves = [t.clone().requires_grad_() for t in (x, w, *([b] if bias else []))]
        y = functions.conv_transpose2d(leaves[0], leaves[1], leaves[2] if bias else None, groups=groups, **kwargs)
        (y * torch.linspace(-1, 1, y.numel()).view(y.shape)).sum().backward()
        results.append((y.detach(), [t.grad for t in leaves]))
        if functions is F:  # x's gradient by the forward conv, the weight's by the weight gradient
            assert _backward_calls() == {"conv2d_wgrad": (0, 1)}
            assert coverage()["conv2d"]["torch"] == 1, coverage()
    (y, grads), (want_y, want_grads) = results
    torch.testing.assert_close(y, want_y)
    torch.testing.assert_close(grads, want_grads)


@pytest.mark.parametrize("fn, make", [
    (lambda x, w, b: F.conv2d(x, w, b, padding=1), lambda: ((2, 3, 5, 6), (4, 3, 3, 3), 4)),
    (lambda x, w: F.conv2d(x, w, stride=2, dilation=(1, 2)), lambda: ((1, 2, 7, 8), (3, 2, 3, 2), None)),
    (lambda x, w, b: F.conv2d(x, w, b, groups=2, padding=(0, 1)), lambda: ((4, 5, 6), (6, 2, 2, 3), 6)),
    (lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1),
     lambda: ((1, 3, 4, 5), (3, 2, 3, 3), 2)),
], ids=["conv2d-bias", "conv2d-strided-dilated", "conv2d-unbatched-groups", "conv_transpose2d"])
def test_gradcheck_in_float64(fn, make):
    torch.manual_seed(7)
    x_shape, w_shape, bias = make()
    inputs = [torch.randn(x_shape, dtype=torch.float64), torch.randn(w_shape, dtype=torch.float64)]
    if bias is not None:
        inputs.append(torch.randn(bias, dtype=torch.float64))
    reset_coverage()
    assert torch.autograd.gradcheck(fn, [t.requires_grad_() for t in inputs])
    assert _backward_calls(), "the gradient did not run our backward functions"


def test_works_inside_torch_compile_with_a_gradient():
    torch.manual_seed(3)
    x = _randn(2, 3, 9, 9).requires_grad_()
    w1, b1 = _randn(4, 3, 3, 3, std=0.3).requires_grad_(), _randn(4).requires_grad_()
    w2 = _randn(6, 2, 3, 3, std=0.3).requires_grad_()

    def step(functions, x, w1, b1, w2):
        y = functions.conv2d(x, w1, b1, stride=2, padding=1)
        return functions.conv2d(torch.relu(y), w2, groups=2, dilation=2).square().sum()

    compiled = torch.compile(lambda *args: step(F, *args), fullgraph=True, backend="aot_eager")
    leaves = (x, w1, b1, w2)
    compiled(*leaves).backward()
    got = [t.grad for t in leaves]
    for t in leaves:
        t.grad = None
    step(TF, *leaves).backward()
    torch.testing.assert_close(got, [t.grad for t in leaves])


def test_channels_last_and_non_contiguous_inputs_get_their_gradients():
    case = Case("channels-last", (2, 4, 8, 8), 6, kwargs={"padding": 1, "stride": 2})
    x, w, b, upstream = _inputs(case, seed=4)
    for made in (x.to(memory_format=torch.channels_last), x.transpose(-1, -2).contiguous().transpose(-1, -2)):
        reset_coverage()
        ours = _gradients(F, case, made, w, b, upstream)
        assert set(_backward_calls()) == {"conv2d_dgrad", "conv2d_wgrad_bias"}
        _assert_same(ours, _gradients(TF, case, made, w, b, upstream))


def test_a_gradient_through_a_gradient():
    """Double backward (a gradient penalty): the backward functions are differentiable too."""
    torch.manual_seed(9)
    x, w = _randn(2, 3, 6, 6, dtype=torch.float64), _randn(4, 3, 3, 3, dtype=torch.float64)
    results = []
    for functions in (F, TF):
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = functions.conv2d(xs, ws, stride=2, padding=1)
        (gx,) = torch.autograd.grad(y.square().sum(), xs, create_graph=True)
        gx.square().sum().backward()
        results.append(ws.grad)
    torch.testing.assert_close(*results)


@pytest.mark.parametrize("name", ["dgrad", "wgrad", "wgrad_bias"])
def test_opcheck(name):
    """torch's checks of the gradient functions' custom ops: schemas, fake tensors, their own
    backward (a gradient of a gradient), dispatch under AOT."""
    functions = F.functional
    torch.manual_seed(2)
    x, w, dy = _randn(2, 4, 9, 8), _randn(6, 2, 3, 2, std=0.3), _randn(2, 6, 5, 3)
    geometry = ((2, 2), (1, 0), (1, 2), 2)
    if name == "dgrad":
        fn, args = functions._DGRAD, (x, dy, w.requires_grad_(), *geometry)
    else:
        fn, args = functions._WGRAD[name == "wgrad_bias"], (x.requires_grad_(), dy, 6, 3, 2, *geometry)
    torch.library.opcheck(fn.custom_op, args)


# -- our gradient kernels, through the functions, built for TileLang's CPU target -----------------
@pytest.fixture
def cpu_target_kernels(monkeypatch):
    """Plans of CPU calls of the gradient functions run our gradient kernels built for TileLang's CPU
    target (the direct kernels, which need no tensor cores), as CUDA calls run them built for the GPU."""
    with use_cpu_target_kernels(monkeypatch, GRADIENTS):
        yield


KERNEL_CASES = [c for c in CASES if c.name in ("3x3-pad1", "stride-per-dim-dilated", "depthwise-stride2",
                                               "unbatched-strided-no-bias")]


@pytest.mark.parametrize("case", KERNEL_CASES, ids=lambda c: c.name)
def test_our_gradient_kernels_run_through_the_backward(case, cpu_target_kernels):
    x, w, b, upstream = _inputs(case, seed=11)
    reset_coverage()
    ours = _gradients(F, case, x, w, b, upstream)
    assert _backward_calls() == {"conv2d_dgrad": (1, 0), f"conv2d_wgrad{'_bias' if case.bias else ''}": (1, 0)}
    _assert_same(ours, _gradients(TF, case, x, w, b, upstream), rtol=1e-4, atol=1e-4)


def test_the_input_gradient_comes_in_torch_s_layout(cpu_target_kernels):
    """As the backward hands it over (before AccumulateGrad copies a gradient into its leaf's
    layout): NCHW-contiguous for NCHW tensors, channels last for channels-last ones, written so by
    our data-gradient kernel (no copy)."""
    case = KERNEL_CASES[0]
    x, w, b, upstream = _inputs(case, seed=12)
    for made in (x, x.to(memory_format=torch.channels_last)):
        strides = []
        for functions in (F, TF):
            leaf = made.detach().clone(memory_format=torch.preserve_format).requires_grad_()
            leaf.register_hook(lambda grad: strides.append(grad.stride()))
            (functions.conv2d(leaf, w, b, **case.kwargs) * upstream.to(made)).sum().backward()
        assert strides[0] == strides[1] == made.stride()


# -- on a GPU -------------------------------------------------------------------------------------
GPU_CASES = [
    Case("3x3-64-bias", (8, 64, 28, 28), 64, kwargs={"padding": 1}),
    Case("3x3-stride2", (8, 64, 28, 28), 128, bias=False, kwargs={"stride": 2, "padding": 1}),
    Case("1x1-256", (4, 256, 14, 14), 64, (1, 1)),
    Case("depthwise", (4, 96, 28, 28), 96, kwargs={"groups": 96, "padding": 1}),
]


def _close(got, want, tolerance, what):
    """Within ``tolerance`` of rms(want) + |want| elementwise (as the grad kernels' tests measure)."""
    err = (got.float() - want).abs()
    allowed = tolerance * (want.square().mean().sqrt() + want.abs())
    assert not got.isnan().any() and (err <= allowed).all(), f"{what}: max error {err.max().item():.3g}"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: c.name)
def test_our_kernels_compute_the_gradients_on_the_gpu(case, dtype):
    x, w, b, upstream = _inputs(case, dtype=dtype, device="cuda", seed=13)
    upstream = upstream.cuda() / math.sqrt(upstream[0, 0].numel())
    reset_coverage()
    y, grads = _gradients(F, case, x, w, b, upstream)
    ran = coverage()
    assert all(counts["torch"] == 0 for counts in ran.values()), f"torch's path ran: {ran}"
    assert _backward_calls() == {"conv2d_dgrad": (1, 0), f"conv2d_wgrad{'_bias' if case.bias else ''}": (1, 0)}
    want_y, want = _gradients(TF, case, x.float(), w.float(), None if b is None else b.float(), upstream)
    _close(y, want_y, 3e-2, "output")
    for name, got in grads.items():
        assert got.dtype == dtype
        _close(got, want[name], 3e-2, f"gradient of {name}")
