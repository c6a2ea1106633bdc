"""TileLang kernels of the channel norms (BatchNorm, InstanceNorm, GroupNorm; forward, inference
and backward): one spec (:class:`ChannelNorm`), a few named kernels, a launch rule
(:func:`default_launch`).

Every one of these norms reduces x [N, C, HW] (HW: the spatial dims flattened) over units of
whole rows of its [N * C, HW] view: a channel over every n (batch norm), one row (instance norm),
the C / G consecutive rows of a group (group norm). The kernels:

- ``"sums"`` (:func:`sums_kernel`): a block per (row, chunk of the row), ``chunks`` chunks a row,
  streaming its chunk once (16-byte vectors) and writing two f32 partial sums to a workspace
  W[2, N * C, chunks]. Forward: sum(x - k) and sum((x - k)^2), k the unit's first element (a shift
  that keeps the one-pass variance from cancelling); backward: sum(dy) and sum(dy * (x - mean)).
  Within a block, each thread sums its own elements, then a pairwise tree in shared memory
  (:func:`block_reduce.tree_reducer`).
- ``"finish"`` (:func:`finish_kernel`, forward): one thread per unit sums the unit's partials in a
  fixed order (row by row, chunk by chunk), forms mean and 1/sqrt(var + eps), writes the saved
  statistics and updates the running ones (batch norm: per channel; instance norm: the mean over n
  of the per-instance statistics, a second loop over channels).
- ``"coefficients"`` (:func:`coefficients_kernel`, backward): per row, grad_x = a * dy + b * (x -
  mean) + c from its unit's sums; per channel, grad_weight and grad_bias summed over n in order.
- ``"apply"`` (:func:`apply_kernel`): the elementwise pass, a block per (row, tile of the row):
  y = (x - mean) * rstd * w + b (forward; inference takes mean and var from the running
  statistics and is this kernel alone), or grad_x from the coefficients (backward).

- ``"unit"`` (:func:`unit_kernel`): the whole norm in one launch where a unit fits a block's
  registers (at most UNIT_ELEMENTS elements): a block per unit loads it once, reduces it through
  the same tree, and writes the output (and the saved and running statistics, or batch norm's
  weight gradients) from its registers. On small tensors the chain's launch gaps (about 1.5-2 us
  each on the H100) cost more than its bytes: BatchNormFwd [8, 64, 32, 32] f16 took 6.1 us in three
  kernels against torch's 5.6. Where a sum crosses units, a small kernel follows: ``"running"``
  (instance norm's running statistics, the mean over n of each instance's) or backward_kernel's
  ``"columns"`` (instance and group norm's weight gradients, each row's share summed over n).

The launch rule (:func:`default_launch`) takes the "unit" kernel where it fits, the chain
otherwise; :func:`launch_variants` offers both (``npuops run --tune``). No float atomics anywhere:
every sum has one fixed order, the same bits run to run (the two paths sum in different orders,
so their results differ in the last bits). Tile-level form only, so each kernel also builds and
runs on TileLang's CPU target, where the tests check them. In the chain, the partial sums move 8
bytes per chunk, the statistics a few per row; x (and dy) are read twice, once by "sums" and once by
"apply" (from L2 where the tensor fits there), and the output written once. TileLang is imported
when a kernel is built.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from npuops import VECTOR_BYTES, interleaved_vectors, multiprocessors, thread_owned, tilelang_dtype

from .backward_kernel import bind, columns_kernel
from .block_reduce import tree_reducer

F32 = "float32"
SUM_THREADS = 256  # per block of "sums"
CHUNK = 16384  # elements of a row a "sums" block takes at most (longer rows are split)
APPLY_THREADS = 256
APPLY_VECTORS = 4  # 16-byte vectors a thread of "apply" takes
FINISH_THREADS = 256
# The "unit" kernel (a block per unit, the unit held in registers): units of at most UNIT_ELEMENTS
# elements, about UNIT_ELEMENTS_PER_THREAD a thread (32 to UNIT_MAX_THREADS threads; at the
# largest unit, 32 elements of x and 32 of dy a thread in the backward), and in a backward at most
# UNIT_SEGMENTS rows of a unit whose sums it keeps apart (group norm with a weight).
UNIT_ELEMENTS = 16384
UNIT_ELEMENTS_PER_THREAD = 16
UNIT_MAX_THREADS = 512
UNIT_SEGMENTS = 8


@dataclass(frozen=True)
class ChannelNorm:
    kind: str  # "batch", "instance" or "group"
    mode: str  # "train" (statistics of x), "eval" (batch norm's running statistics) or "backward"
    n: int
    c: int
    hw: int  # elements of a row: the spatial dims flattened
    dtype: torch.dtype  # x, y, grad_out, grad_x
    groups: int = 1  # group norm's
    affine: bool = False  # weight (and bias) given
    param_dtype: torch.dtype = torch.float32  # weight, bias and their gradients
    stat_dtype: torch.dtype = torch.float32  # the saved statistics (group norm's: x's or the weight's)
    running: bool = False  # running statistics updated (train) or read (eval)
    running_dtype: torch.dtype = torch.float32
    eps: float = 1e-5
    momentum: float = 0.1

    @property
    def rows(self) -> int:
        return self.n * self.c

    @property
    def rows_per_unit(self) -> int:
        """Consecutive rows of a unit (group norm: a group's channels); batch norm's unit is a channel
        over every n: rows c, C + c, ..."""
        return self.c // self.groups if self.kind == "group" else 1

    @property
    def units(self) -> int:
        return {"batch": self.c, "instance": self.rows, "group": self.n * self.groups}[self.kind]

    @property
    def unit_count(self) -> int:
        """Elements of a unit."""
        return self.hw * (self.n if self.kind == "batch" else self.rows_per_unit)


@dataclass(frozen=True)
class ChannelLaunch:
    chunks: int  # per row, of the "sums" kernel
    sum_threads: int = SUM_THREADS
    apply_threads: int = APPLY_THREADS
    kernel: str = "chain"  # "chain" (sums, finish or coefficients, apply) or "unit" (:func:`unit_kernel`)
    unit_threads: int = 0  # per block of the "unit" kernel

    def as_dict(self) -> dict:
        if self.kernel == "unit":
            return {"kernel": "unit", "unit_threads": self.unit_threads}
        return {"kernel": "chain", "chunks": self.chunks, "sum_threads": self.sum_threads,
                "apply_threads": self.apply_threads}


def vector_of(hw: int, itemsize: int) -> int:
    return next(v for v in (VECTOR_BYTES // itemsize, 4, 2, 1) if v <= VECTOR_BYTES // itemsize and hw % v == 0)


def unit_segments(spec: ChannelNorm) -> int:
    """Rows of a unit whose backward sums the "unit" kernel keeps apart: group norm's with a weight
    (each row its channel's weight, and its own share of grad_weight); one otherwise (a batch-norm
    unit is one channel, an instance-norm unit one row)."""
    return spec.rows_per_unit if spec.mode == "backward" and spec.affine else 1


UNIT_SHARED_BYTES = 48 * 1024  # a block's static shared memory


def unit_shared_bytes(spec: ChannelNorm, threads: int) -> int:
    """The "unit" kernel's tree of 2 sums a segment (:func:`unit_segments`), f32 a thread."""
    return 2 * unit_segments(spec) * threads * 4


def takes_unit_kernel(spec: ChannelNorm) -> bool:
    """Whether the "unit" kernel takes ``spec``: a training forward or a backward whose units fit a
    block's registers."""
    return spec.mode != "eval" and spec.unit_count <= UNIT_ELEMENTS and unit_segments(spec) <= UNIT_SEGMENTS


def unit_threads_for(spec: ChannelNorm) -> int:
    """About UNIT_ELEMENTS_PER_THREAD elements a thread, a power of two from 32 to UNIT_MAX_THREADS."""
    least = -(-spec.unit_count // UNIT_ELEMENTS_PER_THREAD)
    return min(UNIT_MAX_THREADS, max(32, 1 << (least - 1).bit_length()))


def default_launch(spec: ChannelNorm) -> ChannelLaunch:
    """Units that fit a block's registers (:func:`takes_unit_kernel`: every catalog workload but
    the large-spatial ones) take the "unit" kernel: one launch where the chain takes three, whose
    gaps (1.5-2 us each on the H100) cost small tensors more than their bytes do; it spreads over
    one block a unit, fewer than the chain's blocks (64 of batch norm's [8, 64, 32, 32]), each
    reading its unit once. Larger units take the chain: rows split into chunks of at most CHUNK
    elements, and further while the grid would not give every SM of the GPU two blocks (chunks of
    at least a block's worth of vectors)."""
    chunks = -(-spec.hw // CHUNK)
    least = SUM_THREADS * vector_of(spec.hw, spec.dtype.itemsize)
    while spec.rows * chunks < 2 * multiprocessors() and spec.hw // (chunks * 2) >= least:
        chunks *= 2
    if takes_unit_kernel(spec):
        return ChannelLaunch(chunks, kernel="unit", unit_threads=unit_threads_for(spec))
    return ChannelLaunch(chunks)


def launch_variants(spec: ChannelNorm) -> list[dict]:
    """The rule's launch first; the chain with its rule's chunks, other block sizes and half and
    twice the chunks; where the "unit" kernel takes the spec, it at half and twice its threads too
    (``npuops run --tune`` compares the one kernel with the chain)."""
    rule = default_launch(spec)
    chain = ChannelLaunch(rule.chunks)
    variants = [rule, chain, ChannelLaunch(rule.chunks, 128, 256), ChannelLaunch(rule.chunks, 512, 512)]
    if rule.chunks > 1:
        variants.append(ChannelLaunch(rule.chunks // 2))
    if spec.hw // (rule.chunks * 2) >= SUM_THREADS:
        variants.append(ChannelLaunch(rule.chunks * 2))
    if rule.kernel == "unit":
        variants += [ChannelLaunch(rule.chunks, kernel="unit", unit_threads=threads)
                     for threads in (rule.unit_threads // 2, rule.unit_threads * 2)
                     if 32 <= threads <= 1024 and unit_shared_bytes(spec, threads) <= UNIT_SHARED_BYTES]
    return [v.as_dict() for v in dict.fromkeys(variants)]


def unsupported(spec: ChannelNorm) -> str | None:
    if spec.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return f"the channel-norm kernels take bf16, f16 or f32 x, not {spec.dtype}"
    if spec.rows * spec.hw >= 2**31:
        return f"{spec.rows * spec.hw} elements need 64-bit indices, which the channel-norm kernels lack"
    if spec.running and spec.running_dtype != torch.float32:
        return f"the channel-norm kernels take f32 running statistics, not {spec.running_dtype}"
    if spec.mode == "train" and spec.running and spec.unit_count < 2:
        return "running statistics need the unbiased variance of at least 2 elements a unit"
    return None


def unit_of(spec: ChannelNorm, r):
    """The unit of row r (n * C + c)."""
    if spec.kind == "batch":
        return r % spec.c
    return r // spec.rows_per_unit


def unit_rows(spec: ChannelNorm, u, i):
    """The i-th row of unit u (i < rows of a unit: N for batch norm)."""
    if spec.kind == "batch":
        return i * spec.c + u
    return u * spec.rows_per_unit + i


def rows_in_unit(spec: ChannelNorm) -> int:
    return spec.n if spec.kind == "batch" else spec.rows_per_unit


def sums_kernel(spec: ChannelNorm, launch: ChannelLaunch):
    """``"sums"``: (X, [DY,] Center) -> W[2, rows, chunks]. Forward, Center is ignored and the shift
    is the unit's first element; backward, Center[u] (f32, a unit's saved mean) centers x."""
    import tilelang.language as T

    rows, hw, chunks, threads = spec.rows, spec.hw, launch.chunks, launch.sum_threads
    dt = tilelang_dtype(spec.dtype)
    vec = vector_of(hw, spec.dtype.itemsize)
    tile = threads * vec
    chunk = -(-(-(-hw // chunks)) // tile) * tile  # a multiple of the tile
    steps = chunk // tile
    backward = spec.mode == "backward"
    reduce = tree_reducer(threads, 2)
    layout = interleaved_vectors(1, tile, threads, vec)
    units = spec.units

    @T.macro
    def body(X, DY, Center, W):
        with T.Kernel(rows, chunks, threads=threads) as (r, p):
            xs = T.alloc_fragment((1, tile), F32)
            gs = T.alloc_fragment((1, tile), F32)
            first = T.alloc_fragment((threads,), F32)
            second = T.alloc_fragment((threads,), F32)
            T.annotate_layout({xs: layout, gs: layout, first: thread_owned((threads,), 0),
                               second: thread_owned((threads,), 0)})
            red = T.alloc_shared((1, 2, threads), F32, scope="shared")
            k = T.alloc_var(F32)
            u = unit_of(spec, r)
            k = Center[u] if backward else T.Cast(F32, X[unit_rows(spec, u, 0), 0])
            for t in T.Parallel(threads):
                first[t] = 0.0
                second[t] = 0.0
            for m in T.serial(steps):
                for i, j in T.Parallel(1, tile):
                    column = p * chunk + m * tile + j
                    xs[i, j] = T.if_then_else(column < hw, T.Cast(F32, X[r, T.min(column, hw - 1)]) - k, 0.0)
                    if backward:
                        gs[i, j] = T.if_then_else(column < hw, T.Cast(F32, DY[r, T.min(column, hw - 1)]), 0.0)
                for t in T.Parallel(threads):
                    for v in T.unroll(vec):
                        if backward:
                            first[t] += gs[0, t * vec + v]
                            second[t] += gs[0, t * vec + v] * xs[0, t * vec + v]
                        else:
                            first[t] += xs[0, t * vec + v]
                            second[t] += xs[0, t * vec + v] * xs[0, t * vec + v]
            for t in T.Parallel(threads):
                red[0, 0, t] = first[t]
                red[0, 1, t] = second[t]
            reduce(red, 0)
            for t in T.Parallel(threads):
                if t == 0:
                    W[0, r, p] = red[0, 0, 0]
                    W[1, r, p] = red[0, 1, 0]

    if backward:
        @T.prim_func
        def channel_backward_sums(X: T.Tensor((rows, hw), dt), DY: T.Tensor((rows, hw), dt),
                                  Center: T.Tensor((units,), F32), W: T.Tensor((2, rows, chunks), F32)):
            body(X, DY, Center, W)

        return channel_backward_sums

    @T.prim_func
    def channel_sums(X: T.Tensor((rows, hw), dt), W: T.Tensor((2, rows, chunks), F32)):
        body(X, X, X, W)

    return channel_sums


def finish_kernel(spec: ChannelNorm, launch: ChannelLaunch):
    """``"finish"`` (forward): W -> Stats[2, units] (f32 mean and rstd, for "apply"), the saved
    statistics Mean, Rstd [units] in their dtype, and the running statistics RM, RV [C] updated in
    place (where ``spec.running``)."""
    import tilelang.language as T

    rows, chunks, units, c = spec.rows, launch.chunks, spec.units, spec.c
    sdt, rdt = tilelang_dtype(spec.stat_dtype), F32  # running statistics: f32 (unsupported() says so)
    per_unit, count = rows_in_unit(spec), spec.unit_count
    threads = FINISH_THREADS
    eps, momentum = spec.eps, spec.momentum
    unbias = count / (count - 1) if count > 1 else 0.0
    n = spec.n

    @T.prim_func
    def channel_finish(X: T.Tensor((rows, spec.hw), tilelang_dtype(spec.dtype)), W: T.Tensor((2, rows, chunks), F32),
                       Stats: T.Tensor((2, units), F32), Mean: T.Tensor((units,), sdt), Rstd: T.Tensor((units,), sdt),
                       RM: T.Tensor((c,), rdt), RV: T.Tensor((c,), rdt)):
        with T.Kernel(T.ceildiv(units, threads), threads=threads) as b:
            s1, s2, mean, var, k = (T.alloc_var(F32) for _ in range(5))
            for t in T.Parallel(threads):
                u = T.min(b * threads + t, units - 1)
                s1 = 0.0
                s2 = 0.0
                for i in T.serial(per_unit):
                    for p in T.serial(chunks):
                        s1 += W[0, unit_rows(spec, u, i), p]
                        s2 += W[1, unit_rows(spec, u, i), p]
                k = T.Cast(F32, X[unit_rows(spec, u, 0), 0])
                mean = s1 / count
                var = T.max(s2 / count - mean * mean, 0.0)
                if b * threads + t < units:
                    Stats[0, u] = k + mean
                    Stats[1, u] = T.rsqrt(var + eps)
                    Mean[u] = T.Cast(sdt, k + mean)
                    Rstd[u] = T.Cast(sdt, T.rsqrt(var + eps))
                    if spec.running and spec.kind == "batch":
                        RM[u] = T.Cast(rdt, (1.0 - momentum) * T.Cast(F32, RM[u]) + momentum * (k + mean))
                        RV[u] = T.Cast(rdt, (1.0 - momentum) * T.Cast(F32, RV[u]) + momentum * var * unbias)
            if spec.running and spec.kind == "instance":
                # The mean over n of each channel's instance statistics, recomputed from W (other
                # threads' results are not visible without a barrier on global memory).
                for t in T.Parallel(threads):
                    if b == 0:
                        for cc in T.serial(T.ceildiv(c, threads)):
                            if cc * threads + t < c:
                                s1 = 0.0
                                s2 = 0.0
                                for i in T.serial(n):
                                    k = 0.0
                                    mean = 0.0
                                    for p in T.serial(chunks):
                                        k += W[0, i * c + cc * threads + t, p]
                                        mean += W[1, i * c + cc * threads + t, p]
                                    var = T.max(mean / count - (k / count) * (k / count), 0.0)
                                    s1 += k / count + T.Cast(F32, X[i * c + cc * threads + t, 0])
                                    s2 += var * unbias
                                RM[cc * threads + t] = T.Cast(rdt, (1.0 - momentum) * T.Cast(F32, RM[cc * threads + t])
                                                          + momentum * s1 / n)
                                RV[cc * threads + t] = T.Cast(rdt, (1.0 - momentum) * T.Cast(F32, RV[cc * threads + t])
                                                          + momentum * s2 / n)

    return channel_finish


def apply_kernel(spec: ChannelNorm, launch: ChannelLaunch):
    """``"apply"``. Forward: (X, Stats[2, units] f32, Wt, Bias) -> Y; eval: (X, RM, RV, Wt, Bias) ->
    Y; backward: (X, DY, Co[4, rows] f32) -> DX = a dy + b (x - center) + c."""
    import tilelang.language as T

    rows, hw, c, units = spec.rows, spec.hw, spec.c, spec.units
    dt, pdt = tilelang_dtype(spec.dtype), tilelang_dtype(spec.param_dtype)
    threads = launch.apply_threads
    vec = vector_of(hw, spec.dtype.itemsize)
    # A block per (row, tile of the row): every per-row quantity a scalar of the block (a flat
    # tile's per-element statistics gather miscompiled: TileLang vectorized it into a bad make_ulonglong4).
    tile = min(threads * vec * APPLY_VECTORS, -(-hw // vec) * vec)
    tiles = -(-hw // tile)
    eps = spec.eps
    affine = spec.affine

    def scale_shift(Wt, Bias, ch):
        return (T.Cast(F32, Wt[ch]) if affine else 1.0), (T.Cast(F32, Bias[ch]) if affine else 0.0)

    if spec.mode == "backward":
        @T.prim_func
        def channel_backward_apply(X: T.Tensor((rows, hw), dt), DY: T.Tensor((rows, hw), dt),
                                   Co: T.Tensor((4, rows), F32), DX: T.Tensor((rows, hw), dt)):
            with T.Kernel(tiles, rows, threads=threads) as (bt, r):
                a, b, k, center = (T.alloc_var(F32) for _ in range(4))
                a = Co[0, r]
                b = Co[1, r]
                k = Co[2, r]
                center = Co[3, r]
                for j in T.Parallel(tile):
                    if bt * tile + j < hw:
                        DX[r, bt * tile + j] = T.Cast(dt, a * T.Cast(F32, DY[r, bt * tile + j])
                                                      + b * (T.Cast(F32, X[r, bt * tile + j]) - center) + k)

        return channel_backward_apply

    if spec.mode == "eval":
        @T.prim_func
        def channel_eval_apply(X: T.Tensor((rows, hw), dt), RM: T.Tensor((c,), F32), RV: T.Tensor((c,), F32),
                               Wt: T.Tensor((c,), pdt), Bias: T.Tensor((c,), pdt), Y: T.Tensor((rows, hw), dt)):
            with T.Kernel(tiles, rows, threads=threads) as (bt, r):
                mean, scale, shift = (T.alloc_var(F32) for _ in range(3))
                w, bias = scale_shift(Wt, Bias, r % c)
                mean = RM[r % c]
                scale = T.rsqrt(RV[r % c] + eps) * w
                shift = bias
                for j in T.Parallel(tile):
                    if bt * tile + j < hw:
                        Y[r, bt * tile + j] = T.Cast(dt, (T.Cast(F32, X[r, bt * tile + j]) - mean) * scale + shift)

        return channel_eval_apply

    @T.prim_func
    def channel_apply(X: T.Tensor((rows, hw), dt), Stats: T.Tensor((2, units), F32), Wt: T.Tensor((c,), pdt),
                      Bias: T.Tensor((c,), pdt), Y: T.Tensor((rows, hw), dt)):
        with T.Kernel(tiles, rows, threads=threads) as (bt, r):
            mean, scale, shift = (T.alloc_var(F32) for _ in range(3))
            w, bias = scale_shift(Wt, Bias, r % c)
            mean = Stats[0, unit_of(spec, r)]
            scale = Stats[1, unit_of(spec, r)] * w
            shift = bias
            for j in T.Parallel(tile):
                if bt * tile + j < hw:
                    Y[r, bt * tile + j] = T.Cast(dt, (T.Cast(F32, X[r, bt * tile + j]) - mean) * scale + shift)

    return channel_apply


def coefficients_kernel(spec: ChannelNorm, launch: ChannelLaunch):
    """``"coefficients"`` (backward): (W, Mean, Rstd [units], Wt [C]) -> Co[4, rows] (a, b, c and
    the center of each row's grad_x = a dy + b (x - center) + c) and G[2, C] (grad_weight,
    grad_bias, in the weight's dtype; written where ``spec.affine``)."""
    import tilelang.language as T

    rows, chunks, units, c, n = spec.rows, launch.chunks, spec.units, spec.c, spec.n
    sdt, pdt = tilelang_dtype(spec.stat_dtype), tilelang_dtype(spec.param_dtype)
    per_unit, count = rows_in_unit(spec), float(spec.unit_count)
    threads = FINISH_THREADS
    affine = spec.affine

    def weight(Wt, ch):
        return T.Cast(F32, Wt[ch]) if affine else 1.0

    @T.prim_func
    def channel_coefficients(W: T.Tensor((2, rows, chunks), F32), Mean: T.Tensor((units,), sdt),
                             Rstd: T.Tensor((units,), sdt), Wt: T.Tensor((c,), pdt), Co: T.Tensor((4, rows), F32),
                             G: T.Tensor((2, c), pdt)):
        with T.Kernel(T.ceildiv(rows, threads), threads=threads) as b:
            s1, s2, rstd, sw, sb = (T.alloc_var(F32) for _ in range(5))
            for t in T.Parallel(threads):
                r = T.min(b * threads + t, rows - 1)
                u = unit_of(spec, r)
                # The unit's sums of w * dy and w * dy * (x - mean), rows and chunks in order.
                s1 = 0.0
                s2 = 0.0
                for i in T.serial(per_unit):
                    for p in T.serial(chunks):
                        s1 += W[0, unit_rows(spec, u, i), p] * weight(Wt, unit_rows(spec, u, i) % c)
                        s2 += W[1, unit_rows(spec, u, i), p] * weight(Wt, unit_rows(spec, u, i) % c)
                rstd = T.Cast(F32, Rstd[u])
                if b * threads + t < rows:
                    Co[0, r] = rstd * weight(Wt, r % c)
                    Co[1, r] = -rstd * rstd * rstd * s2 / count
                    Co[2, r] = -rstd * s1 / count
                    Co[3, r] = T.Cast(F32, Mean[u])
            if affine:
                for t in T.Parallel(threads):
                    if b * threads + t < c:
                        sw = 0.0
                        sb = 0.0
                        for i in T.serial(n):
                            s1 = 0.0
                            s2 = 0.0
                            for p in T.serial(chunks):
                                s1 += W[0, i * c + b * threads + t, p]
                                s2 += W[1, i * c + b * threads + t, p]
                            sw += s2 * T.Cast(F32, Rstd[unit_of(spec, i * c + b * threads + t)])
                            sb += s1
                        G[0, b * threads + t] = T.Cast(pdt, sw)
                        G[1, b * threads + t] = T.Cast(pdt, sb)

    return channel_coefficients


def unit_kernel(spec: ChannelNorm, launch: ChannelLaunch):
    """``"unit"``: a block per unit holds the unit in registers (its rows' 16-byte vectors
    interleaved over the threads, as "sums" lays out a chunk), reduces it once through
    :func:`block_reduce.tree_reducer` and writes its outputs from the registers: x (and dy) read
    once, one launch. Forward: (X, Wt, Bias) -> Y, Mean, Rstd [units] (saved statistics), RM, RV
    [C] updated in place (batch norm, where ``spec.running``: one block a channel) and Stats[2,
    units] (instance norm with running statistics: each instance's mean and unbiased variance, which
    "running" averages over n). The sums are shifted by the unit's first element as "sums" does.
    Backward: (X, DY, Mean, Rstd, Wt) -> DX and, where ``spec.affine``, G: batch norm's grad_weight
    and grad_bias [2, C] (in the weight's dtype), or each row's share of them [2, rows] (f32, summed
    over n by backward_kernel's "columns"). Every sum has one fixed order: the same bits run to run."""
    import tilelang.language as T

    rows, hw, c, units, count = spec.rows, spec.hw, spec.c, spec.units, spec.unit_count
    dt, pdt, sdt = (tilelang_dtype(d) for d in (spec.dtype, spec.param_dtype, spec.stat_dtype))
    threads = launch.unit_threads
    vec = vector_of(hw, spec.dtype.itemsize)
    padded = -(-count // (threads * vec)) * threads * vec
    steps = padded // (threads * vec)  # vectors a thread
    segments = unit_segments(spec)
    reduce = tree_reducer(threads, 2 * segments)
    layout = interleaved_vectors(1, padded, threads, vec)
    eps, momentum, affine = spec.eps, spec.momentum, spec.affine
    unbias = count / (count - 1) if count > 1 else 0.0
    grads_shape, grads_dtype = ((2, c), pdt) if spec.kind == "batch" else ((2, rows), F32)

    def at(u, j):
        """Where element j of unit u is: row j // hw of the unit (hw a multiple of the vector, so a
        vector stays in one row)."""
        return unit_rows(spec, u, j // hw), j % hw

    def element(Buf, u, j):
        """Element j of unit u; past the unit, its last element."""
        return Buf[at(u, T.min(j, count - 1))]

    def channel(u, j):
        return unit_rows(spec, u, T.min(j, count - 1) // hw) % c

    def param(P, ch, default):
        return T.Cast(F32, P[ch]) if affine else default

    def own(t, m, v):
        """Thread t's v-th element of its m-th vector (:func:`npuops.interleaved_vectors`)."""
        return (m * threads + t) * vec + v

    def in_segment(s, j, value):
        """value where element j is in row s of the unit, else 0 (one segment: every element)."""
        return value if segments == 1 else T.if_then_else(j // hw == s, value, 0.0)

    def grads_column(u, s):
        """Where segment s's gradients go: batch norm's channel, or the row's share."""
        return u if spec.kind == "batch" else unit_rows(spec, u, s)

    def layouts(*fragments, owned=()):
        T.annotate_layout({**{f: layout for f in fragments},
                           **{f: thread_owned(tuple(f.shape), 0) for f in owned}})

    if spec.mode == "backward":
        @T.prim_func
        def channel_backward_unit(X: T.Tensor((rows, hw), dt), DY: T.Tensor((rows, hw), dt),
                                  Mean: T.Tensor((units,), sdt), Rstd: T.Tensor((units,), sdt),
                                  Wt: T.Tensor((c,), pdt), DX: T.Tensor((rows, hw), dt),
                                  G: T.Tensor(grads_shape, grads_dtype)):
            with T.Kernel(units, threads=threads) as u:
                xs = T.alloc_fragment((1, padded), F32)  # x - mean
                gs = T.alloc_fragment((1, padded), F32)
                # Per thread and segment: sum(dy), sum(dy (x - mean)) (a buffer each: TileLang takes one
                # index form per buffer and loop).
                first = T.alloc_fragment((threads, segments), F32)
                second = T.alloc_fragment((threads, segments), F32)
                layouts(xs, gs, owned=(first, second))
                red = T.alloc_shared((1, 2 * segments, threads), F32, scope="shared")
                center, rstd, s1, s2, b, k = (T.alloc_var(F32) for _ in range(6))
                center = T.Cast(F32, Mean[u])
                rstd = T.Cast(F32, Rstd[u])
                for i, j in T.Parallel(1, padded):
                    xs[i, j] = T.if_then_else(j < count, T.Cast(F32, element(X, u, j)) - center, 0.0)
                    gs[i, j] = T.if_then_else(j < count, T.Cast(F32, element(DY, u, j)), 0.0)
                for t in T.Parallel(threads):
                    for s in T.unroll(segments):
                        first[t, s] = 0.0
                        second[t, s] = 0.0
                        for m in T.unroll(steps):
                            for v in T.unroll(vec):
                                first[t, s] += in_segment(s, own(t, m, v), gs[0, own(t, m, v)])
                                second[t, s] += in_segment(s, own(t, m, v), gs[0, own(t, m, v)] * xs[0, own(t, m, v)])
                        red[0, 2 * s, t] = first[t, s]
                        red[0, 2 * s + 1, t] = second[t, s]
                reduce(red, 0)
                # The unit's sums of w dy and w dy (x - mean), segments in order (coefficients' a, b, c).
                s1 = 0.0
                s2 = 0.0
                for s in T.serial(segments):
                    s1 += red[0, 2 * s, 0] * param(Wt, unit_rows(spec, u, s) % c, 1.0)
                    s2 += red[0, 2 * s + 1, 0] * param(Wt, unit_rows(spec, u, s) % c, 1.0)
                b = -rstd * rstd * rstd * s2 / count
                k = -rstd * s1 / count
                for i, j in T.Parallel(1, padded):
                    if j < count:
                        DX[at(u, j)] = T.Cast(
                            dt, rstd * param(Wt, channel(u, j), 1.0) * gs[i, j] + b * xs[i, j] + k)
                if affine:
                    for t in T.Parallel(threads):
                        if t < segments:  # a batch-norm unit's sums are its channel's gradients
                            G[0, grads_column(u, t)] = T.Cast(grads_dtype, rstd * red[0, 2 * t + 1, 0])
                            G[1, grads_column(u, t)] = T.Cast(grads_dtype, red[0, 2 * t, 0])

        return channel_backward_unit

    instance_running = spec.running and spec.kind == "instance"

    @T.prim_func
    def channel_unit(X: T.Tensor((rows, hw), dt), Wt: T.Tensor((c,), pdt), Bias: T.Tensor((c,), pdt),
                     Y: T.Tensor((rows, hw), dt), Mean: T.Tensor((units,), sdt), Rstd: T.Tensor((units,), sdt),
                     RM: T.Tensor((c,), F32), RV: T.Tensor((c,), F32), Stats: T.Tensor((2, units), F32)):
        with T.Kernel(units, threads=threads) as u:
            xs = T.alloc_fragment((1, padded), F32)  # x - k
            first = T.alloc_fragment((threads,), F32)
            second = T.alloc_fragment((threads,), F32)
            layouts(xs, owned=(first, second))
            red = T.alloc_shared((1, 2, threads), F32, scope="shared")
            k, mean, var, rstd = (T.alloc_var(F32) for _ in range(4))
            k = T.Cast(F32, element(X, u, 0))
            for i, j in T.Parallel(1, padded):
                xs[i, j] = T.if_then_else(j < count, T.Cast(F32, element(X, u, j)) - k, 0.0)
            for t in T.Parallel(threads):
                first[t] = 0.0
                second[t] = 0.0
                for m in T.unroll(steps):
                    for v in T.unroll(vec):
                        first[t] += xs[0, own(t, m, v)]
                        second[t] += xs[0, own(t, m, v)] * xs[0, own(t, m, v)]
                red[0, 0, t] = first[t]
                red[0, 1, t] = second[t]
            reduce(red, 0)
            mean = red[0, 0, 0] / count  # of x - k
            var = T.max(red[0, 1, 0] / count - mean * mean, 0.0)
            rstd = T.rsqrt(var + eps)
            for i, j in T.Parallel(1, padded):
                if j < count:
                    Y[at(u, j)] = T.Cast(
                        dt, (xs[i, j] - mean) * rstd * param(Wt, channel(u, j), 1.0) + param(Bias, channel(u, j), 0.0))
            for t in T.Parallel(threads):
                if t == 0:
                    Mean[u] = T.Cast(sdt, k + mean)
                    Rstd[u] = T.Cast(sdt, rstd)
                    if spec.running and spec.kind == "batch":
                        RM[u] = (1.0 - momentum) * RM[u] + momentum * (k + mean)
                        RV[u] = (1.0 - momentum) * RV[u] + momentum * var * unbias
                    if instance_running:
                        Stats[0, u] = k + mean
                        Stats[1, u] = var * unbias

    return channel_unit


def running_kernel(spec: ChannelNorm):
    """``"running"`` (instance norm's forward by the "unit" kernel, with running statistics):
    Stats[2, rows] (each instance's mean and unbiased variance) -> RM, RV [C] updated in place with
    their means over n, n in order."""
    import tilelang.language as T

    rows, c, n, momentum, threads = spec.rows, spec.c, spec.n, spec.momentum, FINISH_THREADS

    @T.prim_func
    def channel_running(Stats: T.Tensor((2, rows), F32), RM: T.Tensor((c,), F32), RV: T.Tensor((c,), F32)):
        with T.Kernel(T.ceildiv(c, threads), threads=threads) as b:
            s1, s2 = T.alloc_var(F32), T.alloc_var(F32)
            for t in T.Parallel(threads):
                s1 = 0.0
                s2 = 0.0
                for i in T.serial(n):
                    s1 += Stats[0, i * c + T.min(b * threads + t, c - 1)]
                    s2 += Stats[1, i * c + T.min(b * threads + t, c - 1)]
                if b * threads + t < c:
                    RM[b * threads + t] = (1.0 - momentum) * RM[b * threads + t] + momentum * s1 / n
                    RV[b * threads + t] = (1.0 - momentum) * RV[b * threads + t] + momentum * s2 / n

    return channel_running


def build_channel_norm(spec: ChannelNorm, device: torch.device, kernel: str | None = None, chunks: int | None = None,
                       sum_threads: int = SUM_THREADS, apply_threads: int = APPLY_THREADS,
                       unit_threads: int | None = None, target=None) -> Callable[..., object]:
    """The op's callable (its inputs by name, its outputs in its order), composing the kernels:
    ``kernel`` "unit" (:func:`build_unit_path`) or "chain" (by default the rule's choice)."""
    rule = default_launch(spec)
    launch = ChannelLaunch(chunks or rule.chunks, sum_threads, apply_threads, kernel or rule.kernel,
                           unit_threads or rule.unit_threads or unit_threads_for(spec))
    if launch.kernel == "unit":
        return build_unit_path(spec, launch, torch.device(device), target)
    rows, hw, c, units = spec.rows, spec.hw, spec.c, spec.units
    device = torch.device(device)
    f32 = dict(dtype=torch.float32, device=device)
    params = dict(dtype=spec.param_dtype, device=device)
    # Stand-ins for the optional tensors a kernel's signature always has (never read without their flag).
    spare_param, spare_f32 = torch.zeros(c, **params), torch.zeros(c, **f32)
    config = launch.as_dict()

    if spec.mode == "eval":
        apply = bind(apply_kernel(spec, launch), [(rows, hw), (c,), (c,), (c,), (c,), (rows, hw)], device, target)

        def batch_norm_eval(x, weight, bias, running_mean, running_var):
            y = torch.empty_like(x)
            apply(x, running_mean, running_var, weight, bias, y)
            return y

        batch_norm_eval.config = {"kernels": 1, "kernel": "apply", "apply_threads": launch.apply_threads}
        return batch_norm_eval

    sums_shapes = [(rows, hw), (2, rows, launch.chunks)]
    if spec.mode == "backward":
        sums = bind(sums_kernel(spec, launch), [(rows, hw), (rows, hw), (units,), (2, rows, launch.chunks)], device,
                    target)
        coefficients = bind(coefficients_kernel(spec, launch), [(2, rows, launch.chunks), (units,), (units,), (c,),
                                                                (4, rows), (2, c)], device, target)
        apply = bind(apply_kernel(spec, launch), [(rows, hw), (rows, hw), (4, rows), (rows, hw)], device, target)

        def backward(grad_out, x, mean, rstd, weight=None):
            partials, co = torch.empty((2, rows, launch.chunks), **f32), torch.empty((4, rows), **f32)
            grads = torch.empty((2, c), **params)
            center = mean if mean.dtype == torch.float32 else mean.float()
            sums(x, grad_out, center, partials)
            coefficients(partials, mean, rstd, spare_param if weight is None else weight, co, grads)
            grad_x = torch.empty_like(x)
            apply(x, grad_out, co, grad_x)
            return (grad_x, grads[0], grads[1]) if spec.affine else grad_x

        backward.config = {"kernels": 3, **config}
        return backward

    sums = bind(sums_kernel(spec, launch), sums_shapes, device, target)
    finish = bind(finish_kernel(spec, launch), [(rows, hw), (2, rows, launch.chunks), (2, units), (units,), (units,),
                                                (c,), (c,)], device, target)
    apply = bind(apply_kernel(spec, launch), [(rows, hw), (2, units), (c,), (c,), (rows, hw)], device, target)

    def forward(x, weight=None, bias=None, running_mean=None, running_var=None):
        partials, stats = torch.empty((2, rows, launch.chunks), **f32), torch.empty((2, units), **f32)
        mean, rstd = (torch.empty(units, dtype=spec.stat_dtype, device=x.device) for _ in range(2))
        sums(x, partials)
        finish(x, partials, stats, mean, rstd, running_mean if spec.running else spare_f32,
               running_var if spec.running else spare_f32)
        y = torch.empty_like(x)
        apply(x, stats, spare_param if weight is None else weight, spare_param if bias is None else bias, y)
        return y, mean, rstd

    forward.config = {"kernels": 3, **config}
    return forward


def build_unit_path(spec: ChannelNorm, launch: ChannelLaunch, device: torch.device, target=None):
    """The "unit" kernel's callable (see :func:`build_channel_norm`), and the small kernel after it
    where a sum crosses units: instance norm's running statistics ("running") and instance and
    group norm's weight gradients (backward_kernel's "columns", summing each row's share over n)."""
    rows, hw, c, units, n = spec.rows, spec.hw, spec.c, spec.units, spec.n
    f32 = dict(dtype=torch.float32, device=device)
    spare_param, spare_f32 = torch.zeros(c, dtype=spec.param_dtype, device=device), torch.zeros(c, **f32)
    unit = unit_kernel(spec, launch)
    config = {"kernel": "unit", "unit_threads": launch.unit_threads}

    if spec.mode == "backward":
        per_row = spec.affine and spec.kind != "batch"  # each row's share of the weight gradients
        grads_shape = (2, rows) if spec.kind != "batch" else (2, c)
        run_unit = bind(unit, [(rows, hw), (rows, hw), (units,), (units,), (c,), (rows, hw), grads_shape], device,
                        target)
        columns = bind(columns_kernel(2, n, c, spec.param_dtype), [(2, n, c), (2, c)], device, target) \
            if per_row else None
        spare_grads = torch.zeros(grads_shape, dtype=spec.param_dtype if spec.kind == "batch" else torch.float32,
                                  device=device)

        def backward(grad_out, x, mean, rstd, weight=None):
            grad_x = torch.empty_like(x)
            if per_row:
                shares, grads = torch.empty((2, rows), **f32), torch.empty((2, c), dtype=spec.param_dtype,
                                                                            device=x.device)
                run_unit(x, grad_out, mean, rstd, weight, grad_x, shares)
                columns(shares, grads)
            else:
                grads = torch.empty((2, c), dtype=spec.param_dtype, device=x.device) if spec.affine else spare_grads
                run_unit(x, grad_out, mean, rstd, spare_param if weight is None else weight, grad_x, grads)
            return (grad_x, grads[0], grads[1]) if spec.affine else grad_x

        backward.config = {"kernels": 2 if per_row else 1, **config}
        return backward

    instance_running = spec.running and spec.kind == "instance"
    run_unit = bind(unit, [(rows, hw), (c,), (c,), (rows, hw), (units,), (units,), (c,), (c,), (2, units)], device,
                    target)
    running = bind(running_kernel(spec), [(2, rows), (c,), (c,)], device, target) if instance_running else None
    spare_stats = torch.zeros((2, units), **f32)

    def forward(x, weight=None, bias=None, running_mean=None, running_var=None):
        y = torch.empty_like(x)
        mean, rstd = (torch.empty(units, dtype=spec.stat_dtype, device=x.device) for _ in range(2))
        stats = torch.empty((2, units), **f32) if instance_running else spare_stats
        batch_running = spec.running and spec.kind == "batch"
        run_unit(x, spare_param if weight is None else weight, spare_param if bias is None else bias, y, mean, rstd,
                 running_mean if batch_running else spare_f32, running_var if batch_running else spare_f32, stats)
        if instance_running:
            running(stats, running_mean, running_var)
        return y, mean, rstd

    forward.config = {"kernels": 2 if instance_running else 1, **config}
    return forward
