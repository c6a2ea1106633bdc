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

No float atomics anywhere: every sum has one fixed order, the same bits run to run. Tile-level form
only, so each kernel also builds and runs on TileLang's CPU target, where the tests check them.
The partial sums move 8 bytes per chunk, the statistics a few per row; x (and dy) are read twice,
once by "sums" and once by "apply" (from L2 where the tensor fits there), and the output written
once. TileLang is imported when a kernel is built.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from npuops import H200_SMS, VECTOR_BYTES, interleaved_vectors, thread_owned, tilelang_dtype

from .backward_kernel import bind
from .block_reduce import tree_reducer

F32 = "float32"
SUM_THREADS = 256  # per block of "sums"
CHUNK = 16384  # elements of a row a "sums" block takes at most (longer rows are split)
APPLY_THREADS = 256
APPLY_VECTORS = 4  # 16-byte vectors a thread of "apply" takes
FINISH_THREADS = 256


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


def vector_of(hw: int, itemsize: int) -> int:
    return next(v for v in (VECTOR_BYTES // itemsize, 4, 2, 1) if v <= VECTOR_BYTES // itemsize and hw % v == 0)


def default_launch(spec: ChannelNorm) -> ChannelLaunch:
    """Rows split into chunks of at most CHUNK elements, and further while the grid would not give
    every SM of an H200 two blocks (chunks of at least a block's worth of vectors)."""
    chunks = -(-spec.hw // CHUNK)
    least = SUM_THREADS * vector_of(spec.hw, spec.dtype.itemsize)
    while spec.rows * chunks < 2 * H200_SMS and spec.hw // (chunks * 2) >= least:
        chunks *= 2
    return ChannelLaunch(chunks)


def launch_variants(spec: ChannelNorm) -> list[dict[str, int]]:
    rule = default_launch(spec)
    variants = [rule, ChannelLaunch(rule.chunks, 128, 256), ChannelLaunch(rule.chunks, 512, 512)]
    if rule.chunks > 1:
        variants.append(ChannelLaunch(rule.chunks // 2))
    if spec.hw // (rule.chunks * 2) >= SUM_THREADS:
        variants.append(ChannelLaunch(rule.chunks * 2))
    return [{"chunks": v.chunks, "sum_threads": v.sum_threads, "apply_threads": v.apply_threads}
            for v in dict.fromkeys(variants)]


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


def build_channel_norm(spec: ChannelNorm, device: torch.device, chunks: int | None = None,
                       sum_threads: int = SUM_THREADS, apply_threads: int = APPLY_THREADS,
                       target=None) -> Callable[..., object]:
    """The op's callable (its inputs by name, its outputs in its order), composing the kernels."""
    launch = ChannelLaunch(chunks or default_launch(spec).chunks, sum_threads, apply_threads)
    rows, hw, c, units = spec.rows, spec.hw, spec.c, spec.units
    device = torch.device(device)
    f32 = dict(dtype=torch.float32, device=device)
    params = dict(dtype=spec.param_dtype, device=device)
    # Stand-ins for the optional tensors a kernel's signature always has (never read without their flag).
    spare_param, spare_f32 = torch.zeros(c, **params), torch.zeros(c, **f32)
    config = {"chunks": launch.chunks, "sum_threads": launch.sum_threads, "apply_threads": launch.apply_threads}

    if spec.mode == "eval":
        apply = bind(apply_kernel(spec, launch), [(rows, hw), (c,), (c,), (c,), (c,), (rows, hw)], device, target)

        def batch_norm_eval(x, weight, bias, running_mean, running_var):
            y = torch.empty_like(x)
            apply(x, running_mean, running_var, weight, bias, y)
            return y

        batch_norm_eval.config = {"kernels": 1, "apply_threads": launch.apply_threads}
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
