"""Each op's reference against an independent formulation (windows + matmul in f64, autograd of
it for the gradients, the adjoint identity for the transposed conv)."""

import math

import pytest
import torch
from conv_oracle import SMALL_CASES, small, unfold_conv

from npuops import InputRNG
from npuops_conv.plugin import npuops_ops

OPS = {op.name: op for op in npuops_ops()}
FORWARD = ["Conv1dFwd", "Conv2dFwd", "Conv3dFwd", "Conv2dBiasRelu", "Conv1dCausal", "DepthwiseConv2d",
           "PointwiseConv2d", "GroupedConv2d", "DilatedConv2d"]


def cases(*names):
    return [pytest.param(name, shapes, params, id=f"{name}-{case}")
            for name in names for case, shapes, params in SMALL_CASES[name]]


def build(name, shapes, params, dtype="f64", seed=0):
    op = OPS[name]
    w = small(name, dtype, shapes, **params)
    op.validate(w)
    return op, w, op.make_inputs(w, InputRNG("cpu", seed))


def window_args(params):
    """stride, padding, dilation, groups as the workload states them (PyTorch defaults else)."""
    return (params.get("stride", 1), params.get("padding", 0), params.get("dilation", 1), params.get("groups", 1))


def assert_close(actual, expected):
    assert actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name, shapes, params", cases(*FORWARD))
def test_forward_reference_matches_unfold_conv(name, shapes, params):
    op, w, inputs = build(name, shapes, params)
    x, weight, bias = inputs["input"], inputs["weight"], inputs.get("bias")
    assert (bias is not None) == params.get("bias", False)
    stride, padding, dilation, groups = window_args(params)
    pad_after = padding
    if name == "DepthwiseConv2d":
        groups = x.shape[1]
    if name == "PointwiseConv2d":
        assert weight.shape[2:] == (1, 1)
    if name == "Conv1dCausal":
        padding, pad_after = dilation * (weight.shape[-1] - 1), 0
    expected = unfold_conv(x, weight, bias, stride, padding, pad_after, dilation, groups)
    if name == "Conv2dBiasRelu":
        expected = expected.clamp_min(0)
        assert (expected == 0).any() and (expected > 0).any()
    if name == "Conv1dCausal":
        assert expected.shape[-1] == math.ceil(x.shape[-1] / stride)
    assert_close(op.reference(inputs, w), expected)


@pytest.mark.parametrize("name, shapes, params", cases("Conv1dCausal"))
def test_causal_output_ignores_the_future(name, shapes, params):
    op, w, inputs = build(name, shapes, params)
    stride = params.get("stride", 1)
    before = op.reference(inputs, w)
    t = before.shape[-1] // 2
    inputs["input"][..., t * stride + 1:] += 1.0  # change only inputs after output t's last tap
    after = op.reference(inputs, w)
    assert_close(after[..., : t + 1], before[..., : t + 1])
    assert not torch.equal(after[..., t + 1:], before[..., t + 1:])


@pytest.mark.parametrize("name, shapes, params", cases("Conv2dFp8Fwd"))
def test_fp8_reference_is_the_conv_of_the_dequantized_values(name, shapes, params):
    op, w, inputs = build(name, shapes, params, dtype="fp8e4m3")
    assert inputs["input"].dtype == torch.float8_e4m3fn and inputs["x_scale"].shape == ()
    x = inputs["input"].double() * inputs["x_scale"].double()
    weight = inputs["weight"].double() * inputs["w_scale"].double()
    stride, padding, dilation, groups = window_args(params)
    expected = unfold_conv(x, weight, None, stride, padding, None, dilation, groups)
    reference = op.reference(inputs, w)
    assert reference.dtype == torch.float32
    torch.testing.assert_close(reference.double(), expected, rtol=1e-5, atol=1e-5 * float(expected.abs().max()))
    assert 0.25 < float(expected.square().mean().sqrt()) < 4  # scales chosen for O(1) outputs


def forward_conv_of(params, bias=None):
    stride, padding, dilation, groups = window_args(params)
    return lambda x, weight: unfold_conv(x, weight, bias, stride, padding, None, dilation, groups)


@pytest.mark.parametrize("name, shapes, params", cases("Conv2dDgrad"))
def test_dgrad_reference_is_the_autograd_input_gradient(name, shapes, params):
    op, w, inputs = build(name, shapes, params)
    grad_output, weight = inputs["grad_output"], inputs["weight"]
    x = torch.zeros(shapes["input"], dtype=torch.float64, requires_grad=True)
    y = forward_conv_of(params)(x, weight)
    (expected,) = torch.autograd.grad(y, x, grad_output)
    assert_close(op.reference(inputs, w), expected)


@pytest.mark.parametrize("name, shapes, params", cases("Conv2dWgrad"))
def test_wgrad_reference_is_the_autograd_weight_and_bias_gradient(name, shapes, params):
    op, w, inputs = build(name, shapes, params)
    x, grad_output = inputs["input"], inputs["grad_output"]
    groups = params.get("groups", 1)
    weight = torch.zeros(params["C_out"], x.shape[1] // groups, params["kH"], params["kW"],
                         dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(params["C_out"], dtype=torch.float64, requires_grad=True)
    with_bias = params.get("bias", False)
    y = forward_conv_of(params, bias if with_bias else None)(x, weight)
    wanted = (weight, bias) if with_bias else (weight,)
    expected = torch.autograd.grad(y, wanted, grad_output)
    reference = op.reference(inputs, w)
    reference = reference if isinstance(reference, tuple) else (reference,)
    assert len(reference) == len(expected)
    for got, want in zip(reference, expected, strict=True):
        assert_close(got, want)


@pytest.mark.parametrize("name, shapes, params", cases("Conv2dTranspose"))
def test_transpose_reference_is_the_adjoint_of_the_forward_conv(name, shapes, params):
    op, w, inputs = build(name, shapes, params)
    y, weight, bias = inputs["input"], inputs["weight"], inputs.get("bias")
    stride, padding, dilation, _ = window_args(params)
    stride, padding, dilation, output_padding = (
        [v] * 2 if isinstance(v, int) else v for v in (stride, padding, dilation, params.get("output_padding", 0))
    )
    size = [(o - 1) * s - 2 * p + d * (k - 1) + op_ + 1
            for o, s, p, d, k, op_ in zip(y.shape[2:], stride, padding, dilation, weight.shape[2:], output_padding)]
    expected_shape = (y.shape[0], params["C_in"], *size)
    conv = forward_conv_of(params)
    transposed = op.reference(inputs, w)
    assert transposed.shape == expected_shape
    unbiased = transposed - (0 if bias is None else bias.reshape(1, -1, 1, 1))
    # <conv(x), y> == <x, conv_transpose(y)> for every x: compare the gradient in x of the left side
    x = torch.randn(expected_shape, dtype=torch.float64, requires_grad=True)
    (adjoint,) = torch.autograd.grad((conv(x, weight) * y).sum(), x)
    assert_close(unbiased, adjoint)
    torch.testing.assert_close((conv(x, weight) * y).sum(), (x * unbiased).sum())
