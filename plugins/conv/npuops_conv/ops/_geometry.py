"""Convolution sizes, derived from a workload however its source states them.

Catalog workloads describe a convolution in several ways: explicit params (N, C_in, H, W, C_out,
kH, kW, ...), an explicit ``weight`` shape, or only the input and a bias. Every op of the family is
described by the *forward* convolution it computes, differentiates or transposes (a
:class:`ConvGeometry`); the resolvers below derive it and reject workloads whose statements
disagree, naming the field and the value that would fit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from npuops import Param, Workload, WorkloadError


@dataclass(frozen=True)
class Layout:
    """How a workload names the spatial dims of one convolution rank."""

    spatial: tuple[str, ...]  # params holding the input's spatial sizes, outermost first
    kernel: tuple[str, ...]  # params holding the kernel's sizes, in the same order
    conv: Callable[..., torch.Tensor]  # the torch.nn.functional convolution of this rank

    @property
    def ndim(self) -> int:
        return len(self.spatial)


LAYOUT_1D = Layout(("L_in",), ("kW",), F.conv1d)
LAYOUT_2D = Layout(("H", "W"), ("kH", "kW"), F.conv2d)
LAYOUT_3D = Layout(("D", "H", "W"), ("kD", "kH", "kW"), F.conv3d)


@dataclass(frozen=True)
class ConvGeometry:
    """One forward convolution as ``F.conv{1,2,3}d`` computes it (NC[D]HW, contiguous)."""

    batch: int
    in_channels: int
    out_channels: int
    in_size: tuple[int, ...]
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    pad_before: tuple[int, ...]  # zeros added before each spatial dim
    pad_after: tuple[int, ...]  # ... and after it (differs from pad_before only for causal convs)
    dilation: tuple[int, ...]
    groups: int
    bias: bool

    @property
    def out_size(self) -> tuple[int, ...]:
        return tuple(
            (i + b + a - d * (k - 1) - 1) // s + 1
            for i, b, a, d, k, s in zip(
                self.in_size, self.pad_before, self.pad_after, self.dilation, self.kernel, self.stride, strict=True
            )
        )

    @property
    def padding(self) -> tuple[int, ...]:
        """The symmetric padding ``F.conv*d`` takes."""
        if self.pad_before != self.pad_after:
            raise ValueError(f"padding is asymmetric ({self.pad_before} before, {self.pad_after} after)")
        return self.pad_before

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.batch, self.in_channels, *self.in_size)

    @property
    def output_shape(self) -> tuple[int, ...]:
        return (self.batch, self.out_channels, *self.out_size)

    @property
    def weight_shape(self) -> tuple[int, ...]:
        """Also the weight layout of the transposed convolution that is this one's adjoint."""
        return (self.out_channels, self.in_channels // self.groups, *self.kernel)

    @property
    def fan_in(self) -> int:
        """Products summed into one output element."""
        return self.in_channels // self.groups * math.prod(self.kernel)

    @property
    def fan_out(self) -> int:
        """Output elements one input element feeds (at stride 1): the adjoint's fan-in."""
        return self.out_channels // self.groups * math.prod(self.kernel)

    @property
    def flops(self) -> int:
        """Multiply-adds of the convolution, two FLOPs each (bias and activation not counted).
        Its input gradient, weight gradient and transposed form do the same work."""
        return 2 * self.batch * self.out_channels * math.prod(self.out_size) * self.fan_in

    @property
    def transpose_output_padding(self) -> tuple[int, ...]:
        """The ``output_padding`` with which the transposed convolution maps ``out_size`` back to
        exactly ``in_size`` (a strided convolution drops trailing rows, so its adjoint needs it)."""
        return tuple(
            i - ((o - 1) * s - 2 * p + d * (k - 1) + 1)
            for i, o, s, p, d, k in zip(
                self.in_size, self.out_size, self.stride, self.padding, self.dilation, self.kernel, strict=True
            )
        )


# -- params ----------------------------------------------------------------------------------------

_INT = (int,)
_INTS = (int, tuple)


def size_params(layout: Layout) -> dict[str, Param]:
    """N, C_in, the spatial sizes and C_out: optional restatements of the shapes."""
    params = {
        "N": Param(None, "batch size; must equal input dim 0", types=_INT),
        "C_in": Param(None, "input channels; must equal input dim 1", types=_INT),
    }
    for i, name in enumerate(layout.spatial):
        params[name] = Param(None, f"input spatial size; must equal input dim {i + 2}", types=_INT)
    params["C_out"] = Param(None, "output channels; taken from the weight or bias shape when not given", types=_INT)
    return params


def kernel_params(layout: Layout) -> dict[str, Param]:
    doc = "kernel size; taken from the weight shape when not given"
    return {name: Param(None, doc, types=_INT) for name in layout.kernel}


STRIDE = Param(1, "int or one int per spatial dim", types=_INTS)
PADDING = Param(0, "zeros added on both sides; int or one int per spatial dim", types=_INTS)
DILATION = Param(1, "spacing of kernel taps; int or one int per spatial dim", types=_INTS)
GROUPS = Param(1, "channel groups; C_in and C_out must be multiples", types=_INT)
BIAS = Param(False, "add a per-output-channel bias", types=(bool,))


def conv_params(layout: Layout) -> dict[str, Param]:
    """Every param of a plain ``F.conv{1,2,3}d`` workload."""
    return {
        **size_params(layout), **kernel_params(layout),
        "stride": STRIDE, "padding": PADDING, "dilation": DILATION, "groups": GROUPS, "bias": BIAS,
    }


# -- resolvers -------------------------------------------------------------------------------------

def forward_geometry(
    where: str,
    w: Workload,
    cfg: Mapping[str, Any],
    layout: Layout,
    *,
    kernel: tuple[int, ...] | None = None,
    depthwise: bool = False,
    causal: bool = False,
) -> ConvGeometry:
    """The convolution of a workload whose ``input`` is the convolution's input.

    ``kernel`` fixes the kernel size (pointwise convs); ``depthwise`` makes groups = C_in;
    ``causal`` replaces the padding by (kernel-1)*dilation zeros before each dim and none after.
    """
    ndim = layout.ndim
    x = _shape(where, w, "input", ndim + 2, f"[N, C_in, {', '.join(layout.spatial)}]")
    batch, in_channels, in_size = x[0], x[1], x[2:]
    _agree_with_shape(where, cfg, "input", x, ("N", "C_in", *layout.spatial))
    weight = _shape(where, w, "weight", ndim + 2, "[C_out, C_in/groups, *kernel]")
    kernel = _kernel(where, cfg, layout, weight, kernel)
    out_channels = _channels(where, w, cfg, "C_out", None if weight is None else weight[0])
    groups = in_channels if depthwise else _int(where, "groups", cfg.get("groups", 1), 1)
    _check_groups(where, in_channels, out_channels, groups)
    stride = _per_dim(where, "stride", cfg.get("stride", 1), ndim, 1)
    dilation = _per_dim(where, "dilation", cfg.get("dilation", 1), ndim, 1)
    if causal:
        pad_before = tuple(d * (k - 1) for d, k in zip(dilation, kernel, strict=True))
        pad_after = (0,) * ndim
    else:
        pad_before = pad_after = _per_dim(where, "padding", cfg.get("padding", 0), ndim, 0)
    geometry = ConvGeometry(
        batch, in_channels, out_channels, in_size, kernel, stride, pad_before, pad_after, dilation, groups,
        _bias(where, w, cfg, out_channels),
    )
    _check_weight(where, weight, geometry)
    if min(geometry.out_size) < 1:
        raise WorkloadError(
            f"{where}: the output would be empty (spatial size {list(geometry.out_size)}); the input "
            f"{list(in_size)} padded by {list(pad_before)}+{list(pad_after)} must be at least the dilated "
            f"kernel {[d * (k - 1) + 1 for d, k in zip(dilation, kernel, strict=True)]}"
        )
    return geometry


def transpose_geometry(where: str, w: Workload, cfg: Mapping[str, Any], layout: Layout) -> ConvGeometry:
    """The forward convolution whose adjoint a transposed-conv workload computes.

    The workload names sizes from that forward convolution's side: its ``input`` is
    [N, C_out, out_H, out_W] (the forward output), ``C_in`` is the forward input's channels, which
    the transposed convolution outputs (= the bias length). The forward input's spatial size is
    (out-1)*stride - 2*padding + dilation*(k-1) + output_padding + 1, as in ``F.conv_transpose2d``.
    """
    ndim = layout.ndim
    out_names = tuple(f"out_{name}" for name in layout.spatial)
    x = _shape(where, w, "input", ndim + 2, f"[N, C_out, {', '.join(out_names)}]")
    batch, out_channels, out_size = x[0], x[1], x[2:]
    _agree_with_shape(where, cfg, "input", x, ("N", "C_out", *out_names))
    weight = _shape(where, w, "weight", ndim + 2, "[C_out, C_in/groups, *kernel]")
    kernel = _kernel(where, cfg, layout, weight, None)
    groups = _int(where, "groups", cfg.get("groups", 1), 1)
    in_channels = _channels(where, w, cfg, "C_in", None if weight is None else weight[1] * groups)
    _check_groups(where, in_channels, out_channels, groups)
    stride = _per_dim(where, "stride", cfg.get("stride", 1), ndim, 1)
    dilation = _per_dim(where, "dilation", cfg.get("dilation", 1), ndim, 1)
    padding = _per_dim(where, "padding", cfg.get("padding", 0), ndim, 0)
    output_padding = _per_dim(where, "output_padding", cfg.get("output_padding", 0), ndim, 0)
    # PyTorch also accepts output_padding < dilation; only below the stride is the result the
    # adjoint of a convolution (the extra rows are ones that convolution drops).
    if any(p >= s for p, s in zip(output_padding, stride, strict=True)):
        raise WorkloadError(
            f"{where}: param 'output_padding' = {list(output_padding)} must be below stride {list(stride)}"
        )
    in_size = tuple(
        (o - 1) * s - 2 * p + d * (k - 1) + op + 1
        for o, s, p, d, k, op in zip(out_size, stride, padding, dilation, kernel, output_padding, strict=True)
    )
    if min(in_size) < 1:
        raise WorkloadError(f"{where}: the output would be empty (spatial size {list(in_size)}); reduce 'padding'")
    geometry = ConvGeometry(
        batch, in_channels, out_channels, in_size, kernel, stride, padding, padding, dilation, groups,
        _bias(where, w, cfg, in_channels),
    )
    _check_weight(where, weight, geometry)
    assert geometry.out_size == out_size, "output_padding < stride makes the forward conv map back"
    return geometry


def _shape(where: str, w: Workload, name: str, rank: int, form: str) -> tuple[int, ...] | None:
    shape = w.shapes.get(name)
    if shape is not None and len(shape) != rank:
        raise WorkloadError(f"{where}: shape of {name!r} is {list(shape)}; must be {form} ({rank} dims)")
    return shape


def _agree_with_shape(
    where: str, cfg: Mapping[str, Any], tensor: str, shape: Sequence[int], names: Sequence[str]
) -> None:
    for dim, (name, size) in enumerate(zip(names, shape, strict=True)):
        stated = cfg.get(name)
        if stated is not None and stated != size:
            raise WorkloadError(
                f"{where}: param {name!r} = {stated!r} disagrees with {tensor!r} dim {dim}; allowed: {size}"
            )


def _int(where: str, name: str, value: Any, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise WorkloadError(f"{where}: param {name!r} = {value!r} must be an int >= {minimum}")
    return value


def _per_dim(where: str, name: str, value: Any, ndim: int, minimum: int) -> tuple[int, ...]:
    """An int, or a list of ``ndim`` ints, as a tuple of ``ndim`` ints."""
    values = (value,) * ndim if isinstance(value, int) and not isinstance(value, bool) else value
    if (
        not isinstance(values, tuple | list) or len(values) != ndim
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= minimum for v in values)
    ):
        raise WorkloadError(
            f"{where}: param {name!r} = {value!r} must be an int >= {minimum} or a list of {ndim} such ints"
        )
    return tuple(values)


def _kernel(
    where: str, cfg: Mapping[str, Any], layout: Layout, weight: Sequence[int] | None, fixed: tuple[int, ...] | None
) -> tuple[int, ...]:
    stated = tuple(cfg.get(name) for name in layout.kernel)
    sources: list[tuple[str, tuple[int, ...]]] = []
    if all(k is not None for k in stated):
        kernel = tuple(_int(where, n, k, 1) for n, k in zip(layout.kernel, stated, strict=True))
        sources.append((f"params {', '.join(layout.kernel)}", kernel))
    elif any(k is not None for k in stated):
        missing = [n for n, k in zip(layout.kernel, stated, strict=True) if k is None]
        raise WorkloadError(f"{where}: param(s) {', '.join(missing)} missing; give all of {', '.join(layout.kernel)}")
    if weight is not None:
        sources.append(("the 'weight' shape", tuple(weight[2:])))
    if fixed is not None:
        sources.append(("the op's definition", fixed))
    if not sources:
        raise WorkloadError(
            f"{where}: the kernel size is unknown; give params {', '.join(layout.kernel)} or a 'weight' shape"
        )
    first_source, kernel = sources[0]
    for source, other in sources[1:]:
        if other != kernel:
            raise WorkloadError(
                f"{where}: kernel {list(kernel)} from {first_source} disagrees with {source}; allowed: {list(other)}"
            )
    return kernel


def _channels(where: str, w: Workload, cfg: Mapping[str, Any], param: str, from_weight: int | None) -> int:
    """Channel count stated by ``param``, implied by the weight shape and by the bias; all must agree."""
    bias = _shape(where, w, "bias", 1, f"[{param}]")
    candidates = [
        (f"param {param!r}", cfg.get(param)),
        ("the 'weight' shape", from_weight),
        ("'bias'", None if bias is None else bias[0]),
    ]
    stated = [(source, value) for source, value in candidates if value is not None]
    if not stated:
        raise WorkloadError(f"{where}: {param} is unknown; give param {param!r}, a 'weight' or a 'bias' shape")
    first_source, channels = stated[0]
    _int(where, param, channels, 1)
    for source, value in stated[1:]:
        if value != channels:
            raise WorkloadError(
                f"{where}: {param} from {source} is {value}; allowed: {channels} (from {first_source})"
            )
    return channels


def _check_groups(where: str, in_channels: int, out_channels: int, groups: int) -> None:
    if in_channels % groups or out_channels % groups:
        raise WorkloadError(
            f"{where}: param 'groups' = {groups} must divide C_in = {in_channels} and C_out = {out_channels}"
        )


def _check_weight(where: str, weight: Sequence[int] | None, geometry: ConvGeometry) -> None:
    if weight is not None and tuple(weight) != geometry.weight_shape:
        raise WorkloadError(
            f"{where}: shape of 'weight' is {list(weight)}; allowed: {list(geometry.weight_shape)} "
            "([C_out, C_in/groups, *kernel])"
        )


def _bias(where: str, w: Workload, cfg: Mapping[str, Any], channels: int) -> bool:
    bias = bool(cfg.get("bias", False))
    if "bias" in w.shapes:
        if not bias:
            raise WorkloadError(f"{where}: 'shapes' has 'bias' but param 'bias' is false; allowed: true")
        if w.shapes["bias"] != (channels,):
            raise WorkloadError(f"{where}: shape of 'bias' is {list(w.shapes['bias'])}; allowed: [{channels}]")
    return bias
