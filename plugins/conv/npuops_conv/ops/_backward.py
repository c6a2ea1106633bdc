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
