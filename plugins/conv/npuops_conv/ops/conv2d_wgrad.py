"""Conv2dWgrad."""

import math

from npuops import KernelOp, Tolerance

from ._backward import (
    ConvGradientOp,
    WeightGradientKernel,
    convolution_backward,
    shape_only,
)
from ._conv_op import TensorSpec, kaiming_std


class Conv2dWgrad(WeightGradientKernel, ConvGradientOp, KernelOp):
    """Gradient of y = conv2d(input, weight) (+ bias) with respect to the weight (and the bias):
    from ``input`` [N, C_in, H, W] and ``grad_output`` [N, C_out, H_out, W_out], grad_weight
    [C_out, C_in/groups, kH, kW] = sum over batch and output pixels of grad_output x input window;
    with bias = true also grad_bias [C_out] = grad_output summed over N, H_out, W_out (outputs
    (grad_weight, grad_bias)). Outputs in the input dtype. PyTorch formulation:
    ``aten.convolution_backward`` with output_mask [False, True, bias], as autograd runs it.

    Inputs: input ~ N(0, 1), grad_output ~ N(0, 1/(N*H_out*W_out)) (a mean-reduced loss's
    gradient), so the gradients are O(1).

    f16 tolerance 3e-2 (default 4e-3): on an H200, cuDNN 9.19's f16 wgrad for W12/W13 (5x5,
    64 -> 128 channels, 56x56; kernel sm90_xmma_wgrad_indexed_implicit_gemm_f16f16_f16f32_f32, the
    same in default, benchmark and deterministic modes) is off by up to 2.1% of rms(reference),
    ten times f16 rounding and 3.4x the default tolerance, as if part of the reduction were
    accumulated in f16. That is what autograd gives every f16 PyTorch user; 3e-2 admits it at 0.7
    of the bound and still fails any wrong tap or index (errors of order 100%). bf16 stays within
    0.16 of its default.

    Our kernel: ``conv_grad_kernel.wgrad_kernel`` (channels-last input and grad_output; the weight
    gradient returned as the [C_out, C_in/groups, kH, kW] view of a channels-last tensor)."""

    name = "Conv2dWgrad"
    summary = "conv2d backward: gradient w.r.t. the weight (and bias)"
    tolerances = {"f16": Tolerance(3e-2, 3e-2)}

    def input_specs(self, w):
        g = self.geometry(w)
        dtype = w.dtype_of("input")
        positions = g.batch * math.prod(g.out_size)
        return {
            "input": TensorSpec(g.input_shape, dtype),
            "grad_output": TensorSpec(g.output_shape, dtype, std=kaiming_std(positions)),
        }

    def output_specs(self, w):
        g = self.geometry(w)
        dtype = w.dtype_of("input")
        grad_weight = TensorSpec(g.weight_shape, dtype)
        return (grad_weight, TensorSpec((g.out_channels,), dtype)) if g.bias else (grad_weight,)

    def torch_impl(self, w):
        g = self.geometry(w)
        backward = convolution_backward(g, (False, True, g.bias))
        weight_shape = g.weight_shape

        if g.bias:
            def conv2d_wgrad_bias(input, grad_output):
                _, grad_weight, grad_bias = backward(grad_output, input, shape_only(grad_output, weight_shape))
                return grad_weight, grad_bias

            return conv2d_wgrad_bias

        def conv2d_wgrad(input, grad_output):
            return backward(grad_output, input, shape_only(grad_output, weight_shape))[1]

        return conv2d_wgrad
