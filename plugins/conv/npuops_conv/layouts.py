"""Channels-last tensors for the implementations that want them (cuDNN's NHWC kernels, ours).

A channels-last model keeps its activations and weights in that layout throughout and never
converts, so an implementation that wants channels-last data gets copies of the op's NC[D]HW
inputs made outside the timed calls (:class:`ChannelsLastCache`), as a model would have them.
Tensors already channels last (:func:`channels_inner`: what such a model passes) are read as they
are, never copied. Our forward kernels write their output in either layout (CHANNELS_LAST,
CHANNELS_FIRST); :func:`torch_output_layout` says which torch's convolution returns.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

# The layouts our forward kernels write their output in (the NC[D]HW view of either): channels last,
# [N, *spatial, C] rows (what cuDNN's channels-last convolutions write), or channels first,
# NC[D]HW-contiguous (what torch's convolutions return for NC[D]HW-contiguous tensors).
CHANNELS_LAST = "channels_last"
CHANNELS_FIRST = "channels_first"
_FORMATS = {4: torch.channels_last, 5: torch.channels_last_3d}  # torch's channels-last format of each rank


def channels_last(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` (N, C, *spatial) with its channels innermost in memory, the shape unchanged (for 4-d
    and 5-d tensors PyTorch's channels_last / channels_last_3d formats; for 3-d, NLC). Tensors of
    fewer dims (a bias, a scale) have no layout to change."""
    if tensor.dim() < 3:
        return tensor
    return tensor.movedim(1, -1).contiguous().movedim(-1, 1)


def channels_inner(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` (N, C, *spatial) already is :func:`channels_last`'s form: its storage
    [N, *spatial, C], dense (torch's channels_last / channels_last_3d formats; for 3-d, NLC, such as
    ``x.transpose(1, 2)`` of a [N, L, C] tensor, which torch has no format for)."""
    if tensor.dim() in _FORMATS:  # torch's own checks, for the common ranks: no view made
        return tensor.is_contiguous(memory_format=_FORMATS[tensor.dim()])
    return tensor.dim() >= 3 and tensor.movedim(1, -1).is_contiguous()


def torch_output_layout(input: Any, weight: Any) -> str:
    """The layout torch's convolution of ``input`` [N, C_in, *spatial] by ``weight`` [C_out,
    C_in / groups, *kernel] returns on the GPU (cuDNN's rule): CHANNELS_LAST where either tensor's
    strides suggest channels-last memory format, else CHANNELS_FIRST. conv1d runs as a conv2d of
    ``input`` made contiguous and of ``weight`` viewed [C_out, C_in / groups, 1, kW]: there the
    weight alone decides (an NLC one gives an NLC output). Anything else (not a tensor, another
    rank): CHANNELS_FIRST, as the torch formulation that runs such calls decides for itself."""
    if isinstance(weight, torch.Tensor) and weight.dim() == 3:
        input, weight = None, weight.unsqueeze(2)
    return CHANNELS_LAST if _suggests_channels_last(input) or _suggests_channels_last(weight) else CHANNELS_FIRST


def _suggests_channels_last(tensor: Any) -> bool:
    """Whether torch's ``suggest_memory_format`` of a 4-d or 5-d ``tensor`` is channels last. A
    tensor dense in just one of the two formats suggests that one; where sizes of 1 make it dense in
    both (a 1x1 weight, one channel), or it is dense in neither, torch decides by the strides."""
    if not isinstance(tensor, torch.Tensor) or tensor.dim() not in _FORMATS:
        return False
    channels_last_format = _FORMATS[tensor.dim()]
    dense_channels_last = tensor.is_contiguous(memory_format=channels_last_format)
    if dense_channels_last != tensor.is_contiguous():
        return dense_channels_last
    from torch._prims_common import suggest_memory_format  # torch's rule, in Python

    return suggest_memory_format(tensor) == channels_last_format


def accepts(tensor: torch.Tensor) -> bool:
    """Whether a :func:`channels_last_kernel` takes ``tensor`` as it is laid out: NC[D]HW-contiguous
    (converted, see :class:`ChannelsLastCache`) or already channels last (read in place)."""
    return tensor.is_contiguous() or channels_inner(tensor)


class ChannelsLastCache:
    """Channels-last copies of the tensors last passed under each name.

    A copy is reused while the same tensor object comes again unmodified (same ``_version``), so
    the conversion happens once per input tensor, on the first (warm-up) call, and never in the
    timed repeats. The cache holds only a weak reference to the original: a new tensor, even one
    reusing the old one's memory, is a miss and is converted afresh.
    """

    def __init__(self) -> None:
        self._copies: dict[str, tuple[weakref.ref, int, torch.Tensor]] = {}

    def get(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        # A tensor already channels last is its own copy: nothing to convert, nothing to remember
        # (a view held here would keep the caller's memory alive).
        if tensor.dim() < 3 or channels_inner(tensor):
            return tensor
        cached = self._copies.get(name)
        if cached is not None and cached[0]() is tensor and cached[1] == tensor._version:
            return cached[2]
        copy = channels_last(tensor)
        self._copies[name] = (weakref.ref(tensor), tensor._version, copy)
        return copy


def channels_last_kernel(kernel: Callable[..., Any], output_layout: str = CHANNELS_LAST) -> Callable[..., Any]:
    """A kernel of channels-last tensors (input [N, *spatial, C_in], weight [C_out, *kernel, C_in /
    groups], output [N, *spatial_out, C_out], or the gradients') as the op's callable of NC[D]HW
    tensors: NC[D]HW-contiguous inputs converted once each (untimed, see :class:`ChannelsLastCache`),
    channels-last ones passed as they are; each output (one or a tuple) returned as the NC[D]HW view
    of what the kernel wrote: of its channels-last output (channels-last strides, no copy: for
    channels-last inputs what torch's convolutions return), or, from a kernel whose
    ``output_layout`` is CHANNELS_FIRST ([N, C_out, *spatial_out]: what torch returns for NC[D]HW-
    contiguous ones), the output itself. Its ``accepts`` tells the functions (see
    ``npuops.functional``) the input layouts it takes (:func:`accepts`); its ``config`` (recorded
    with each row) names the layout."""
    cache = ChannelsLastCache()
    written_first = output_layout == CHANNELS_FIRST

    def channels_last_conv(**inputs: torch.Tensor) -> Any:
        result = kernel(**{name: _channels_inner(cache.get(name, tensor)) for name, tensor in inputs.items()})
        if written_first:
            return result
        return tuple(_channels_first(t) for t in result) if isinstance(result, tuple) else _channels_first(result)

    channels_last_conv.accepts = accepts
    channels_last_conv.config = {**getattr(kernel, "config", {}), "layout": "channels-last"}
    return channels_last_conv


def _channels_inner(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.movedim(1, -1) if tensor.dim() >= 3 else tensor


def _channels_first(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.movedim(-1, 1) if tensor.dim() >= 3 else tensor
