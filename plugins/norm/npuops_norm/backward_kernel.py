"""TileLang kernels of the row-wise norms' backward ops (RMSNormBwd, LayerNormBwd): one spec
(:class:`RowBackward`), two named kernels, a launch rule (:func:`default_launch`).

``"rows"`` (:func:`rows_kernel`): grad_x in one pass per row, and the weight (and bias) gradient's
per-block partial column sums. A block takes ``rows_per_block`` consecutive rows, one after the
other; each thread holds the same columns of every row (whole 16-byte vectors, interleaved over the
block as :func:`npuops.kernels.interleaved_vectors` lays them out), so it accumulates the
gradient's column sums of its columns in registers across the block's rows. Per row: grad_out, x
loaded once, x_hat from the saved statistics (mean and rstd, or rstd), the row sums of
g * x_hat (and g, g = grad_out * weight) through one tree reduction in shared memory
(:func:`block_reduce.tree_reducer`), then grad_x written. At the end the block writes its column
sums, in f32, to a workspace row of its own ([blocks, hidden]).

``"columns"`` (:func:`columns_kernel`): each thread sums one column of the workspace over the
blocks in a fixed order (block 0 first) and writes the gradient in the weight's dtype. No float
atomics anywhere: the same inputs give the same bits run to run. A single block (one row:
decode) writes the gradients itself, in their dtype, and the second kernel is not launched.

Tile-level form only (the tree reduction has no warp shuffles), so the kernels also build and run
on TileLang's CPU target, where the tests check them. TileLang is imported when a kernel is built.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from npuops import (VECTOR_BYTES, compile_kernel, in_order, interleaved_vectors, launcher, multiprocessors,
                    thread_owned, tilelang_dtype)

from .block_reduce import tree_reducer

F32 = "float32"
MAX_THREADS = 1024
ELEMENTS_PER_THREAD = 16  # of a row, per thread (a guess: never timed on the GPU)
COLUMN_THREADS = 64  # threads (columns) per block of the "columns" kernel
REGISTER_ROW = 8192  # the widest row whose five f32 arrays a block keeps in registers (at 512
# threads: 80 elements in 124 registers a thread; 1024 threads leave 64 registers a thread)


@dataclass(frozen=True)
class RowBackward:
    stat: str  # "rms" (grad of x * rstd * w) or "meanvar" ((x - mean) * rstd * w + b)
    rows: int
    hidden: int  # the normalized dims' elements
    dtype: torch.dtype  # grad_out, x, weight, grad_x and the weight's (and bias') gradients


@dataclass(frozen=True)
class RowBackwardLaunch:
    threads: int  # per block of the "rows" kernel: a power of two
    blocks: int  # of the "rows" kernel, each taking ceil(rows / blocks) consecutive rows


def vector_of(hidden: int, itemsize: int) -> int:
    """Elements a thread loads at once: a 16-byte vector where the row's width allows."""
    return next(v for v in (VECTOR_BYTES // itemsize, 4, 2, 1) if v <= VECTOR_BYTES // itemsize and hidden % v == 0)


def default_launch(spec: RowBackward) -> RowBackwardLaunch:
    """About ELEMENTS_PER_THREAD elements a thread (a power of two from 32 to 1024 threads) and one
    block per SM of the GPU at most, each taking an equal share of the rows (fewer partial rows to
    sum than rows: the workspace moves blocks x hidden x 4 bytes twice)."""
    threads = 1 << max(5, min(10, (spec.hidden // ELEMENTS_PER_THREAD).bit_length() - 1))
    per_block = -(-spec.rows // min(spec.rows, multiprocessors()))
    return RowBackwardLaunch(threads, -(-spec.rows // per_block))


def launch_variants(spec: RowBackward) -> list[dict[str, int]]:
    """The rule's launch first, then half and twice its threads and blocks (``npuops run --tune``)."""
    rule = default_launch(spec)
    variants = [rule]
    for threads in (rule.threads // 2, rule.threads * 2):
        if 32 <= threads <= MAX_THREADS:
            variants.append(RowBackwardLaunch(threads, rule.blocks))
    for blocks in (rule.blocks // 2, rule.blocks * 2):
        if 1 <= blocks <= spec.rows:
            per_block = -(-spec.rows // blocks)
            variants.append(RowBackwardLaunch(rule.threads, -(-spec.rows // per_block)))
    unique = list(dict.fromkeys(variants))
    return [{"threads": v.threads, "blocks": v.blocks} for v in unique]


def unsupported(spec: RowBackward) -> str | None:
    if spec.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return f"the backward row kernel takes bf16, f16 or f32 rows, not {spec.dtype}"
    if spec.rows * spec.hidden >= 2**31:
        return f"{spec.rows} x {spec.hidden} elements need 64-bit indices, which the backward row kernel lacks"
    if spec.hidden > 64 * MAX_THREADS:
        return f"rows of {spec.hidden} elements do not fit the registers of one block (at most {64 * MAX_THREADS})"
    return None


def rows_kernel(spec: RowBackward, launch: RowBackwardLaunch, registers_only: bool = False):
    """The ``"rows"`` kernel: (grad_out, x, weight, [mean,] rstd) -> grad_x and the column-sum
    partials P[slots, blocks, hidden] (slot 0: grad_out * x_hat, slot 1: grad_out), f32, or in
    the gradients' dtype with one block."""
    import tilelang.language as T

    rows, hidden, threads, blocks = spec.rows, spec.hidden, launch.threads, launch.blocks
    dt = tilelang_dtype(spec.dtype)
    vec = vector_of(hidden, spec.dtype.itemsize)
    steps = -(-hidden // (threads * vec))  # vectors per thread
    padded = steps * threads * vec
    per_block = -(-rows // blocks)
    meanvar = spec.stat == "meanvar"
    slots = 2 if meanvar else 1
    pdt = dt if blocks == 1 else F32
    inv_hidden = 1.0 / hidden
    reduce = tree_reducer(threads, slots)
    row_layout = interleaved_vectors(1, padded, threads, vec)

    def mean_g(red, at):
        """The row's mean of g = grad_out * weight (LayerNorm's; RMSNorm's gradient has no such term)."""
        return red[at, 1, 0] * inv_hidden if meanvar else 0.0

    # The weight and the column sums stay a whole block's rows: in registers up to REGISTER_ROW,
    # else in shared memory (16384-wide rows at 1024 threads spilled, 64 registers a thread, and
    # ran at half torch's speed on the H100). ``registers_only``: the CPU target, which takes one
    # dynamic shared buffer a kernel, keeps them as fragments (the same logic).
    kept = T.alloc_fragment if registers_only or padded <= REGISTER_ROW else T.alloc_shared

    @T.macro
    def body(DY, X, Wt, Mean, Rstd, DX, P):
        with T.Kernel(blocks, threads=threads) as b:
            w = kept((1, padded), F32)
            dy = T.alloc_fragment((1, padded), F32)
            xhat = T.alloc_fragment((1, padded), F32)
            acc_w = kept((1, padded), F32)
            acc_b = kept((1, padded), F32)
            part_w = T.alloc_fragment((threads,), F32)  # a thread's sum of g * x_hat
            part_b = T.alloc_fragment((threads,), F32)  # and of g (LayerNorm's)
            layouts = {dy: row_layout, xhat: row_layout, part_w: thread_owned((threads,), 0),
                       part_b: thread_owned((threads,), 0)}
            if kept is T.alloc_fragment:
                layouts.update({w: row_layout, acc_w: row_layout, acc_b: row_layout})
            T.annotate_layout(layouts)
            red = T.alloc_shared((2, slots, threads), F32, scope="shared")
            mu, rs = T.alloc_var(F32), T.alloc_var(F32)
            for i, j in T.Parallel(1, padded):
                w[i, j] = T.if_then_else(j < hidden, T.Cast(F32, Wt[T.min(j, hidden - 1)]), 0.0)
                acc_w[i, j] = 0.0
                acc_b[i, j] = 0.0
            for k in T.serial(per_block):
                r = T.min(b * per_block + k, rows - 1)  # past the last row: recomputes it, stores nothing
                rs = Rstd[r]
                mu = Mean[r] if meanvar else 0.0
                for i, j in T.Parallel(1, padded):
                    dy[i, j] = T.if_then_else(j < hidden, T.Cast(F32, DY[r, T.min(j, hidden - 1)]), 0.0)
                    xhat[i, j] = T.if_then_else(j < hidden, (T.Cast(F32, X[r, T.min(j, hidden - 1)]) - mu) * rs, 0.0)
                for t in T.Parallel(threads):
                    part_w[t] = 0.0
                    part_b[t] = 0.0
                    for m in T.unroll(steps):
                        for v in T.unroll(vec):
                            part_w[t] += dy[0, (m * threads + t) * vec + v] * w[0, (m * threads + t) * vec + v] \
                                * xhat[0, (m * threads + t) * vec + v]
                            part_b[t] += dy[0, (m * threads + t) * vec + v] * w[0, (m * threads + t) * vec + v]
                    red[k % 2, 0, t] = part_w[t]
                    red[k % 2, slots - 1, t] = part_w[t] if slots == 1 else part_b[t]
                reduce(red, k % 2)
                for i, j in T.Parallel(1, padded):
                    if b * per_block + k < rows:
                        if j < hidden:
                            DX[r, j] = T.Cast(dt, rs * (dy[i, j] * w[i, j] - mean_g(red, k % 2)
                                                        - xhat[i, j] * red[k % 2, 0, 0] * inv_hidden))
                        acc_w[i, j] += dy[i, j] * xhat[i, j]
                        acc_b[i, j] += dy[i, j]
            for i, j in T.Parallel(1, padded):
                if j < hidden:
                    P[0, b, j] = T.Cast(pdt, acc_w[i, j])
                    P[slots - 1, b, j] = T.Cast(pdt, acc_w[i, j] if slots == 1 else acc_b[i, j])

    if meanvar:
        @T.prim_func
        def layer_norm_backward_rows(DY: T.Tensor((rows, hidden), dt), X: T.Tensor((rows, hidden), dt),
                                     Wt: T.Tensor((hidden,), dt), Mean: T.Tensor((rows,), F32),
                                     Rstd: T.Tensor((rows,), F32), DX: T.Tensor((rows, hidden), dt),
                                     P: T.Tensor((slots, blocks, hidden), pdt)):
            body(DY, X, Wt, Mean, Rstd, DX, P)

        return layer_norm_backward_rows

    @T.prim_func
    def rms_norm_backward_rows(DY: T.Tensor((rows, hidden), dt), X: T.Tensor((rows, hidden), dt),
                               Wt: T.Tensor((hidden,), dt), Rstd: T.Tensor((rows,), F32),
                               DX: T.Tensor((rows, hidden), dt), P: T.Tensor((slots, blocks, hidden), pdt)):
        body(DY, X, Wt, Rstd, Rstd, DX, P)

    return rms_norm_backward_rows


def columns_kernel(slots: int, blocks: int, hidden: int, dtype: torch.dtype, threads: int = COLUMN_THREADS):
    """The ``"columns"`` kernel: G[s, j] = sum over b of P[s, b, j], b in order, in ``dtype``."""
    import tilelang.language as T

    dt = tilelang_dtype(dtype)

    @T.prim_func
    def column_sums(P: T.Tensor((slots, blocks, hidden), F32), G: T.Tensor((slots, hidden), dt)):
        with T.Kernel(T.ceildiv(hidden, threads), slots, threads=threads) as (bx, s):
            acc = T.alloc_fragment((threads,), F32)
            for t in T.Parallel(threads):
                acc[t] = 0.0
                for p in in_order(blocks):
                    acc[t] += P[s, p, T.min(bx * threads + t, hidden - 1)]
                if bx * threads + t < hidden:
                    G[s, bx * threads + t] = T.Cast(dt, acc[t])

    return column_sums


def on_host(target) -> bool:
    """Whether ``target`` (None: the GPU's) builds for the host: TileLang's CPU target."""
    return target is not None and target.get("kind") != "cuda"


def bind(prim_func, shapes: Sequence[Sequence[int]], device: torch.device, target=None) -> Callable[..., None]:
    """``run(*tensors)``: ``prim_func`` compiled (for ``target``, by default the GPU's) and launched
    on tensors of as many elements as ``shapes`` (viewed to them on the CPU target)."""
    # TileLang's C code for the CPU target mis-declares vectors of indices (int32_t2 without .s0):
    # built scalar there, which the logic the CPU checks does not depend on.
    host = on_host(target)
    kernel = compile_kernel(prim_func, target=target, pass_configs={"tirx.disable_vectorize": True} if host else None)
    launch = launcher(kernel, torch.device(device), [tuple(s) for s in shapes])
    sizes = launch.sizes({})

    def run(*tensors: torch.Tensor) -> None:
        launch.run(tensors, sizes)

    return run


def build_row_backward(spec: RowBackward, weight_shape: Sequence[int], device: torch.device,
                       threads: int | None = None, blocks: int | None = None, target=None) -> Callable[..., tuple]:
    """fn(grad_out, x, weight, [bias, mean,] rstd) -> (grad_x, grad_weight[, grad_bias]): the two
    kernels composed (one where a single block takes every row)."""
    rule = default_launch(spec)
    launch = RowBackwardLaunch(threads or rule.threads, blocks or rule.blocks)
    rows, hidden = spec.rows, spec.hidden
    meanvar, slots = spec.stat == "meanvar", 2 if spec.stat == "meanvar" else 1
    stats = [(rows,)] * (2 if meanvar else 1)
    main = bind(rows_kernel(spec, launch, registers_only=on_host(target)),
                [(rows, hidden), (rows, hidden), (hidden,), *stats, (rows, hidden), (slots, launch.blocks, hidden)],
                device, target)
    direct = launch.blocks == 1
    sums = None if direct else bind(columns_kernel(slots, launch.blocks, hidden, spec.dtype),
                                    [(slots, launch.blocks, hidden), (slots, hidden)], device, target)
    weight_shape = tuple(weight_shape)

    def gradients(partials: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if direct:
            out = partials
        else:
            out = torch.empty((slots, hidden), dtype=spec.dtype, device=partials.device)
            sums(partials, out)
        return tuple(out[s].view(weight_shape) for s in range(slots))

    def workspace(x: torch.Tensor) -> torch.Tensor:
        return torch.empty((slots, launch.blocks, hidden), dtype=spec.dtype if direct else torch.float32,
                           device=x.device)

    if meanvar:
        def layer_norm_backward(grad_out, x, weight, bias, mean, rstd):
            grad_x, partials = torch.empty_like(x), workspace(x)
            main(grad_out, x, weight, mean, rstd, grad_x, partials)
            return (grad_x, *gradients(partials))

        run = layer_norm_backward
    else:
        def rms_norm_backward(grad_out, x, weight, rstd):
            grad_x, partials = torch.empty_like(x), workspace(x)
            main(grad_out, x, weight, rstd, grad_x, partials)
            return (grad_x, *gradients(partials))

        run = rms_norm_backward
    run.config = {"kernels": 1 if direct else 2, "threads": launch.threads, "blocks": launch.blocks,
                  "rows_per_block": -(-rows // launch.blocks), "column_threads": COLUMN_THREADS}
    return run
