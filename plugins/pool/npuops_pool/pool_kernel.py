"""The TileLang pooling kernels of this plugin, chosen by :func:`pool_kernel` (``kernel`` in a
launch config): ``"sizes_at_launch"`` for sliding windows (the default where it applies: one
build serves every image size, batch and channel count of a key, see :func:`kernel_key`), and the
kernels built for one shape, which lead their own :func:`shape_variants` and stay launch variants
for ``npuops run --tune`` to compare: ``"rows"`` for sliding windows, ``"window"`` for adaptive
windows (and as a tuning fallback), ``"planes"`` for windows that are the whole input (global
pooling) and ``"lanes"`` for those over planes of whole 16-byte vectors, ``"strips"`` for windows
that tile the input, ``"vectors"`` for sliding windows over rows of whole 16-byte vectors, with
several output depths a thread (``march``) where windows overlap in depth.

Sizes at launch: a kernel whose code depends on the sizes is built per shape, so a model would
stall on a build at every new image size. The ``"sizes_at_launch"`` kernel takes them as
``T.dynamic`` values. By default its threads are counted flat over the outputs' groups, as the
per-shape vectors kernel counts them (so that a warp reads whole rows), each dividing its number
by the output sizes in 32 bits (in 64 bits, flat indices divided by the sizes ran 2-8x slower on
the H100); row tiles, whose blocks find their plane block, output row and column tile from their
number, are tuning variants. What its code still takes from the sizes is a class of them, in
the key: rows of whole 16-byte vectors or not (vector loads or a load a tap), indices past
int32, and the order and outputs a thread (see :func:`sized_launch`). It computes its element
offsets in 32 bits (TileLang makes an index it cannot bound 64-bit, clamps and all):
``scripts/pool-kernel-code.py`` compares the generated code with the per-shape kernels' (about
10% more SASS instructions a thread for max pools, up to 23% for averages, which count their
windows at run time, measured on the row tiles), ``scripts/bench-pool-sizes-at-launch.py`` the
speed on a GPU.

Any pooling here is, per spatial dim, a set of taps for each output position; the kernels view the
input as [planes, D, H, W] (1-d and 2-d pooling have leading spatial dims of 1). Max propagates NaN
as PyTorch does (``val > max || isnan(val)``), in one instruction a tap (``max.NaN.f32``, or on
16-bit taps ``max.NaN.bf16`` / ``.f16`` in their own type, exact: :data:`MAX_NAN`) where that
select takes three; averages sum in fp32 and divide as PyTorch divides. Sliding windows start at
``o * stride - padding`` with ``kernel`` taps ``dilation`` apart; adaptive windows cover
``[floor(o * n / m), ceil((o + 1) * n / m))``. A tap an average sums is cast to fp32 once: CUDA's
half-to-float conversion is an inline asm statement that the compiler neither merges nor
speculates, so an expression naming a half load three times (as PyTorch's NaN-propagating max
does) converts it three times behind branches, which made f16 40% slower than bf16 on the H200.

Why the ``"rows"`` kernel: a thread per output reading its taps from global memory (the
``"window"`` kernel, and torch.compile's Triton kernel) issues a 2-byte load per tap, strided by the
pooling stride, and re-reads every overlapped input element from L1/L2: about half the copy
bandwidth on the H200. A ``"rows"`` block instead takes one plane, one output depth and a tile of
``rows`` x ``cols`` outputs, copies the input rows these windows cover (every depth tap, the band
of rows, the span of columns) into shared memory with coalesced 16-byte loads, writing the padding
(and anything past the input) as the reduction's identity, then computes each output from shared
memory with no bounds checks. Global memory is then read about once, in full vectors; the taps'
strided and overlapping reads hit shared memory, which serves a stride-2 half read in one pass.

Tile-level form only (no thread indices), so every kernel also builds for TileLang's CPU target,
where the tests check it (per-thread layout annotations become single-thread ones there, see
``npuops.kernels.single_thread_layouts``). Loops after shared-memory writes span a multiple of the block (TileLang
drops the barrier before a loop that runs on part of the block); a kernel has one shared buffer
(the CPU target's limit). TileLang is imported when a kernel is built.
"""

import dataclasses
import functools
import math
from dataclasses import dataclass

import torch
from npuops import (VECTOR_BYTES, KernelKey, KernelSpec, interleaved_vectors, multiprocessors, thread_owned,
                    tilelang_dtype, wide_indices)

F32 = "float32"
BLOCK = 256  # threads per block of the window kernels
WARP = 32
OUTPUTS_PER_BLOCK = 1024  # outputs a "rows" block computes by default (its tile)
MAX_TILE_COLS = 1024  # longer output rows are split into column tiles
PLANES_PER_BLOCK = 128  # whole-input windows: planes staged per block, one thread reducing each
STAGED_BYTES = 96 * 1024  # shared memory a block may take (two blocks per SM)
MARCH_STEPS = (4, 6, 9)  # output depths a "vectors" thread may take (equal splits near these)


# The kernel prelude of max pooling: a NaN-propagating max in one instruction (sm_80+), where the
# select ``v > acc || isnan(v) ? v : acc`` takes three per tap. The 16-bit resnet-stem max pools ran
# at about 60% of the copy rate with the select, 67% without, on the H200: they are partly
# issue-bound. Plain C for TileLang's CPU target.
# The 16-bit forms (templates: the prelude precedes TileLang's definitions of bfloat16_t and
# half_t) let a max over 16-bit taps stay in their type, exact, with no conversions.
MAX_NAN = r"""
#ifdef __CUDACC__
__device__ __forceinline__ float npuops_max_nan(float a, float b) {
  float d;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}
template <typename T> __device__ __forceinline__ T npuops_max_nan_bf16(T a, T b) {
  unsigned short d;
  asm("max.NaN.bf16 %0, %1, %2;" : "=h"(d) : "h"(a.raw()), "h"(b.raw()));
  return T::bitcast(d);
}
template <typename T> __device__ __forceinline__ T npuops_max_nan_f16(T a, T b) {
  unsigned short d;
  asm("max.NaN.f16 %0, %1, %2;" : "=h"(d) : "h"(a.raw()), "h"(b.raw()));
  return T::bitcast(d);
}
#else
extern "C" float npuops_max_nan(float a, float b) { return a != a ? a : (b != b || b > a) ? b : a; }
#endif
"""


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
    ceil_mode: bool = False  # how the output sizes follow from the input's (a kernel given sizes at launch derives them)


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


@dataclass(frozen=True)
class Slab:
    """What a "rows" block stages: ``depth`` x ``rows`` x ``cols`` input elements, loaded in
    ``vector``-element pieces; column ``lead`` is the input column ``tile * cols_out * stride``."""

    depth: int
    rows: int
    cols: int
    lead: int
    vector: int

    def bytes(self, dtype: torch.dtype) -> int:
        return self.depth * self.rows * self.cols * dtype.itemsize


def slab(spec: Pooling, dtype: torch.dtype, rows: int, cols: int) -> Slab:
    """The slab of a tile of ``rows`` x ``cols`` outputs."""
    (kD, kH, kW), (_, sH, sW), (_, _, pW), (_, dH, dW) = _sliding(spec)
    W = spec.spatial_in[-1]
    # Vectors stay whole inside or outside the input when the row length, the tile's first column
    # and the columns staged left of it are multiples of the vector (one tile starts at column 0).
    vector = math.gcd(VECTOR_BYTES // dtype.itemsize, W, cols * sW if cols < spec.spatial_out[-1] else 0)
    lead = -(-pW // vector) * vector
    width = lead - pW + (cols - 1) * sW + (kW - 1) * dW + 1
    return Slab(kD, (rows - 1) * sH + (kH - 1) * dH + 1, -(-width // vector) * vector, lead, vector)


def default_tile(spec: Pooling, dtype: torch.dtype, outputs: int = OUTPUTS_PER_BLOCK) -> tuple[int, int] | None:
    """(rows, cols) of outputs per "rows" block: about ``outputs``, whole output rows where they are
    short enough, bands of equal height; None when even one row of ``MAX_TILE_COLS`` outputs stages
    more than STAGED_BYTES (the window kernel takes those)."""
    _, oH, oW = _as_3d(spec.spatial_out, 1)
    if spec.adaptive or covers_whole_input(spec):
        return None
    tiles = -(-oW // min(oW, MAX_TILE_COLS, outputs))
    cols = oW if tiles == 1 else -(-oW // (tiles * 8)) * 8  # equal tiles of whole 16-byte vectors
    rows = min(oH, max(1, outputs // cols))
    rows = -(-oH // -(-oH // rows))  # equal bands
    while rows > 1 and slab(spec, dtype, rows, cols).bytes(dtype) > STAGED_BYTES:
        rows = -(-rows // 2)
    return (rows, cols) if slab(spec, dtype, rows, cols).bytes(dtype) <= STAGED_BYTES else None


def pool_kernel(spec: Pooling, input_shape: tuple[int, ...], dtype: torch.dtype, kernel: str | None = None,
                threads: int | None = None, rows: int | None = None, cols: int | None = None,
                predicated: bool = False, outputs: int | None = None, staged: bool = True,
                lanes: int | None = None, march: int = 1, groups: int | None = None,
                flat: bool | None = None) -> KernelSpec:
    """The kernel for ``spec``: the default's, or the one a launch config from
    :func:`launch_variants` names (``rows`` x ``cols`` is the tile of a "rows" kernel)."""
    if kernel is None:
        return pool_kernel(spec, input_shape, dtype, **launch_variants(spec, input_shape, dtype)[0])
    if kernel == SIZES_AT_LAUNCH:
        problem = sized_unsupported(spec, input_shape, dtype)
        if problem:
            raise ValueError(f"the {SIZES_AT_LAUNCH} kernel does not take {spec}: {problem}")
        launch = sized_launch(spec, input_shape, dtype, threads, groups, outputs, flat)
        return sizes_at_launch_kernel(spec, dtype, launch)
    if kernel == "planes":
        return whole_input_kernel(spec, input_shape, dtype, threads or PLANES_PER_BLOCK, staged)
    if kernel == "lanes":
        return lanes_kernel(spec, input_shape, dtype, threads or BLOCK, lanes)
    if kernel == "rows":
        tile = (rows, cols) if rows and cols else default_tile(spec, dtype)
        return rows_kernel(spec, input_shape, dtype, threads or BLOCK, *tile)
    if kernel == "split":
        return split_window_kernel(spec, input_shape, dtype, threads or BLOCK, lanes or window_lanes(spec))
    if kernel == "strips":
        return strips_kernel(spec, input_shape, dtype, threads or BLOCK)
    if kernel == "vectors":
        return vectors_kernel(spec, input_shape, dtype, threads or BLOCK, outputs or vector_outputs(spec, dtype), march)
    return window_kernel(spec, input_shape, dtype, threads or BLOCK, predicated, outputs or 1)


def kernel_key(spec: Pooling, input_shape: tuple[int, ...], dtype: torch.dtype, **config) -> KernelKey:
    """What one build of :func:`pool_kernel` (of the default launch, or ``config``'s) serves. The
    sizes-at-launch kernel: every workload of the geometry, dtype and size classes (``vector``,
    ``wide``: the ``shared`` part, whose builds compute one another's workloads) and launch class
    (its tile). The others are built for one shape: the key names it."""
    config = config or launch_variants(spec, input_shape, dtype)[0]
    if config["kernel"] == SIZES_AT_LAUNCH:
        launch = sized_launch(spec, input_shape, dtype, config.get("threads"), config.get("groups"),
                              config.get("outputs"), config.get("flat"))
        return KernelKey((unsized(spec), dtype, launch["vector"], launch["wide"]),
                         (launch["threads"], launch["groups"], launch["outputs"], launch["flat"]))
    return KernelKey((spec, tuple(input_shape), dtype), tuple(sorted(config.items())))


def launch_variants(spec: Pooling, input_shape: tuple[int, ...], dtype: torch.dtype) -> list[dict]:
    """Launch configs ``npuops run --tune`` chooses among, the default first: the sizes-at-launch
    kernel's where it takes the workload (one build for many sizes: the functions for model code
    call the default), then the kernels built for its shape (:func:`shape_variants`), which the
    tuned configs name and a GPU run compares it with."""
    return sized_variants(spec, input_shape, dtype) + shape_variants(spec, dtype, math.prod(input_shape[:2]))


def shape_variants(spec: Pooling, dtype: torch.dtype, planes: int | None = None) -> list[dict]:
    """Launch configs of the kernels built for one shape (the sizes in ``spec``; ``planes``: the
    input's batch times channels, where known), their default first."""
    if stages_planes(spec, dtype, PLANES_PER_BLOCK):
        staged = [{"kernel": "planes", "threads": t} for t in (PLANES_PER_BLOCK, PLANES_PER_BLOCK // 2, PLANES_PER_BLOCK * 2)
                  if stages_planes(spec, dtype, t)]
        most = plane_lanes(spec, dtype)
        if not loads_planes_whole(spec, dtype):
            # Lanes of single elements first where the blocks of staged planes leave most SMs idle
            # (4 blocks of threads each walking a 169-long plane in shared memory: 4.2 µs against
            # torch.compile's 1.7 on 512 planes, H100); after the staged planes elsewhere. Half
            # the lanes first: 1.50 µs against 1.55 (and 1.63 at 256 threads) there.
            lanes = [{"kernel": "lanes", "threads": BLOCK // 2, "lanes": most // 2}] + [
                {"kernel": "lanes", "threads": t} for t in (BLOCK // 2, BLOCK)] if most and most >= 4 else []
            return lanes + staged if _fills_few(planes, PLANES_PER_BLOCK) else staged + lanes
        # Lanes first where they apply: on an H200, 6.0 µs against 6.3-7.4 for every planes variant
        # on textcnn-global. Half the lanes, two vectors each, first of those, as torch.compile's
        # kernel gives a 128-long plane 8 threads: 5.18 µs against 5.73 for lanes of one vector.
        unstaged = [{"kernel": "planes", "threads": t, "staged": False} for t in (PLANES_PER_BLOCK // 2, PLANES_PER_BLOCK)]
        lanes = [{"kernel": "lanes", "threads": t, "lanes": most // 2} for t in (BLOCK // 2, BLOCK // 4) if most >= 4] + [
            {"kernel": "lanes", "threads": t} for t in (BLOCK // 2, BLOCK)] if most else []
        return lanes + staged + unstaged
    window = [{"kernel": "window", "threads": t} for t in (BLOCK, BLOCK // 2, BLOCK * 2)]
    predicated = [{"kernel": "window", "threads": BLOCK, "predicated": True}]
    # Two outputs a thread, as torch.compile's kernel takes 1-d windows.
    paired = [{"kernel": "window", "threads": t, "predicated": True, "outputs": 2} for t in (BLOCK, BLOCK // 2)
              ] if len(spec.spatial_in) == 1 else []
    most = window_lanes(spec)
    split = [{"kernel": "split", "threads": t, "lanes": most} for t in (BLOCK, BLOCK // 2)] if most else []
    tile = default_tile(spec, dtype)
    if tile is None:
        # Few outputs: a thread each leaves most SMs idle, so lanes per output lead (split_window_kernel).
        few = _fills_few(None if planes is None else planes * math.prod(spec.spatial_out), BLOCK)
        # Adaptive windows vary in length, so a thread's taps are masked either way: masked loads,
        # all issued first, took 2.37 µs where branches took 3.6 (17x23 to 5x7, 1024 planes, H100).
        threads = [*predicated, *window] if spec.adaptive else [*window, *predicated]
        return [*split, *threads] if few else [*threads, *split]
    predicated += split
    # Smaller tiles make more blocks (small inputs); larger ones stage fewer halo rows per output.
    tiles = [tile, *(t for t in (default_tile(spec, dtype, OUTPUTS_PER_BLOCK // 4),
                                 default_tile(spec, dtype, OUTPUTS_PER_BLOCK * 4)) if t and t != tile)]
    rows = [{"kernel": "rows", "threads": t, "rows": r, "cols": c}
            for (r, c) in dict.fromkeys(tiles) for t in (BLOCK, BLOCK // 2)]
    # After the default: measured within 0.2 us of the others where it applies (H200).
    strips = [{"kernel": "strips", "threads": t} for t in (BLOCK, BLOCK // 2)] if strip_width(spec, dtype) else []
    outputs = vector_outputs(spec, dtype)
    vectors = [{"kernel": "vectors", "threads": t, "outputs": outputs * m} for m in (1, 2) for t in (BLOCK // 2, BLOCK)
               ] if outputs else []
    # 128 threads: 53-60 µs on medicalnet-stem where 256 took 67-88 (H200).
    vectors += [{"kernel": "vectors", "threads": t, "outputs": outputs, "march": m}
                for m in marches(spec) for t in (BLOCK // 4, BLOCK // 2)] if outputs else []
    # Half-size window blocks too: on small inputs (AvgPool3d divisor: 124 blocks of 256) they fill every SM.
    first = [*rows, *strips, *window[:2]] if prefers_rows(spec) else [*window[:2], *rows, *strips]
    if side_by_side(spec):
        return [*paired, *first, *vectors, *predicated]
    # The vectors kernel (128 threads) leads where it applies: in tunings on an H200 it was faster
    # than the leading launch of ``first`` on each such workload but c3d-pool2 (16.83 against
    # 16.40 µs); that launch took up to 1.9 times the fastest variant (resnet-stem 26.69 -> 17.70
    # µs, medicalnet-stem 66.18 -> 38.43, 34.03 with its marching variant); within 3% of the
    # fastest on the others.
    return [*vectors[:1], *first, *vectors[1:], *predicated, *paired]


def _fills_few(items: int | None, per_block: int) -> bool:
    """Whether blocks of ``per_block`` of ``items`` reach fewer than half the GPU's SMs."""
    return items is not None and -(-items // per_block) < multiprocessors() // 2


def side_by_side(spec: Pooling) -> bool:
    """1-d windows that tile the input: no overlap, no gap, no padding. Two outputs a thread won
    the one such workload, sincnet: 10.14 µs against 12.03 for the rows kernel; on the four 1-d
    workloads with overlapping windows rows or vectors won, by 3-18% (H200)."""
    kernel, stride, padding, dilation = _sliding(spec)
    return len(spec.spatial_in) == 1 and kernel == stride and not any(padding) and dilation == (1, 1, 1)


def prefers_rows(spec: Pooling) -> bool:
    """Whether the rows kernel is the default for these sliding windows: 1-d pools and windows
    that do not overlap. Measured on the H200 (every variant timed): it
    won there (long-temporal 17.9 vs 22.2 µs, vgg-block, c3d), while overlapping 2-d/3-d windows
    ran faster a thread per output (resnet-stem 34.1 vs 40.3 µs, alexnet, the small 3-d ones;
    one exception, 5x5 stride 2: 5.9 vs 6.6 µs)."""
    kernel, stride, _, dilation = _sliding(spec)
    return len(spec.spatial_in) == 1 or all(k <= s and d == 1 for k, s, d in zip(kernel, stride, dilation, strict=True))


def _sliding(spec: Pooling) -> tuple[tuple[int, int, int], ...]:
    """(kernel, stride, padding, dilation) of sliding windows, each as 3-d."""
    return (_as_3d(spec.kernel, 1), _as_3d(spec.stride, 1), _as_3d(spec.padding, 0), _as_3d(spec.dilation, 1))


def _result(spec: Pooling, acc, starts, ends, taps, sizes, padding):
    """A window's output in fp32 from its max or sum ``acc``, dividing as PyTorch divides: the
    window starts at ``starts`` (per dim) and its taps end at ``ends`` (the input's edge, or the
    adaptive window's). Average pooling has no dilation, so a window's taps are contiguous."""
    import tilelang.language as T

    if spec.mode == "max":
        return acc
    if spec.divisor_override is not None:
        return acc / T.float32(spec.divisor_override)
    if spec.adaptive or not spec.count_include_pad:
        count = math.prod(T.min(s + k, e) - T.max(s, 0) for s, e, k in zip(starts, ends, taps, strict=True))
    else:
        # PyTorch counts the padding taps, but not taps a ceil-mode window runs past the padded input.
        count = math.prod(T.min(s + k, n + p) - s for s, k, n, p in zip(starts, taps, sizes, padding, strict=True))
    return acc / T.Cast(F32, count)


def _accumulate(spec: Pooling, acc, v, dtype: str):
    """``acc`` after one more tap ``v``, both of ``dtype`` (see :func:`accumulator_dtype`)."""
    import tilelang.language as T

    if spec.mode == "max":
        return T.call_extern(dtype, {F32: "npuops_max_nan", "bfloat16": "npuops_max_nan_bf16",
                                     "float16": "npuops_max_nan_f16"}[dtype], acc, v)
    return acc + v


def _identity(spec: Pooling, dtype: str):
    """What a window's reduction starts from, of ``dtype`` (see :func:`accumulator_dtype`)."""
    import tilelang.language as T

    return T.Cast(dtype, -T.infinity(F32)) if spec.mode == "max" else T.float32(0)


def accumulator_dtype(spec: Pooling, dtype: torch.dtype) -> str:
    """What a window's taps are reduced in: a max of 16-bit taps in their own type (exact, and
    no conversion a tap: a max.NaN.bf16 instead of a conversion and a max.NaN.f32); sums in fp32."""
    return tilelang_dtype(dtype) if spec.mode == "max" and dtype.itemsize == 2 else F32


def clamps_into_window(spec: Pooling, dims: tuple[int, ...]) -> bool:
    """Whether a tap past the input along ``dims`` (of the 3-d view) may read the nearest input
    element instead of being masked: for max over contiguous taps (dilation 1), a window partly
    outside the input holds that edge element already (it overlaps the input: padding is at most
    half the window, and a ceil-mode window starts inside), so repeating it leaves the max as is."""
    dilation = _sliding(spec)[3]
    return spec.mode == "max" and not spec.adaptive and all(dilation[d] == 1 for d in dims)


def prelude(spec: Pooling) -> str | None:
    """What a kernel for ``spec`` needs before its body (:data:`MAX_NAN` for max pooling)."""
    return MAX_NAN if spec.mode == "max" else None


def loads_planes_whole(spec: Pooling, dtype: torch.dtype) -> bool:
    """Whether a thread can load a whole plane as 16-byte vectors (the unstaged planes variant)."""
    return covers_whole_input(spec) and math.prod(spec.spatial_in) * dtype.itemsize % VECTOR_BYTES == 0


def whole_input_kernel(spec: Pooling, input_shape: tuple[int, ...], dtype: torch.dtype, block: int,
                       staged: bool = True) -> KernelSpec:
    """Global pooling. A thread per output walking its plane in global memory with 2-byte loads
    reads 32 planes per warp instruction (uncoalesced: 0.31x torch.compile on a 128-long max pool),
    so a block first copies PLANES_PER_BLOCK whole planes to shared memory with coalesced loads,
    then each thread reduces one plane there (planes small enough for STAGED_BYTES; larger ones
    take the window kernel). Unstaged (a launch variant, for planes of whole 16-byte vectors): each
    thread loads its plane into registers as vectors, a sixteenth of the load instructions, and
    needs neither shared memory nor a barrier."""
    import tilelang.language as T

    dt = tilelang_dtype(dtype)
    at = accumulator_dtype(spec, dtype)
    planes, size = math.prod(input_shape[:2]), math.prod(input_shape[2:])
    padded = staged_row(spec, dtype) if staged else size
    divisor = float(spec.divisor_override or size)  # the window is the input: no padding to count

    @T.prim_func
    def main(X: T.Tensor((planes, size), dt), Y: T.Tensor((planes, 1), dt)):
        with T.Kernel(T.ceildiv(planes, block), threads=block, prelude=prelude(spec)) as bx:
            # Tile-level form, as the window kernel: it also builds for TileLang's CPU target.
            if staged:
                tile = T.alloc_shared((block, padded), dt)
            else:
                tile = T.alloc_fragment((block, size), dt)
                T.annotate_layout({tile: thread_owned((block, size), 0)})
            acc = T.alloc_fragment((block,), at)
            for p, k in T.Parallel(block, size):
                tile[p, k] = X[T.min(bx * block + p, planes - 1), k]
            for p in T.Parallel(block):
                if bx * block + p < planes:
                    acc[p] = _identity(spec, at)
                    for k in (T.serial if staged else T.unroll)(size):  # unrolled: registers
                        v = T.Cast(at, tile[p, k])
                        acc[p] = _accumulate(spec, acc[p], v, at)
                    Y[bx * block + p, 0] = T.Cast(dt, acc[p] if spec.mode == "max" else acc[p] / divisor)

    return KernelSpec(
        main,
        (("input", (planes, size)), ("output", (planes, 1))),
        {"output": dtype},
        (("output", (*input_shape[:2], *spec.spatial_out)),),
        {"kernel": "planes", "threads": block, "planes_per_block": block, "staged": staged, "shared_row": padded if staged else 0},
    )


def plane_lanes(spec: Pooling, dtype: torch.dtype) -> int | None:
    """Threads per plane of the "lanes" kernel (None: it does not take ``spec``): global pooling,
    up to a warp of lanes. Over planes of at least two whole 16-byte vectors, a vector or more
    each; over other planes, of at least 4 elements, single elements (:func:`lane_elements`), the
    most lanes (a power of two) that leave each two or more."""
    if not covers_whole_input(spec):
        return None
    size = math.prod(spec.spatial_in)
    if loads_planes_whole(spec, dtype):
        lanes = math.gcd(WARP, size * dtype.itemsize // VECTOR_BYTES)
    else:
        lanes = _lanes_for(size)
    return lanes if lanes >= 2 else None


def _lanes_for(items: int) -> int:
    """The most lanes, a power of two up to a warp, that leave each two or more of ``items`` (1: none)."""
    return min(WARP, 1 << ((items // 2).bit_length() - 1)) if items >= 4 else 1


def lane_elements(spec: Pooling, dtype: torch.dtype) -> int:
    """Elements a lane loads at once: a 16-byte vector where planes are rows of them, else one."""
    return VECTOR_BYTES // dtype.itemsize if loads_planes_whole(spec, dtype) else 1


def lanes_kernel(spec: Pooling, input_shape: tuple[int, ...], dtype: torch.dtype, block: int,
                 lanes: int | None = None) -> KernelSpec:
    """Global pooling with ``lanes`` threads per plane (a divisor of :func:`plane_lanes`, by
    default all of them): lane g loads vectors (or elements, :func:`lane_elements`) g, g + lanes,
    ... of its plane, so a warp's load instruction reads whole planes, contiguous (the unstaged
    planes kernel's thread per plane makes every load instruction touch 32 planes); past a plane
    of single elements, a lane takes the reduction's identity. The
    lanes' partial results meet in shared memory (TileLang's shuffle reduction does not build for
    the CPU target), where the plane's first lane combines them."""
    import tilelang.language as T

    dt = tilelang_dtype(dtype)
    at = accumulator_dtype(spec, dtype)
    planes, size = math.prod(input_shape[:2]), math.prod(input_shape[2:])
    vector = lane_elements(spec, dtype)
    most = plane_lanes(spec, dtype)
    lanes = lanes or most
    if not most or most % lanes or lanes < 2:
        raise ValueError(f"lanes must be a divisor of {most} and at least 2, got {lanes}")
    per_block = block // lanes
    vectors_per_lane = -(-size // (vector * lanes))
    padded = vectors_per_lane * vector * lanes  # size, for planes of whole vectors
    divisor = float(spec.divisor_override or size)
    identity = _identity(spec, at)

    @T.prim_func
    def main(X: T.Tensor((planes, size), dt), Y: T.Tensor((planes, 1), dt)):
        with T.Kernel(T.ceildiv(planes, per_block), threads=block, prelude=prelude(spec)) as bx:
            tile = T.alloc_fragment((per_block, padded), dt)
            T.annotate_layout({tile: interleaved_vectors(per_block, padded, lanes, vector)})
            partial = T.alloc_shared((per_block, lanes), at)
            acc, v = T.alloc_var(at), T.alloc_var(at)  # v: a tap, cast once
            for p, k in T.Parallel(per_block, padded):
                plane = T.min(bx * per_block + p, planes - 1)
                if padded == size:
                    tile[p, k] = X[plane, k]
                else:
                    tile[p, k] = T.if_then_else(k < size, X[plane, T.min(k, size - 1)], T.Cast(dt, identity))
            for p, g in T.Parallel(per_block, lanes):
                acc = identity
                for j in T.unroll(vectors_per_lane):
                    for e in T.unroll(vector):
                        v = T.Cast(at, tile[p, (j * lanes + g) * vector + e])
                        acc = _accumulate(spec, acc, v, at)
                partial[p, g] = acc
            for p, g in T.Parallel(per_block, lanes):  # the whole block: TileLang keeps the barrier
                if g == 0 and bx * per_block + p < planes:
                    acc = identity
                    for h in T.serial(lanes):
                        acc = _accumulate(spec, acc, partial[p, h], at)
                    Y[bx * per_block + p, 0] = T.Cast(dt, acc if spec.mode == "max" else acc / divisor)

    return KernelSpec(
        main,
        (("input", (planes, size)), ("output", (planes, 1))),
        {"output": dtype},
        (("output", (*input_shape[:2], *spec.spatial_out)),),
        {"kernel": "lanes", "threads": block, "lanes": lanes},
    )


def rows_kernel(spec: Pooling, input_shape: tuple[int, ...], dtype: torch.dtype, block: int, rows: int,
                cols: int) -> KernelSpec:
    """Sliding windows: a block per (plane, output depth, tile of ``rows`` x ``cols`` outputs)
    stages the input its windows cover in shared memory, then reduces each window there."""
    import tilelang.language as T

    dt = tilelang_dtype(dtype)
    at = accumulator_dtype(spec, dtype)
    planes = math.prod(input_shape[:2])
    D, H, W = _as_3d(spec.spatial_in, 1)
    oD, oH, oW = _as_3d(spec.spatial_out, 1)
    (kD, kH, kW), (sD, sH, sW), (pD, pH, pW), (dD, dH, dW) = _sliding(spec)
    s = slab(spec, dtype, rows, cols)
    bands, tiles = -(-oH // rows), -(-oW // cols)
    pieces = s.depth * s.rows * (s.cols // s.vector)  # vectors staged per block
    identity = _identity(spec, at)

    @T.prim_func
    def main(X: T.Tensor((planes, D, H, W), dt), Y: T.Tensor((planes, oD, oH, oW), dt)):
        with T.Kernel(planes * oD * bands * tiles, threads=block, prelude=prelude(spec)) as bx:
            staged = T.alloc_shared((s.depth, s.rows, s.cols), dt)
            acc, v = T.alloc_var(at), T.alloc_var(at)  # v: a tap, cast once
            tile = bx % tiles
            band = (bx // tiles) % bands
            od = (bx // (tiles * bands)) % oD
            plane = bx // (tiles * bands * oD)
            d0, h0, w0 = od * sD - pD, band * rows * sH - pH, tile * cols * sW - s.lead
            # A block-wide loop of whole vectors per round: TileLang vectorizes a T.Parallel loop
            # only when its extent splits evenly into the threads' vectors.
            for step in T.serial(-(-pieces // block)):
                for t, e in T.Parallel(block, s.vector):
                    piece = step * block + t
                    i = piece // (s.rows * (s.cols // s.vector))
                    r = piece // (s.cols // s.vector) % s.rows
                    c = piece % (s.cols // s.vector) * s.vector + e
                    d, h, w = d0 + i * dD, h0 + r, w0 + c
                    if piece < pieces:
                        inside = d >= 0 and d < D and h >= 0 and h < H and w >= 0 and w < W
                        staged[i, r, c] = T.if_then_else(inside, X[plane, d, h, w], T.Cast(dt, identity))
            for step in T.serial(-(-rows * cols // block)):
                for t in T.Parallel(block):
                    r = (step * block + t) // cols
                    c = (step * block + t) % cols
                    oh, ow = band * rows + r, tile * cols + c
                    if r < rows and oh < oH and ow < oW:
                        acc = identity
                        for i, j, k in T.grid(kD, kH, kW):
                            v = T.Cast(at, staged[i, r * sH + j * dH, s.lead - pW + c * sW + k * dW])
                            acc = _accumulate(spec, acc, v, at)
                        starts = (d0, oh * sH - pH, ow * sW - pW)
                        Y[plane, od, oh, ow] = T.Cast(dt, _result(spec, acc, starts, (D, H, W), (kD, kH, kW),
                                                                  (D, H, W), (pD, pH, pW)))

    return KernelSpec(
        main,
        (("input", (planes, D, H, W)), ("output", (planes, oD, oH, oW))),
        {"output": dtype},
        (("output", (*input_shape[:2], *spec.spatial_out)),),
        {"kernel": "rows", "threads": block, "rows": rows, "cols": cols, "staged_bytes": s.bytes(dtype),
         "vector": s.vector},
    )


def strip_width(spec: Pooling, dtype: torch.dtype) -> int | None:
    """Outputs per thread of the "strips" kernel (None: it does not take ``spec``): windows that
    tile the input (stride = kernel, no dilation or padding, none past the input) whose ``width``
    outputs read one 16-byte-aligned vector per window row."""
    kernel, stride, padding, dilation = _sliding(spec)
    if spec.adaptive or covers_whole_input(spec) or kernel != stride or any(padding) or any(d != 1 for d in dilation):
        return None
    if any(o * k > n for o, k, n in zip(_as_3d(spec.spatial_out, 1), kernel, _as_3d(spec.spatial_in, 1), strict=True)):
        return None
    width = VECTOR_BYTES // dtype.itemsize // kernel[2]
    W, oW = spec.spatial_in[-1], spec.spatial_out[-1]
    ok = width >= 2 and width * kernel[2] * dtype.itemsize == VECTOR_BYTES and oW % width == 0 and W % (width * kernel[2]) == 0
    return width if ok else None


def strips_kernel(spec: Pooling, input_shape: tuple[int, ...], dtype: torch.dtype, block: int) -> KernelSpec:
    """Windows that tile the input (see :func:`strip_width`): a thread per strip of ``width``
    adjacent outputs loads, for each window row, the one 16-byte vector those windows cover into
    registers and reduces them there: every input byte read once, in full vectors, with no shared
    memory or barrier (the "rows" kernel's staging costs a barrier and a second pass)."""
    import tilelang.language as T

    dt = tilelang_dtype(dtype)
    at = accumulator_dtype(spec, dtype)
    planes = math.prod(input_shape[:2])
    D, H, W = _as_3d(spec.spatial_in, 1)
    oD, oH, oW = _as_3d(spec.spatial_out, 1)
    (kD, kH, kW), *_ = _sliding(spec)
    width = strip_width(spec, dtype)
    strips = oW // width
    total = planes * oD * oH * strips
    window_rows = kD * kH

    def strip_of(n):
        """(plane, od, oh, first ow) of strip n."""
        return n // (strips * oH * oD), (n // (strips * oH)) % oD, (n // strips) % oH, n % strips * width

    @T.prim_func
    def main(X: T.Tensor((planes, D, H, W), dt), Y: T.Tensor((planes, oD, oH, oW), dt)):
        with T.Kernel(T.ceildiv(total, block), threads=block, prelude=prelude(spec)) as bx:
            # Thread t holds taps[:, t, :] in both loops below: its window rows' 16-byte vectors.
            taps = T.alloc_fragment((window_rows, block, width, kW), dt)
            T.annotate_layout({taps: thread_owned((window_rows, block, width, kW), 1)})
            # ... and its strip's outputs, stored as one vector.
            strip = T.alloc_fragment((block, width), dt)
            T.annotate_layout({strip: thread_owned((block, width), 0)})
            acc, v = T.alloc_var(at), T.alloc_var(at)  # v: a tap, cast once
            for r in T.unroll(window_rows):
                for t, c, k in T.Parallel(block, width, kW):
                    plane, od, oh, ow = strip_of(T.min(bx * block + t, total - 1))
                    taps[r, t, c, k] = X[plane, od * kD + r // kH, oh * kH + r % kH, (ow + c) * kW + k]
            for t, c in T.Parallel(block, width):
                plane, od, oh, ow = strip_of(bx * block + t)
                acc = _identity(spec, at)
                for r, k in T.grid(window_rows, kW):
                    v = T.Cast(at, taps[r, t, c, k])
                    acc = _accumulate(spec, acc, v, at)
                starts = (od * kD, oh * kH, (ow + c) * kW)
                strip[t, c] = T.Cast(dt, _result(spec, acc, starts, (D, H, W), (kD, kH, kW), (D, H, W), (0, 0, 0)))
            for t, c in T.Parallel(block, width):
                if bx * block + t < total:
                    plane, od, oh, ow = strip_of(bx * block + t)
                    Y[plane, od, oh, ow + c] = strip[t, c]

    return KernelSpec(
        main,
        (("input", (planes, D, H, W)), ("output", (planes, oD, oH, oW))),
        {"output": dtype},
        (("output", (*input_shape[:2], *spec.spatial_out)),),
        {"kernel": "strips", "threads": block, "width": width},
    )


def row_span(spec: Pooling, vector: int, outputs: int) -> tuple[int, int]:
    """(lead, span) of a thread taking ``outputs`` adjacent outputs of a row and loading, per window
    row, the ``vector``-element pieces their windows span: ``span`` elements from ``lead`` columns
    left of its first window's start plus the padding (``lead``: the padding rounded up to whole
    pieces, so that the thread's first piece starts on a piece boundary)."""
    (_, _, kW), (_, _, sW), (_, _, pW), (_, _, dW) = _sliding(spec)
    lead = -(-pW // vector) * vector
    return lead, -(-(lead - pW + (outputs - 1) * sW + (kW - 1) * dW + 1) // vector) * vector


def vector_outputs(spec: Pooling, dtype: torch.dtype) -> int | None:
    """Outputs per thread of the "vectors" kernel (None: it does not take ``spec``): sliding windows
    over rows a whole number of 16-byte vectors long, whose first input column per thread
    (``outputs * stride`` apart) stays on a vector boundary."""
    vector = VECTOR_BYTES // dtype.itemsize
    if spec.adaptive or covers_whole_input(spec) or spec.spatial_in[-1] % vector:
        return None
    stride = _sliding(spec)[1][2]
    return max(4, vector // math.gcd(vector, stride))


def marches(spec: Pooling) -> list[int]:
    """Output depths a "vectors" thread may take (besides one): where windows overlap in depth
    (kernel > stride, contiguous taps), even splits of the output depth near MARCH_STEPS (a
    thread's accumulators are registers: 9 depths of 4 outputs took 229 on medicalnet-stem)."""
    (kD, _, _), (sD, _, _), _, (dD, _, _) = _sliding(spec)
    oD = _as_3d(spec.spatial_out, 1)[0]
    if kD <= sD or dD != 1:
        return []
    return sorted({-(-oD // -(-oD // m)) for m in MARCH_STEPS if m < oD} - {1})


def vectors_kernel(spec: Pooling, input_shape: tuple[int, ...], dtype: torch.dtype, block: int,
                   outputs: int, march: int = 1) -> KernelSpec:
    """Sliding windows, a thread per ``outputs`` adjacent outputs of an output row: for each window
    row it loads the whole 16-byte vectors its windows span into registers (a vector past the
    input's edge is loaded from a clamped address as the reduction's identity, so no tap needs a
    mask), then reduces each window there, and stores its outputs together. torch.compile's Triton
    kernel has this form with one output and a 2-byte load per tap; here every load is a full
    vector and no shared memory or barrier is needed.

    ``march`` > 1 (:func:`marches`): the thread takes that many output depths too, reduces each
    input depth slice once and folds it into every window holding it. Windows overlapping in depth
    otherwise re-read their shared slices: a 3x3x3 stride-2 max pool loads 3 slices per output
    depth, or 2 marching (medicalnet-stem 59.8 -> 53.3 µs on the H200). Marching in height (2-d
    windows) lost on every workload where it applies, by 10-30%: a thread's slices are
    loaded one after another, where a thread per output row issues its rows' loads at once."""
    import tilelang.language as T

    dt = tilelang_dtype(dtype)
    planes = math.prod(input_shape[:2])
    sizes = D, H, W = _as_3d(spec.spatial_in, 1)
    oD, oH, oW = _as_3d(spec.spatial_out, 1)
    (kD, kH, kW), (sD, sH, sW), (pD, pH, pW), (dD, dH, dW) = taps_, stride, padding, dilation = _sliding(spec)
    if march > 1 and march not in marches(spec):
        raise ValueError(f"march must be 1 or one of {marches(spec)} for {spec}, got {march}")
    slices = (march - 1) * sD + kD  # march > 1: dilation 1
    vector = VECTOR_BYTES // dtype.itemsize
    groups = -(-oW // outputs)
    depths = -(-oD // march)
    total = planes * depths * oH * groups
    lead, span = row_span(spec, vector, outputs)
    at = accumulator_dtype(spec, dtype)
    identity = _identity(spec, at)

    def group_of(n):
        """(plane, first od, oh, first ow) of output group n."""
        return n // (groups * oH * depths), (n // (groups * oH)) % depths * march, (n // groups) % oH, n % groups * outputs

    def tap(o, dim, k=0):
        """Input position along ``dim`` (0: depth, 1: height, 2: width) of tap k of output o's window."""
        return o * stride[dim] - padding[dim] + k * dilation[dim]

    @T.prim_func
    def main(X: T.Tensor((planes, D, H, W), dt), Y: T.Tensor((planes, oD, oH, oW), dt)):
        with T.Kernel(T.ceildiv(total, block), threads=block, prelude=prelude(spec)) as bx:
            # Thread t holds taps[:, t, :] (a depth slice's window rows' vectors), acc[t] and result[t].
            taps = T.alloc_fragment((kH, block, span), dt)
            acc = T.alloc_fragment((block, march, outputs), at)
            result = T.alloc_fragment((block, march, outputs), dt)
            T.annotate_layout({taps: thread_owned((kH, block, span), 1), acc: thread_owned((block, march, outputs), 0),
                               result: thread_owned((block, march, outputs), 0)})
            part, v = T.alloc_var(at), T.alloc_var(at)  # part: a slice's taps reduced; v: a tap, cast once
            for t, j, c in T.Parallel(block, march, outputs):
                acc[t, j, c] = identity
            for i in T.unroll(slices):
                for r in T.unroll(kH):
                    for t, e in T.Parallel(block, span):
                        plane, od, oh, ow0 = group_of(T.min(bx * block + t, total - 1))
                        d, h = tap(od, 0, i), tap(oh, 1, r)
                        chunk = (ow0 * sW - lead) // vector + e // vector
                        # A vector outside the input is the reduction's identity, loaded from a clamped
                        # address: the taps need no masks (a max may take the nearest row instead).
                        inside = (chunk >= 0) & (chunk < W // vector)
                        if not clamps_into_window(spec, (0, 1)):
                            inside = inside & (d >= 0) & (d < D) & (h >= 0) & (h < H)
                        value = X[plane, _clamped(d, D), _clamped(h, H),
                                  _clamped(chunk, W // vector) * vector + e % vector]
                        taps[r, t, e] = T.if_then_else(inside, value, T.Cast(dt, identity))
                for t, c in T.Parallel(block, outputs):
                    part = identity
                    for r, k in T.grid(kH, kW):
                        v = T.Cast(at, taps[r, t, c * sW + k * dW + lead - pW])
                        part = _accumulate(spec, part, v, at)
                    for j in T.unroll(march):
                        # Slice i is tap i - j * sD of output depth j's window (march > 1: dilation 1).
                        holds = (i - j * sD >= 0) & (i - j * sD < kD)
                        acc[t, j, c] = T.if_then_else(holds, _accumulate(spec, acc[t, j, c], part, at), acc[t, j, c])
            for t, c in T.Parallel(block, outputs):
                for j in T.unroll(march):
                    plane, od, oh, ow0 = group_of(bx * block + t)
                    starts = (tap(od + j, 0), tap(oh, 1), tap(ow0 + c, 2))
                    part = acc[t, j, c]  # through a scalar: TileLang's CPU target cannot vectorize this loop
                    result[t, j, c] = T.Cast(dt, _result(spec, part, starts, sizes, taps_, sizes, padding))
            for t, j, c in T.Parallel(block, march, outputs):  # a thread's outputs stored as one vector
                plane, od, oh, ow0 = group_of(bx * block + t)
                if bx * block + t < total and (oW % outputs == 0 or ow0 + c < oW) and (oD % march == 0 or od + j < oD):
                    Y[plane, od + j, oh, ow0 + c] = result[t, j, c]

    return KernelSpec(
        main,
        (("input", (planes, D, H, W)), ("output", (planes, oD, oH, oW))),
        {"output": dtype},
        (("output", (*input_shape[:2], *spec.spatial_out)),),
        {"kernel": "vectors", "threads": block, "outputs": outputs, "span": span, "march": march},
    )


# -- sliding windows with their sizes given at launch ---------------------------------------------
SIZES_AT_LAUNCH = "sizes_at_launch"
SIZE_NAMES = ("D", "H", "W")  # the input's spatial sizes (3-d view) as the kernel takes them at launch
OUT_NAMES = ("oD", "oH", "oW")
GRID_X_LIMIT = 2**31 - 1  # CUDA's limit on gridDim.x
BLOCK_SMALL = 128  # threads per block, as the vectors kernel's default launch
MAX_THREADS = 1024  # CUDA's most threads a block
VECTOR_OUTPUTS = 4  # outputs a thread over rows of whole vectors (at least: the windows' stride may ask more)
TAP_OUTPUTS = 2  # outputs a thread counted flat over rows loaded a tap at a time
# Threads a block puts along an output row (``groups``), each taking ``outputs`` adjacent outputs;
# the block's other threads take further planes. Rows of whole vectors: four threads of four or
# more outputs, 16-byte loads, so that a warp reads runs of 64 contiguous bytes and a column tile
# of 16 or so outputs idles at most three threads at a row's end. Other rows: a load a tap, so a
# thread an output (as the window kernel) and 16 along a row, so that a warp's load reads 16
# taps a stride apart (a thread of several outputs reads its taps a span apart: 4x the sectors).
# With fewer planes than a block then takes (a batch of one image of few channels), a row takes
# the block: FEW_PLANES_GROUPS.
ROW_GROUPS = {"vectors": 4, "taps": 16}
FEW_PLANES_GROUPS = 32
TAPS_PER_THREAD = 192  # input elements a thread may hold: 7 x 7 windows, stride 1, 8 16-bit outputs (7 rows of 24)


def unsized(spec: Pooling) -> Pooling:
    """``spec`` without its sizes: what the sizes-at-launch kernel's code may depend on."""
    rank = len(spec.spatial_in)
    return dataclasses.replace(spec, spatial_in=(0,) * rank, spatial_out=(0,) * rank)


def output_sizes(spec: Pooling, sizes) -> tuple[int, ...]:
    """The pooled sizes of input sizes ``sizes`` (one per spatial dim), as PyTorch computes them."""
    from .ops._pooling import pooled_length

    return tuple(pooled_length(n, k, s, p, d, spec.ceil_mode)
                 for n, k, s, p, d in zip(sizes, spec.kernel, spec.stride, spec.padding, spec.dilation, strict=True))


def held_taps(spec: Pooling, vector: int, outputs: int) -> int:
    """Input elements a sizes-at-launch thread holds at once: its window rows of a depth slice."""
    return _sliding(spec)[0][1] * row_span(spec, vector, outputs)[1]


def sized_launch(spec: Pooling, input_shape: tuple[int, ...], dtype: torch.dtype, threads: int | None = None,
                 groups: int | None = None, outputs: int | None = None, flat: bool | None = None) -> dict:
    """The sizes-at-launch kernel's launch for a workload: the config (``threads``, ``outputs`` a
    thread, and their order: ``flat``, counted flat, or ``groups`` along an output row in row
    tiles) and the decisions its code takes from the sizes, each a class of them: ``vector``, the
    elements a load takes (16 bytes where rows are whole vectors, else 1), ``wide``, whether
    indices need 64 bits.

    By default threads are counted flat (:func:`sizes_at_launch_kernel`), four outputs a thread
    over rows of whole vectors and two over other rows, whose taps load one at a time. Measured
    on the catalog's pools (H100, kernel time; these launches against the row tiles' best and the
    flat launch of one output a thread): alexnet-ceil 55 x 55 bf16 max 7.34 µs against 12.56 and
    9.38, ceil-divisor avg 2.88 against 4.80 and 3.55, resnet-stem 19.65 against 22.58, c3d-pool1
    81.2 against 82.1. Eight outputs a thread ran twice as slow as four wherever both applied
    (resnet-stem 38.4, c3d-pool1 152.4), so rows whose windows' stride would take eight for their
    first taps to be whole vectors apart (an odd stride over 16-bit rows, sincnet's 3: 24.1
    against the per-shape kernel's 8.7) load a tap at a time instead."""
    vector = VECTOR_BYTES // dtype.itemsize
    step = vector // math.gcd(vector, _sliding(spec)[1][2])  # outputs whose first taps are vectors apart
    if spec.spatial_in[-1] % vector or step > VECTOR_OUTPUTS:
        vector, step = 1, 1
    pooled = math.prod((*input_shape[:2], *spec.spatial_out))
    # A flat thread number runs up to a block past the last output.
    wide = wide_indices(input_shape) or wide_indices((pooled + MAX_THREADS,))
    flat = groups is None if flat is None else flat
    if not outputs:
        outputs = step * -(-VECTOR_OUTPUTS // step) if vector > 1 else TAP_OUTPUTS if flat else 1
        if held_taps(spec, vector, outputs) > TAPS_PER_THREAD:
            outputs = step
    if outputs % step:
        raise ValueError(f"outputs must be a multiple of {step}, got {outputs}")
    if flat:
        return {"kernel": SIZES_AT_LAUNCH, "threads": threads or (BLOCK if outputs == 1 else BLOCK_SMALL),
                "groups": None, "outputs": outputs, "vector": vector, "wide": wide, "flat": True}
    threads = threads or BLOCK_SMALL
    row_groups = ROW_GROUPS["vectors" if vector > 1 else "taps"]
    few_planes = math.prod(input_shape[:2]) < threads // row_groups
    groups = groups or (FEW_PLANES_GROUPS if few_planes else row_groups)
    if threads % groups:
        raise ValueError(f"groups must divide threads ({threads}), got {groups}")
    return {"kernel": SIZES_AT_LAUNCH, "threads": threads, "groups": groups, "outputs": outputs, "vector": vector,
            "wide": wide, "flat": False}


def sized_unsupported(spec: Pooling, input_shape: tuple[int, ...], dtype: torch.dtype) -> str | None:
    """Why the sizes-at-launch kernel does not take a workload (None: it does): it takes sliding
    windows that are not the whole input, whose taps a thread holds in registers and whose
    blocks (its default launch's) fit CUDA's grid."""
    if spec.adaptive or covers_whole_input(spec):
        return "adaptive and whole-input windows take kernels of their own"
    launch = sized_launch(spec, input_shape, dtype)
    if held_taps(spec, launch["vector"], launch["outputs"]) > TAPS_PER_THREAD:
        return f"a thread's taps of a depth slice would take more than {TAPS_PER_THREAD} registers"
    if sized_blocks(spec, input_shape, launch) > GRID_X_LIMIT:
        return f"output sizes {spec.spatial_out} of {math.prod(input_shape[:2])} planes need more than {GRID_X_LIMIT} blocks"
    return None


def sized_blocks(spec: Pooling, input_shape: tuple[int, ...], launch: dict) -> int:
    """The blocks a sizes-at-launch ``launch`` (of :func:`sized_launch`) runs for a workload."""
    oD, oH, oW = _as_3d(spec.spatial_out, 1)
    planes, outputs, threads = math.prod(input_shape[:2]), launch["outputs"], launch["threads"]
    if launch["flat"]:
        return -(-planes * oD * oH * -(-oW // outputs) // threads)
    layers = oD if len(spec.spatial_out) == 3 else -(-oW // (launch["groups"] * outputs))
    return -(-planes // (threads // launch["groups"])) * oH * layers


def sized_variants(spec: Pooling, input_shape: tuple[int, ...], dtype: torch.dtype) -> list[dict]:
    """The sizes-at-launch kernel's launch configs, its default first (none: it does not take
    the workload): threads counted flat (over rows loaded a tap at a time one output a thread,
    or four, too), then the row tiles of both row classes, whichever the planes would pick."""
    if sized_unsupported(spec, input_shape, dtype):
        return []
    default = sized_launch(spec, input_shape, dtype)
    flat = [{"kernel": SIZES_AT_LAUNCH, "threads": t, "flat": True} for t in dict.fromkeys((default["threads"], BLOCK))]
    if default["vector"] == 1:
        flat += [{"kernel": SIZES_AT_LAUNCH, "threads": t, "flat": True, "outputs": n}
                 for t, n in ((BLOCK, 1), (BLOCK_SMALL, 1), (BLOCK_SMALL, 2 * TAP_OUTPUTS))]
    first = sized_launch(spec, input_shape, dtype, flat=False)["groups"]
    # Twice the planes a block too: small images make thousands of 128-thread blocks.
    tiles = [{"kernel": SIZES_AT_LAUNCH, "threads": BLOCK_SMALL, "groups": g}
             for g in dict.fromkeys((first, *ROW_GROUPS.values(), FEW_PLANES_GROUPS))] + [
        {"kernel": SIZES_AT_LAUNCH, "threads": 2 * BLOCK_SMALL, "groups": first}]
    return flat + [config for config in tiles if sized_blocks(spec, input_shape, sized_launch(
        spec, input_shape, dtype, config["threads"], config["groups"])) <= GRID_X_LIMIT]


def sizes_at_launch_kernel(spec: Pooling, dtype: torch.dtype, launch: dict) -> KernelSpec:
    """Sliding windows, one build for every size of a launch class (:func:`kernel_key`): the
    planes (N * C), the input's and the output's spatial sizes come at launch (``T.dynamic``),
    the window, the dtype and the tile are built in.

    A thread takes ``outputs`` adjacent outputs of a row and computes them as the vectors kernel
    does: per window row it loads the input its windows span into registers, 16-byte vectors
    where rows are whole vectors (``vector``: the kernel assumes the row length a multiple of it),
    a load a tap otherwise; a load past the input's edge is made from a clamped address (the
    reduction's identity, or for a max of contiguous taps the nearest element, which the window
    holds already), so no tap needs a mask; then it reduces each window there, and stores its
    outputs one by one (the output row's length is not known to be a multiple of a vector).

    Which outputs, two orders. ``flat`` (the default): threads counted flat over the outputs'
    groups, as the per-shape vectors kernel counts them (a row's groups, then rows, depths,
    planes), so that a warp reads whole input rows; each thread divides its number by the
    sizes, in 32 bits. Row tiles (``groups`` threads along a row, the block's others on further
    planes; tuning variants): a block takes ``threads / groups`` planes, an output row and a
    layer, the column tile of ``groups * outputs`` outputs (1-d, 2-d) or the output depth (3-d,
    whose blocks walk their row's column tiles); blocks are numbered as memory runs (the layer
    fastest, the plane block slowest) and only the block number is divided by the sizes. On a
    16-bit stem pool of 2048 planes of 112 x 112 (H100, kernel time) counted flat 19.6 µs; the
    row tiles 52.6 (90 numbered plane block first), a warp reading eight planes 25 KB apart;
    torch.compile 28.0."""
    import tilelang.language as T

    spec = unsized(spec)  # built from the geometry alone: every size of the key runs this code
    dt, at = tilelang_dtype(dtype), accumulator_dtype(spec, dtype)
    rank = len(spec.spatial_in)
    index = "int64" if launch["wide"] else "int32"
    planes = T.dynamic("planes", index)
    ins = tuple(T.dynamic(name, index) for name in SIZE_NAMES[3 - rank:])
    outs = tuple(T.dynamic(name, index) for name in OUT_NAMES[3 - rank:])
    sizes = D, H, W = _as_3d(ins, 1)
    oD, oH, oW = _as_3d(outs, 1)
    taps_, stride, padding, dilation = _sliding(spec)
    (kD, kH, kW), (_, _, sW), (_, _, pW), (_, _, dW) = taps_, stride, padding, dilation
    block, groups, outputs, vector, flat = (launch[k] for k in ("threads", "groups", "outputs", "vector", "flat"))
    lead, span = row_span(spec, vector, outputs)
    identity = _identity(spec, at)
    masks_rows = not clamps_into_window(spec, (0, 1))
    masks_cols = not clamps_into_window(spec, (2,))  # a tap a load (vector 1): the nearest element serves a max

    def tap(o, dim, k=0):
        """Input position along ``dim`` (0: depth, 1: height, 2: width) of tap k of output o's window."""
        return o * stride[dim] - padding[dim] + k * dilation[dim]

    def element(offset):
        """The index of the input's (or output's) element ``offset``, counted flat: in the last dim,
        the others 0, which TileLang flattens to ``offset`` as it is (its bounds guard, which
        would see the last dim overrun, is off: see pass_configs)."""
        return (0,) * rank + (offset,)

    positive = functools.reduce(T.And, [size > 0 for size in (planes, *ins, *outs)])
    whole_vectors = W % vector == 0
    if flat:
        row_groups = T.ceildiv(oW, outputs)
        total = planes * oD * oH * row_groups
        blocks, steps = T.ceildiv(total, block), 1
    else:
        per_block = block // groups  # planes a block takes
        cols = groups * outputs  # output columns of a tile
        layers = oD if rank == 3 else T.ceildiv(oW, cols)  # per output row of a plane block
        blocks, steps = T.ceildiv(planes, per_block) * oH * layers, T.ceildiv(oW, cols) if rank == 3 else 1

    def position(t, coordinates, tile, step):
        """Thread t's plane, output depth, output row and column group (of ``outputs`` outputs):
        counted flat, its ``coordinates``; in row tiles, from its block's plane block, output row
        and layer (``tile``) and, 3-d, the column tile its block is at (``step``)."""
        if flat:
            return tuple(c[t] for c in coordinates)
        bx, oh, layer = tile
        return (bx * (block // groups) + t // groups, layer if rank == 3 else 0, oh,
                (step if rank == 3 else layer) * groups + t % groups)

    @T.prim_func
    def main(X: T.Tensor((planes, *ins), dt), Y: T.Tensor((planes, *outs), dt)):
        with T.Kernel(blocks, threads=block, prelude=prelude(spec)) as b:
            # Known to the simplifier: positive sizes, and rows of whole vectors (vectorized loads;
            # an assumption of its own: the vectorizer does not split a conjunction).
            T.evaluate(T.assume(positive))
            T.evaluate(T.assume(whole_vectors))
            # Thread t holds taps[:, t, :] (a depth slice's window rows), acc[t] and result[t].
            taps = T.alloc_fragment((kH, block, span), dt)
            acc = T.alloc_fragment((block, outputs), at)
            result = T.alloc_fragment((block, outputs), dt)
            T.annotate_layout({taps: thread_owned((kH, block, span), 1), acc: thread_owned((block, outputs), 0),
                               result: thread_owned((block, outputs), 0)})
            part, v = T.alloc_var(at), T.alloc_var(at)  # part: a slice's taps reduced; v: a tap, cast once
            # Element offsets and coordinates, computed (clamped) in variables of the index type,
            # then indexed flat: TileLang promotes an index it cannot bound (the sizes are unknown)
            # to 64 bits with everything in it. A bf16 3x3/2 stem thread took 1.9x the SASS
            # instructions of the per-shape vectors kernel's so, 1.3x with its coordinates in
            # 32-bit variables, 1.1x with its offsets (scripts/pool-kernel-code.py).
            offset, rest = T.alloc_var(index), T.alloc_var(index)
            # Where a thread's outputs are: counted flat, its own coordinates; in row tiles, its
            # block's (see ``position``).
            coordinates = tuple(T.alloc_fragment((block,), index) for _ in range(4))
            T.annotate_layout({c: thread_owned((block,), 0) for c in coordinates})
            bx, oh, layer = T.alloc_var(index), T.alloc_var(index), T.alloc_var(index)
            if flat:
                # The last block's spare threads compute the last group again and store nothing.
                # Truncating division: the number is not negative.
                for t in T.Parallel(block):
                    rest = T.min(T.Cast(index, b) * block + t, total - 1)
                    coordinates[3][t] = T.truncmod(rest, row_groups)
                    rest = T.truncdiv(rest, row_groups)
                    coordinates[2][t] = T.truncmod(rest, oH)
                    rest = T.truncdiv(rest, oH)
                    coordinates[1][t] = T.truncmod(rest, oD)
                    coordinates[0][t] = T.truncdiv(rest, oD)
            else:
                # The block's plane block, output row and layer (column tile, or 3-d the output
                # depth), numbered as memory runs: neighbouring blocks read neighbouring input.
                if rank == 3:  # b = (bx * oD + od) * oH + oh
                    oh = T.truncmod(T.Cast(index, b), oH)
                    layer = T.truncmod(T.truncdiv(T.Cast(index, b), oH), oD)
                    bx = T.truncdiv(T.Cast(index, b), oH * oD)
                else:  # b = (bx * oH + oh) * layers + tile
                    layer = T.truncmod(T.Cast(index, b), layers)
                    oh = T.truncmod(T.truncdiv(T.Cast(index, b), layers), oH)
                    bx = T.truncdiv(T.Cast(index, b), layers * oH)
            for step in T.serial(steps):
                for t, c in T.Parallel(block, outputs):
                    acc[t, c] = identity
                for i in T.unroll(kD):
                    for r in T.unroll(kH):
                        # Per piece of ``vector`` elements (a 16-byte vector, or one tap), counted
                        # from the thread's first (``lead``: left of its first window): its offset
                        # in the input, clamped into it; a piece outside is the reduction's identity
                        # (for a max of contiguous taps the nearest one, which the window holds).
                        for t, c in T.Parallel(block, span // vector):
                            plane, depth, row, group = position(t, coordinates, (bx, oh, layer), step)
                            d, h = tap(depth, 0, i), tap(row, 1, r)
                            piece = group * (outputs * sW // vector) - lead // vector + c
                            inside = (d >= 0) & (d < D) & (h >= 0) & (h < H) if masks_rows else True
                            if vector > 1 or masks_cols:
                                inside = inside & (piece >= 0) & (piece < W // vector)
                            offset = (((T.min(plane, planes - 1) * D + _clamped(d, D)) * H
                                       + _clamped(h, H)) * (W // vector) + _clamped(piece, W // vector))
                            for e in T.vectorized(vector):
                                value = X[element(offset * vector + e)]
                                taps[r, t, c * vector + e] = value if inside is True else T.if_then_else(
                                    inside, value, T.Cast(dt, identity))
                    for t, c in T.Parallel(block, outputs):
                        part = identity
                        for r, k in T.grid(kH, kW):
                            v = T.Cast(at, taps[r, t, c * sW + k * dW + lead - pW])
                            part = _accumulate(spec, part, v, at)
                        acc[t, c] = _accumulate(spec, acc[t, c], part, at)
                for t, c in T.Parallel(block, outputs):
                    plane, depth, row, group = position(t, coordinates, (bx, oh, layer), step)
                    starts = (tap(depth, 0), tap(row, 1), tap(group * outputs + c, 2))
                    part = acc[t, c]  # through a scalar: TileLang's CPU target cannot vectorize this loop
                    result[t, c] = T.Cast(dt, _result(spec, part, starts, sizes, taps_, sizes, padding))
                for t, c in T.Parallel(block, outputs):
                    plane, depth, row, group = position(t, coordinates, (bx, oh, layer), step)
                    stores = (T.Cast(index, b) * block + t < total) if flat else (plane < planes)
                    if stores and group * outputs + c < oW:
                        offset = ((plane * oD + depth) * oH + row) * oW + group * outputs + c
                        Y[element(offset)] = result[t, c]

    in_names, out_names = SIZE_NAMES[3 - rank:], OUT_NAMES[3 - rank:]

    def derived(given):
        return dict(zip(out_names, output_sizes(spec, [given[n] for n in in_names]), strict=True))

    return KernelSpec(
        main,
        (("input", ("planes", *in_names)), ("output", ("planes", *out_names))),
        {"output": dtype},
        (("output", (..., *out_names)),),
        {**launch, "span": span},
        # Loads and stores index their tensors flat (see element) at offsets clamped into them:
        # TileLang's bounds guard would take the last dim's overrun for out of bounds (a build
        # without these configs computes wrong results) and, where it cannot prove an index in
        # bounds, add a branch a tap.
        pass_configs={"tl.disable_safe_memory_legalize": True},
        derived=derived,
    )


def _clamped(x, n):
    """``x`` clamped into [0, n): an index every load may take, whatever masks its value after."""
    import tilelang.language as T

    return T.max(T.min(x, n - 1), 0)


def _window_taps(spec: Pooling) -> tuple[tuple[int, int, int], ...]:
    """(taps, stride, padding, dilation) per dim of the 3-d view of the windows a thread visits:
    sliding windows' own; adaptive ones' longest (shorter windows mask the rest)."""
    if not spec.adaptive:
        return _sliding(spec)
    taps = tuple(max(-(-(o + 1) * n // m) - o * n // m for o in range(m))
                 for n, m in zip(_as_3d(spec.spatial_in, 1), _as_3d(spec.spatial_out, 1), strict=True))
    return taps, (0, 0, 0), (0, 0, 0), (1, 1, 1)


@dataclass(frozen=True)
class _Windows:
    """What the window kernels visit: ``planes`` of ``ins`` (D, H, W) to ``outs`` (oD, oH, oW), and
    per dim of that 3-d view the windows' taps (:func:`_window_taps`), stride, padding, dilation."""

    spec: Pooling
    planes: int
    ins: tuple[int, int, int]
    outs: tuple[int, int, int]
    taps: tuple[int, int, int]
    stride: tuple[int, int, int]
    padding: tuple[int, int, int]
    dilation: tuple[int, int, int]

    @classmethod
    def of(cls, spec: Pooling, input_shape: tuple[int, ...]) -> "_Windows":
        return cls(spec, math.prod(input_shape[:2]), _as_3d(spec.spatial_in, 1), _as_3d(spec.spatial_out, 1),
                   *_window_taps(spec))

    @property
    def total(self) -> int:
        return self.planes * math.prod(self.outs)

    def position(self, idx):
        """(plane, od, oh, ow) of output ``idx`` (flat)."""
        oD, oH, oW = self.outs
        return idx // (oW * oH * oD), (idx // (oW * oH)) % oD, (idx // oW) % oH, idx % oW

    def bounds(self, od, oh, ow):
        """((first taps), (ends)) per dim of the window of output (od, oh, ow): sliding windows end
        at the input's edge (taps past it are skipped), adaptive ones where they end."""
        firsts, ends = [], []
        for o, n, m, s, p in zip((od, oh, ow), self.ins, self.outs, self.stride, self.padding, strict=True):
            firsts.append((o * n) // m if self.spec.adaptive else o * s - p)
            ends.append(((o + 1) * n + m - 1) // m if self.spec.adaptive else n)
        return tuple(firsts), tuple(ends)

    def clamped_tap(self, X, plane, d, h, w):
        """X's element at (d, h, w) clamped into the input: a load every tap may issue, whatever
        masks it after."""
        (D, H, W) = self.ins
        return X[plane, _clamped(d, D), _clamped(h, H), _clamped(w, W)]

    def result(self, acc, firsts, ends):
        """The window's output from its max or sum ``acc`` (see :func:`_result`)."""
        return _result(self.spec, acc, firsts, ends, self.taps, self.ins, self.padding)


def window_lanes(spec: Pooling) -> int | None:
    """Threads per output of the "split" kernel (None: it does not take ``spec``): the most (a
    power of two, up to a warp) that leave each two taps or more of the window."""
    lanes = _lanes_for(math.prod(_window_taps(spec)[0]))
    return lanes if lanes >= 2 else None


def split_window_kernel(spec: Pooling, input_shape: tuple[int, ...], dtype: torch.dtype, block: int,
                        lanes: int) -> KernelSpec:
    """Any pooling, ``lanes`` threads per output: lane g visits taps g, g + lanes, ... of the
    window (flattened depth, row, column: neighbouring lanes read neighbouring columns), all loaded
    before any is used (clamped into the input, masked after), and the lanes' results meet in
    shared memory, where the output's first lane combines them. For few outputs with long
    windows, where a thread per output leaves SMs idle and walks its window one tap at a time:
    an adaptive max pool of 31x31 planes to 4x4, 2048 outputs, took 12 µs that way (H100)."""
    import tilelang.language as T

    dt = tilelang_dtype(dtype)
    at = accumulator_dtype(spec, dtype)
    view = _Windows.of(spec, input_shape)
    planes, (D, H, W), (oD, oH, oW), total = view.planes, view.ins, view.outs, view.total
    (kD, kH, kW), (dD, dH, dW) = view.taps, view.dilation
    most = window_lanes(spec)
    if not most or most % lanes or lanes < 2:
        raise ValueError(f"lanes must be a divisor of {most} and at least 2, got {lanes}")
    per_block = block // lanes
    rounds = -(-(kD * kH * kW) // lanes)
    identity = _identity(spec, at)

    @T.prim_func
    def main(X: T.Tensor((planes, D, H, W), dt), Y: T.Tensor((planes, oD, oH, oW), dt)):
        with T.Kernel(T.ceildiv(total, per_block), threads=block, prelude=prelude(spec)) as bx:
            partial = T.alloc_shared((per_block, lanes), at)
            acc, v = T.alloc_var(at), T.alloc_var(at)  # v: a tap, cast once
            for t, g in T.Parallel(per_block, lanes):
                plane, od, oh, ow = view.position(T.min(bx * per_block + t, total - 1))
                (d0, h0, w0), (d_end, h_end, w_end) = view.bounds(od, oh, ow)
                acc = identity
                for r in T.unroll(rounds):
                    tap = r * lanes + g
                    d = d0 + tap // (kH * kW) * dD
                    h = h0 + tap // kW % kH * dH
                    w = w0 + tap % kW * dW
                    v = T.Cast(at, view.clamped_tap(X, plane, d, h, w))
                    inside = ((tap < kD * kH * kW) & (d >= 0) & (d < d_end) & (h >= 0) & (h < h_end)
                              & (w >= 0) & (w < w_end))
                    acc = T.if_then_else(inside, _accumulate(spec, acc, v, at), acc)
                partial[t, g] = acc
            for t, g in T.Parallel(per_block, lanes):  # the whole block: TileLang keeps the barrier
                if g == 0 and bx * per_block + t < total:
                    plane, od, oh, ow = view.position(bx * per_block + t)
                    acc = identity
                    for u in T.serial(lanes):
                        acc = _accumulate(spec, acc, partial[t, u], at)
                    Y[plane, od, oh, ow] = T.Cast(dt, view.result(acc, *view.bounds(od, oh, ow)))

    return KernelSpec(
        main,
        (("input", (planes, D, H, W)), ("output", (planes, oD, oH, oW))),
        {"output": dtype},
        (("output", (*input_shape[:2], *spec.spatial_out)),),
        {"kernel": "split", "threads": block, "lanes": lanes, "taps": view.taps},
    )


def window_kernel(spec: Pooling, input_shape: tuple[int, ...], dtype: torch.dtype, block: int,
                  predicated: bool = False, outputs: int = 1) -> KernelSpec:
    """Any pooling: a thread per output element (``outputs`` consecutive ones) visiting its
    window's taps in global memory.
    ``predicated``: every tap is loaded (from an address clamped into the input) and taps outside
    the window are masked afterwards, as torch.compile's Triton kernel masks its loads, so that a
    thread's loads are all issued before any is used; otherwise taps outside are skipped by
    branches. Measured on the H200: 13.6% faster on AdaptiveAvgPool2d nondiv-7x7, within 3% or
    slower elsewhere (four outputs per thread won nowhere)."""
    import tilelang.language as T

    dt = tilelang_dtype(dtype)
    at = accumulator_dtype(spec, dtype)
    view = _Windows.of(spec, input_shape)
    planes, (D, H, W), (oD, oH, oW), total = view.planes, view.ins, view.outs, view.total
    (kD, kH, kW), (dD, dH, dW) = view.taps, view.dilation

    @T.prim_func
    def main(X: T.Tensor((planes, D, H, W), dt), Y: T.Tensor((planes, oD, oH, oW), dt)):
        with T.Kernel(T.ceildiv(total, block * outputs), threads=block, prelude=prelude(spec)) as bx:
            acc, v = T.alloc_var(at), T.alloc_var(at)  # v: a tap, cast once
            for t in T.Parallel(block):
                for u in T.unroll(outputs):
                    idx = (bx * block + t) * outputs + u
                    if idx < total:
                        plane, od, oh, ow = view.position(idx)
                        (d0, h0, w0), (d_end, h_end, w_end) = view.bounds(od, oh, ow)
                        acc = _identity(spec, at)
                        for i, j, k in T.grid(kD, kH, kW):
                            d = d0 + i * dD
                            h = h0 + j * dH
                            w = w0 + k * dW
                            if predicated:
                                v = T.Cast(at, view.clamped_tap(X, plane, d, h, w))
                                if clamps_into_window(spec, (0, 1, 2)):
                                    acc = _accumulate(spec, acc, v, at)
                                else:
                                    inside = (d >= 0) & (d < d_end) & (h >= 0) & (h < h_end) & (w >= 0) & (w < w_end)
                                    acc = T.if_then_else(inside, _accumulate(spec, acc, v, at), acc)
                            elif d >= 0 and d < d_end and h >= 0 and h < h_end and w >= 0 and w < w_end:
                                v = T.Cast(at, X[plane, d, h, w])
                                acc = _accumulate(spec, acc, v, at)
                        Y[plane, od, oh, ow] = T.Cast(dt, view.result(acc, (d0, h0, w0), (d_end, h_end, w_end)))

    output_shape = (*input_shape[:2], *spec.spatial_out)
    return KernelSpec(
        main,
        (("input", (planes, D, H, W)), ("output", (planes, oD, oH, oW))),
        {"output": dtype},
        (("output", output_shape),),
        {"kernel": "window", "threads": block, "taps": view.taps, "predicated": predicated, "outputs": outputs},
    )
