"""The conv functions for model code: F.*'s arguments and results (OpInfo's samples are in
tests/test_drop_in_conformance.py), the ops torch has no function for, bad input named."""

import pytest
import torch
import torch.nn.functional as F

import npuops_conv as C
from npuops.functional import coverage, reset_coverage

X, W, B = torch.randn(2, 8, 10, 10), torch.randn(16, 8, 3, 3) / 8, torch.randn(16)


@pytest.mark.parametrize("args,kwargs", [
    ((X, W), {}),
    ((X, W, B), {"stride": 2, "padding": 1}),
    ((X, W), {"padding": "same", "dilation": 2}),
    ((X, W), {"padding": "valid"}),
    ((X[0], W, B), {"padding": (1, 2)}),  # unbatched
    ((X, W[:, :4]), {"groups": 2, "dilation": (2, 1), "stride": [1, 2]}),
    ((X.double(), W.double()), {}),
])
def test_conv2d_is_f_conv2d(args, kwargs):
    torch.testing.assert_close(C.conv2d(*args, **kwargs), F.conv2d(*args, **kwargs))


def test_conv1d_and_conv3d_are_fs():
    x1, w1 = torch.randn(2, 4, 20), torch.randn(6, 4, 3)
    torch.testing.assert_close(C.conv1d(x1, w1, None, 1, 1), F.conv1d(x1, w1, None, 1, 1))
    x3, w3 = torch.randn(1, 2, 5, 6, 7), torch.randn(3, 2, 3, 3, 3)
    torch.testing.assert_close(C.conv3d(x3, w3, padding=1, stride=(1, 2, 1)), F.conv3d(x3, w3, padding=1, stride=(1, 2, 1)))


def test_the_ops_torch_has_no_function_for():
    x, w, b = torch.randn(2, 4, 20), torch.randn(6, 4, 3), torch.randn(6)
    torch.testing.assert_close(C.conv1d_causal(x, w), F.conv1d(F.pad(x, (2, 0)), w))
    torch.testing.assert_close(C.conv1d_causal(x, w, b, stride=2, dilation=2), F.conv1d(F.pad(x, (4, 0)), w, b, 2, 0, 2))
    torch.testing.assert_close(C.conv2d_bias_relu(X, W, B, 1, 1), F.relu(F.conv2d(X, W, B, 1, 1)))
    xf, wf = torch.randn(1, 8, 6, 6).to(torch.float8_e4m3fn), torch.randn(4, 8, 3, 3).to(torch.float8_e4m3fn)
    sx, sw = torch.tensor(1.5), torch.tensor(0.5)
    expected = F.conv2d(xf.to(torch.bfloat16) * sx, wf.to(torch.bfloat16) * sw, None, 1, 1)
    torch.testing.assert_close(C.conv2d_fp8(xf, wf, sx, sw, padding=1), expected)


def test_bad_input_is_named_as_torch_names_it():
    with pytest.raises(RuntimeError, match="expected input.*to have 3 channels"):
        C.conv2d(X, torch.randn(16, 3, 3, 3))
    xf = torch.randn(1, 8, 6, 6).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"conv2d_fp8: x_scale must have shape \[\]"):
        C.conv2d_fp8(xf, torch.randn(4, 8, 3, 3).to(torch.float8_e4m3fn), torch.ones(2), torch.tensor(1.0))


def test_gradients_are_torch_s():
    ours, theirs = (t.clone().requires_grad_() for t in (X, X))
    w1, w2 = (W.clone().requires_grad_() for _ in range(2))
    C.conv2d(ours, w1, B, padding=1).square().sum().backward()
    F.conv2d(theirs, w2, B, padding=1).square().sum().backward()
    torch.testing.assert_close(ours.grad, theirs.grad)
    torch.testing.assert_close(w1.grad, w2.grad)


def test_coverage_says_why_torch_ran():
    reset_coverage()
    C.conv2d(X, W)
    C.conv2d(torch.empty(0, 8, 10, 10), W)
    why = {name: counts["why"] for name, counts in coverage().items()}
    assert why["conv2d"] == {"cpu device": 1, "arguments with no canonical form (empty input, asymmetric 'same', not "
                                              "ints, input rank)": 1}


def test_conv_transpose2d_is_f_conv_transpose2d():
    x, w, b = torch.randn(2, 8, 7, 7), torch.randn(8, 4, 3, 3), torch.randn(4)
    for kwargs in ({}, {"stride": 2, "padding": 1, "output_padding": 1}, {"stride": 2, "dilation": 2, "padding": 1}):
        torch.testing.assert_close(C.conv_transpose2d(x, w, b, **kwargs), F.conv_transpose2d(x, w, b, **kwargs))
    grouped = torch.randn(8, 2, 3, 3)
    torch.testing.assert_close(C.conv_transpose2d(x, grouped, None, 2, 1, 1, 2), F.conv_transpose2d(x, grouped, None, 2, 1, 1, 2))
    torch.testing.assert_close(C.conv_transpose2d(x[0], w), F.conv_transpose2d(x[0], w))  # unbatched
