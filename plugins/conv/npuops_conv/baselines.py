"""Vendor baseline of the family: cuDNN on channels-last (NHWC / NDHWC) tensors.

cuDNN's fastest convolution kernels (tensor-core implicit GEMM) work on channels-last data; on
NCHW tensors PyTorch either picks slower kernels or transposes around every call. A channels-last
model keeps its activations and weights in that layout throughout and never converts, so this
baseline times the op's torch formulation on channels-last copies of its inputs, made outside
the timed calls.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from npuops import Implementation, Op

from .layouts import ChannelsLastCache
from .ops._conv_op import ConvOp


def build_channels_last(op: Op, w, device: torch.device) -> Callable[..., Any]:
    conv = op.torch_impl(w)
    cache = ChannelsLastCache()

    def channels_last_conv(**inputs):
        return conv(**{name: cache.get(name, tensor) for name, tensor in inputs.items()})

    return channels_last_conv


def _needs_2d_or_3d(op: Op, w, device) -> str | None:
    if op.layout.ndim not in (2, 3):
        return (
            f"cuDNN has no channels-last kernels for {op.layout.ndim}-d convolutions "
            "(PyTorch runs conv1d as an NCHW conv2d)"
        )
    return None


def channels_last_implementations(ops: Mapping[str, Op]) -> list[Implementation]:
    return [
        Implementation(
            op.name, "cudnn_channels_last", "vendor", build_channels_last, devices=("cuda",),
            supports=_needs_2d_or_3d,
            description="the torch formulation on channels-last inputs (cuDNN NHWC kernels), converted untimed",
        )
        for op in ops.values()
        if isinstance(op, ConvOp)
    ]
