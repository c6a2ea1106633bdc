"""Convolution gradients as autograd computes them: ``aten.convolution_backward``."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ._conv_op import ConvOp
from ._geometry import LAYOUT_2D, ConvGeometry, conv_params, forward_geometry


class ConvGradientOp(ConvOp):
    """A gradient of conv2d. The workload describes the forward conv (its ``input`` is the forward
    input, its params the forward conv's); the op's own tensors are derived from it."""

    layout = LAYOUT_2D
    params = conv_params(LAYOUT_2D)
    required_tensors = ("input",)
    optional_tensors = ("weight", "bias")

    def resolve_geometry(self, where, w, cfg):
        return forward_geometry(where, w, cfg, self.layout)


def convolution_backward(g: ConvGeometry, output_mask: tuple[bool, bool, bool]) -> Callable[..., tuple]:
    """``fn(grad_output, input, weight)`` returning (grad_input, grad_weight, grad_bias), each None
    where ``output_mask`` is False. The tensor whose gradient is not wanted only lends its shape,
    as in ``torch.nn.grad.conv2d_input``/``conv2d_weight``."""
    stride, padding, dilation, groups = list(g.stride), list(g.padding), list(g.dilation), g.groups
    no_output_padding = [0] * len(stride)
    bias_sizes = [g.out_channels] if output_mask[2] else None
    mask = list(output_mask)

    def backward(grad_output, input, weight):
        return torch.ops.aten.convolution_backward(
            grad_output, input, weight, bias_sizes, stride, padding, dilation, False, no_output_padding, groups, mask
        )

    return backward


def shape_only(like: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """A stand-in of ``shape`` that allocates one element (convolution_backward reads only its size)."""
    return like.new_empty(1).expand(shape)


# -- our kernels (npuops_conv.conv_grad_kernel) ----------------------------------------------------

class DataGradientKernel:
    """The kernel interface of the ops that compute a convolution's data gradient (Conv2dDgrad, and
    Conv2dTranspose, its adjoint form): ``conv_grad_kernel.dgrad_kernel`` over the forward
    geometry. ``kernel_inputs``: the op's names of dy and the weight; ``kernel_bias``: whether the
    workload's bias is added to the output (the transpose's; C_in channels); the workload param
    ``output_layout`` (``_forward.OUTPUT_LAYOUT``), the layout the kernel writes the output in."""

    kernel_inputs: tuple[str, str] = ("grad_output", "weight")
    kernel_description = ("TileLang implicit GEMM over grad_output with the transposed weight on tensor cores, "
                          "stride phases (no zero insertion), split-K where K is deep; direct for depthwise; "
                          "channels-last inputs, converted untimed")

    def kernel_bias(self, w) -> bool:
        return False

    def kernel_unsupported(self, w):
        from ..conv_grad_kernel import unsupported

        return unsupported(self.geometry(w), w.dtype_of("input"))

    def tilelang_variants(self, w):
        from ..conv_grad_kernel import Grad, dgrad_variants
        from ..conv_kernel import Problem

        return dgrad_variants(Grad(Problem(self.geometry(w), w.dtype_of("input")), self.kernel_bias(w)))

    def tilelang_build(self, w, device, config=None):
        from ..conv_grad_kernel import dgrad_kernel
        from ..layouts import channels_last_kernel

        layout = self.output_layout(w)
        spec = dgrad_kernel(self.geometry(w), w.dtype_of("input"), self.kernel_bias(w), self.kernel_inputs,
                            output_layout=layout, **(config or {}))
        return channels_last_kernel(spec.compile(device), layout)


class WeightGradientKernel:
    """The kernel interface of Conv2dWgrad: ``conv_grad_kernel.wgrad_kernel`` (weight gradient by
    deterministic split-K, bias gradient by an ordered column sum)."""

    kernel_description = ("TileLang GEMM over output positions (deterministic split-K, ordered reduction) on "
                          "tensor cores, ordered bias column sums, direct for depthwise; channels-last inputs, "
                          "converted untimed")

    def kernel_unsupported(self, w):
        from ..conv_grad_kernel import unsupported

        return unsupported(self.geometry(w), w.dtype_of("input"))

    def tilelang_variants(self, w):
        from ..conv_grad_kernel import Grad, wgrad_variants
        from ..conv_kernel import Problem

        g = self.geometry(w)
        return wgrad_variants(Grad(Problem(g, w.dtype_of("input")), g.bias))

    def tilelang_build(self, w, device, config=None):
        from ..conv_grad_kernel import wgrad_kernel
        from ..layouts import channels_last_kernel

        spec = wgrad_kernel(self.geometry(w), w.dtype_of("input"), **(config or {}))
        return channels_last_kernel(spec.compile(device))
