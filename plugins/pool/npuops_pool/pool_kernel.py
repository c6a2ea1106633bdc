"""The TileLang pooling kernels of this plugin: one template for any window, and a staged one for
windows that are the whole input (global pooling), chosen by :func:`pool_kernel`.

Any pooling here is, per spatial dim, a set of taps for each output position; the window kernel
views the input as [planes, D, H, W] (1-d and 2-d pooling have leading spatial dims of 1), gives
each thread one output element, and visits its window's taps with bounds checks: max with NaN propagating
(PyTorch's ``val > max || isnan(val)``), or an fp32 sum divided as PyTorch divides. Sliding
windows start at ``o * stride - padding`` with ``kernel`` taps ``dilation`` apart; adaptive
windows cover ``[floor(o * n / m), ceil((o + 1) * n / m))``.

TileLang is imported when a kernel is built.
"""

import math
from dataclasses import dataclass

import torch
from npuops.kernels import KernelSpec, tilelang_dtype

F32 = "float32"
BLOCK = 256  # threads per block of the window kernel, one output element each
PLANES_PER_BLOCK = 128  # whole-input windows: planes staged per block, one thread reducing each
STAGED_BYTES = 96 * 1024  # shared memory the staged planes of a block may take (two blocks per SM)


@dataclass(frozen=True)
class Pooling:
    mode: str  # "max" or "avg"
    spatial_in: tuple[int, ...]
    spatial_out: tuple[int, ...]
    # Sliding windows (ignored when adaptive), one value per spatial dim:
    kernel: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    padding: tuple[int, ...] = ()
    dilation: tuple[int, ...] = ()
    adaptive: bool = False
    count_include_pad: bool = True
    divisor_override: int | None = None


def _as_3d(values: tuple[int, ...], fill: int) -> tuple[int, int, int]:
    return (fill,) * (3 - len(values)) + tuple(values)


def covers_whole_input(spec: Pooling) -> bool:
    """Every window is the whole input (global pooling: one output per plane)."""
    if any(o != 1 for o in spec.spatial_out):
        return False
    return spec.adaptive or (tuple(spec.kernel) == tuple(spec.spatial_in) and not any(spec.padding)
                             and all(d == 1 for d in spec.dilation))


def staged_row(spec: Pooling, dtype: torch.dtype) -> int:
    """Elements of a plane's row in shared memory: padded to an odd number of 4-byte words, so the
    threads' strided reads fall in distinct banks."""
    words = -(-math.prod(spec.spatial_in) * dtype.itemsize // 4)
    return (words + (words % 2 == 0)) * 4 // dtype.itemsize


def stages_planes(spec: Pooling, dtype: torch.dtype, threads: int) -> bool:
    """Whether the staged whole-input kernel takes ``spec`` with ``threads`` planes per block."""
    return covers_whole_input(spec) and threads * staged_row(spec, dtype) * dtype.itemsize <= STAGED_BYTES


def pool_kernel(spec: Pooling, input_shape: tuple[int, ...], dtype: torch.dtype, threads: int | None = None) -> KernelSpec:
    """The kernel for ``spec``; ``threads`` per block overrides the default."""
    if stages_planes(spec, dtype, threads or PLANES_PER_BLOCK):
        return whole_input_kernel(spec, input_shape, dtype, threads or PLANES_PER_BLOCK)
    return window_kernel(spec, input_shape, dtype, threads or BLOCK)


def launch_variants(spec: Pooling, dtype: torch.dtype) -> list[dict[str, int]]:
    """Block sizes ``npuops run --tune`` chooses among, the default first."""
    if stages_planes(spec, dtype, PLANES_PER_BLOCK):
        return [{"threads": t} for t in (PLANES_PER_BLOCK, PLANES_PER_BLOCK // 2, PLANES_PER_BLOCK * 2)
                if stages_planes(spec, dtype, t)]
    return [{"threads": t} for t in (BLOCK, BLOCK // 2, BLOCK * 2)]


def whole_input_kernel(spec: Pooling, input_shape: tuple[int, ...], dtype: torch.dtype, block: int) -> KernelSpec:
    """Global pooling. A thread per output walking its plane in global memory reads 32 planes per
    warp instruction (uncoalesced: 0.31x torch.compile on a 128-long max pool), so a block first
    copies PLANES_PER_BLOCK whole planes to shared memory with coalesced loads, then each thread
    reduces one plane there (planes small enough for STAGED_BYTES; larger ones take the window
    kernel)."""
    import tilelang.language as T

    dt = tilelang_dtype(dtype)
    planes, size = math.prod(input_shape[:2]), math.prod(input_shape[2:])
    padded = staged_row(spec, dtype)
    divisor = float(spec.divisor_override or size)  # the window is the input: no padding to count

    @T.prim_func
    def main(X: T.Tensor((planes, size), dt), Y: T.Tensor((planes, 1), dt)):
        with T.Kernel(T.ceildiv(planes, block), threads=block) as bx:
            # Tile-level form, as the window kernel: it also builds for TileLang's CPU target.
            tile = T.alloc_shared((block, padded), dt)
            acc = T.alloc_fragment((block,), F32)
            for p, k in T.Parallel(block, size):
                tile[p, k] = X[T.min(bx * block + p, planes - 1), k]
            for p in T.Parallel(block):
                if bx * block + p < planes:
                    acc[p] = -T.infinity(F32) if spec.mode == "max" else 0.0
                    for k in T.serial(size):
                        v = T.Cast(F32, tile[p, k])
                        if spec.mode == "max":
                            acc[p] = T.if_then_else(v > acc[p] or T.isnan(v), v, acc[p])
                        else:
                            acc[p] = acc[p] + v
                    Y[bx * block + p, 0] = T.Cast(dt, acc[p] if spec.mode == "max" else acc[p] / divisor)

    return KernelSpec(
        main,
        (("input", (planes, size)), ("output", (planes, 1))),
        {"output": dtype},
        (("output", (*input_shape[:2], *spec.spatial_out)),),
        {"threads": block, "planes_per_block": block, "shared_row": padded},
    )


def window_kernel(spec: Pooling, input_shape: tuple[int, ...], dtype: torch.dtype, block: int) -> KernelSpec:
    """Any pooling: a thread per output element visiting its window's taps in global memory."""
    import tilelang.language as T

    dt = tilelang_dtype(dtype)
    planes = math.prod(input_shape[:2])
    D, H, W = _as_3d(spec.spatial_in, 1)
    oD, oH, oW = _as_3d(spec.spatial_out, 1)
    total = planes * oD * oH * oW
    if spec.adaptive:
        # Longest adaptive window per dim: the tap count each thread visits (shorter ones masked).
        taps = tuple(max(-(-(o + 1) * n // m) - o * n // m for o in range(m))
                     for n, m in zip((D, H, W), (oD, oH, oW), strict=True))
        stride = padding = (0, 0, 0)
        dilation = (1, 1, 1)
    else:
        taps = _as_3d(spec.kernel, 1)
        stride, padding, dilation = _as_3d(spec.stride, 1), _as_3d(spec.padding, 0), _as_3d(spec.dilation, 1)
    (kD, kH, kW), (sD, sH, sW), (pD, pH, pW), (dD, dH, dW) = taps, stride, padding, dilation

    def window(o, n, m, s, p):
        """(first tap, end of the window) along one dim for output position o."""
        if spec.adaptive:
            return (o * n) // m, ((o + 1) * n + m - 1) // m
        return o * s - p, n  # sliding windows end at the input's edge; taps past it are skipped

    @T.prim_func
    def main(X: T.Tensor((planes, D, H, W), dt), Y: T.Tensor((planes, oD, oH, oW), dt)):
        with T.Kernel(T.ceildiv(total, block), threads=block) as bx:
            # Tile-level form (no thread indices), so the same kernel also builds for TileLang's CPU
            # target, where the tests check it against the reference without a GPU.
            acc = T.alloc_fragment((block,), F32)
            count = T.alloc_fragment((block,), "int32")
            for t in T.Parallel(block):
                idx = bx * block + t
                if idx < total:
                    ow = idx % oW
                    oh = (idx // oW) % oH
                    od = (idx // (oW * oH)) % oD
                    plane = idx // (oW * oH * oD)
                    d0, d_end = window(od, D, oD, sD, pD)
                    h0, h_end = window(oh, H, oH, sH, pH)
                    w0, w_end = window(ow, W, oW, sW, pW)
                    acc[t] = -T.infinity(F32) if spec.mode == "max" else 0.0
                    count[t] = 0
                    for i, j, k in T.grid(kD, kH, kW):
                        d = d0 + i * dD
                        h = h0 + j * dH
                        w = w0 + k * dW
                        if d >= 0 and d < d_end and h >= 0 and h < h_end and w >= 0 and w < w_end:
                            v = T.Cast(F32, X[plane, d, h, w])
                            if spec.mode == "max":
                                acc[t] = T.if_then_else(v > acc[t] or T.isnan(v), v, acc[t])
                            else:
                                acc[t] = acc[t] + v
                                count[t] = count[t] + 1
                    if spec.mode == "max":
                        Y[plane, od, oh, ow] = T.Cast(dt, acc[t])
                    elif spec.divisor_override is not None:
                        Y[plane, od, oh, ow] = T.Cast(dt, acc[t] / T.float32(spec.divisor_override))
                    elif spec.adaptive or not spec.count_include_pad:
                        Y[plane, od, oh, ow] = T.Cast(dt, acc[t] / T.Cast(F32, T.max(count[t], 1)))
                    else:
                        # PyTorch counts the padding taps, but not taps a ceil-mode window runs
                        # past the padded input.
                        size = ((T.min(d0 + kD, D + pD) - d0) * (T.min(h0 + kH, H + pH) - h0)
                                * (T.min(w0 + kW, W + pW) - w0))
                        Y[plane, od, oh, ow] = T.Cast(dt, acc[t] / T.Cast(F32, size))

    output_shape = (*input_shape[:2], *spec.spatial_out)
    return KernelSpec(
        main,
        (("input", (planes, D, H, W)), ("output", (planes, oD, oH, oW))),
        {"output": dtype},
        (("output", output_shape),),
        {"threads": block, "outputs_per_thread": 1, "taps": taps},
    )
