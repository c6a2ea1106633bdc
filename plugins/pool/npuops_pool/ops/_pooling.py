"""Shared spec pieces of every pooling op.

Inputs are ``input: [N, C, *spatial]`` (NCL, NCHW or NCDHW), contiguous; the output keeps that
layout with pooled spatial sizes. Pooling is separable: every output element reduces a box of
input elements that is the product of one interval per spatial dim, so each dim is described on
its own by an :class:`Axis`.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from npuops import Cost, KernelOp, Param, Tolerance, WorkloadError, dtype_name, high_precision, tensor_bytes

SPATIAL_NAMES = {1: ("L_in",), 2: ("H_in", "W_in"), 3: ("D_in", "H_in", "W_in")}

# The max of floats is one of them: any correct implementation returns exactly the reference.
EXACT = {name: Tolerance(0.0, 0.0) for name in ("bf16", "f16", "f32", "f64")}

RETURN_INDICES = Param(
    False,
    "also return, per output, the int64 flat index (within its (n, c) plane) of the maximum, "
    "the first one in window order on ties, as F.max_pool*d / F.adaptive_max_pool*d do",
    types=(bool,),
)


def shape_params(spatial_dims: int) -> dict[str, Param]:
    """N, C and the spatial sizes: restatements of the input's shape, checked against it."""
    names = ("N", "C", *SPATIAL_NAMES[spatial_dims])
    return {name: Param(None, f"input.shape[{i}]", types=(int,)) for i, name in enumerate(names)}


def per_dim(where: str, name: str, value: Any, spatial_dims: int, minimum: int) -> tuple[int, ...]:
    """An int (the same for every spatial dim) or one int per spatial dim, as PyTorch takes them."""
    values = (value,) * spatial_dims if isinstance(value, int) else tuple(value)
    if len(values) != spatial_dims or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise WorkloadError(f"{where}: param {name!r} = {value!r} must be an int or a list of {spatial_dims} ints")
    if min(values) < minimum:
        raise WorkloadError(f"{where}: param {name!r} = {value!r} must be >= {minimum}")
    return values


@dataclass(frozen=True)
class Axis:
    """One spatial dim of a pooling: the output length, and the number of input elements (padding
    excluded) that the windows along it cover, summed over its output positions."""

    out: int
    covered: int


class PoolOp(KernelOp):
    """Base of the pooling ops; subclasses define :meth:`axes` (the geometry, validated)."""

    family = "pool"
    required_tensors = ("input",)
    spatial_dims: ClassVar[int]

    def axes(self, w, cfg) -> tuple[Axis, ...]:
        """The pooled geometry per spatial dim; raises WorkloadError when PyTorch would refuse it."""
        raise NotImplementedError

    def check_workload(self, w, cfg):
        where = f"{self.name} {w.id}"
        shape = w.shapes["input"]
        names = ("N", "C", *SPATIAL_NAMES[self.spatial_dims])
        if len(shape) != len(names):
            raise WorkloadError(f"{where}: shape of 'input' {list(shape)} must be [{', '.join(names)}]")
        if 0 in shape:
            raise WorkloadError(f"{where}: shape of 'input' {list(shape)} must have no zero-sized dim")
        for i, name in enumerate(names):
            if cfg[name] is not None and cfg[name] != shape[i]:
                raise WorkloadError(f"{where}: param {name!r} = {cfg[name]} must equal input.shape[{i}] = {shape[i]}")
        if not w.dtype_of("input").is_floating_point:
            raise WorkloadError(f"{where}: dtype {w.dtype!r} must be a floating-point dtype")
        self.axes(w, cfg)

    reduction: ClassVar[str] = "avg"  # "max" for the max pools: what the TileLang kernel computes

    def pooling(self, w):
        """What the TileLang pooling kernel computes for ``w`` (a ``pool_kernel.Pooling``)."""
        raise NotImplementedError

    def kernel_unsupported(self, w) -> str | None:
        if self.config(w).get("return_indices", False):
            return "the TileLang pooling kernel returns values only; return_indices takes the torch path"
        return None

    def tilelang_variants(self, w):
        from ..pool_kernel import launch_variants

        return launch_variants(self.pooling(w), w.shapes["input"], w.dtype_of("input"))

    def kernel_key(self, w):
        """Workloads of equal keys share a build (the default launch's): sliding windows one per
        geometry, dtype and a few size classes, whatever their image sizes (see ``pool_kernel.kernel_key``)."""
        from ..pool_kernel import kernel_key

        return kernel_key(self.pooling(w), w.shapes["input"], w.dtype_of("input"))

    def tilelang_build(self, w, device, config=None):
        from ..pool_kernel import pool_kernel

        return pool_kernel(self.pooling(w), w.shapes["input"], w.dtype_of("input"), **(config or {})).compile(device)

    def spatial_in(self, w) -> tuple[int, ...]:
        return tuple(w.shapes["input"][2:])

    def pool_settings(self, cfg) -> dict[str, Any]:
        """The params besides the shape restatements: those the PyTorch function takes by name."""
        shape_names = {"N", "C", *SPATIAL_NAMES[self.spatial_dims]}
        return {name: cfg[name] for name in sorted(self.params) if name not in shape_names}

    def outputs(self, w) -> list[tuple[tuple[int, ...], torch.dtype]]:
        """(shape, dtype) of each output: the pooled values, then the argmax indices if asked."""
        cfg = self.config(w)
        shape = (*w.shapes["input"][:2], *(axis.out for axis in self.axes(w, cfg)))
        outs = [(shape, w.dtype_of("input"))]
        if cfg.get("return_indices", False):
            outs.append((shape, torch.int64))
        return outs

    def output_dtypes(self, w):
        return tuple(dtype_name(dtype) for _, dtype in self.outputs(w))

    def cost(self, w):
        cfg = self.config(w)
        planes = math.prod(w.shapes["input"][:2])
        read = tensor_bytes(w.shapes["input"], w.dtype_of("input"))
        written = sum(tensor_bytes(shape, dtype) for shape, dtype in self.outputs(w))
        covered = math.prod(axis.covered for axis in self.axes(w, cfg))
        return Cost(bytes=read + written, flops=planes * covered)

    def memory_bytes(self, w):
        """The timed and the checked inputs, the reference's clone and its upcast copy, the outputs
        of the implementation and of the reference, and compare's output-sized temporaries."""
        dtype = w.dtype_of("input")
        upcast = high_precision(torch.empty(0, dtype=dtype)).dtype
        inputs = tensor_bytes(w.shapes["input"], dtype)
        outputs = sum(tensor_bytes(shape, out_dtype) for shape, out_dtype in self.outputs(w))
        values_upcast = tensor_bytes(self.outputs(w)[0][0], upcast)
        return 3 * inputs + inputs * upcast.itemsize // dtype.itemsize + 2 * outputs + 5 * values_upcast + (64 << 20)


def window_geometry(where: str, cfg, spatial_dims: int) -> dict[str, tuple[int, ...]]:
    """kernel_size, stride (default: the kernel), padding and dilation, one value per spatial dim."""
    if cfg["kernel_size"] is None:
        raise WorkloadError(f"{where}: param 'kernel_size' is required: an int or a list of {spatial_dims} ints")
    kernel = per_dim(where, "kernel_size", cfg["kernel_size"], spatial_dims, 1)
    stride = kernel if cfg["stride"] is None else per_dim(where, "stride", cfg["stride"], spatial_dims, 1)
    return {
        "kernel_size": kernel,
        "stride": stride,
        "padding": per_dim(where, "padding", cfg["padding"], spatial_dims, 0),
        # average pooling has no dilation in PyTorch
        "dilation": per_dim(where, "dilation", cfg.get("dilation", 1), spatial_dims, 1),
    }


def pooled_length(size: int, kernel: int, stride: int, padding: int, dilation: int, ceil_mode: bool) -> int:
    """PyTorch's pooling_output_shape: windows every ``stride`` over the padded input, rounded down
    (or up in ceil mode, where a last window is kept only if it starts before the right padding)."""
    span = dilation * (kernel - 1) + 1
    out = (size + 2 * padding - span + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + padding:
        out -= 1
    return out


def window_coverage(size: int, out: int, kernel: int, stride: int, padding: int, dilation: int) -> int:
    """Input elements (padding excluded) covered by the ``out`` windows along one dim: per tap, the
    windows whose tap lands inside the input. O(kernel), not O(out): validation of a 10^7-long row
    must not loop over its outputs."""
    total = 0
    for tap in range(kernel):
        offset = tap * dilation - padding  # window o reads o * stride + offset
        first = max(0, -(offset // stride))  # ceil(-offset / stride): the first window in the input
        last = min(out - 1, (size - 1 - offset) // stride)
        total += max(0, last - first + 1)
    return total


def window_axes(where: str, cfg, sizes: Sequence[int], names: Sequence[str]) -> tuple[Axis, ...]:
    """The per-dim geometry of a sliding-window pooling, with PyTorch's validity rules."""
    geometry = window_geometry(where, cfg, len(sizes))
    axes = []
    for d, (size, name) in enumerate(zip(sizes, names, strict=True)):
        kernel, stride, padding, dilation = (geometry[k][d] for k in ("kernel_size", "stride", "padding", "dilation"))
        if padding > kernel // 2:
            raise WorkloadError(f"{where}: param 'padding' = {padding} along {name} must be at most half the kernel ({kernel // 2})")
        out = pooled_length(size, kernel, stride, padding, dilation, cfg["ceil_mode"])
        if out < 1:
            raise WorkloadError(
                f"{where}: {name} = {size} is too small for kernel {kernel} (dilation {dilation}, padding {padding}): no output"
            )
        axes.append(Axis(out, window_coverage(size, out, kernel, stride, padding, dilation)))
    return tuple(axes)


def window_params(spatial_dims: int) -> dict[str, Param]:
    """Parameters every sliding-window pooling (average or max) takes."""
    return {
        **shape_params(spatial_dims),
        "kernel_size": Param(None, "window size: an int or one per spatial dim (required)", types=(int, tuple)),
        "stride": Param(None, "window step: an int or one per spatial dim; None = kernel_size", types=(int, tuple)),
        "padding": Param(0, "implicit padding on both sides of each spatial dim (at most kernel_size // 2)", types=(int, tuple)),
        "ceil_mode": Param(False, "round the output size up, keeping a last window that runs past the input", types=(bool,)),
    }
