"""TileLang kernels for one spectral-norm power iteration (SpectralNormPowerIterFwd).

v' needs all of Wᵀu before W v' can start, and W / sigma needs all of W v': three passes over W
[R, C], and one write. The norms are deferred to scalars so that every pass over W or over a
vector spreads across the GPU. With t = Wᵀu, nt = max(||t||, eps) and z = W t, v' = t / nt and
s = W v' = z / nt:

1. column partials  P[k, c] = Σ_{r in row chunk k} W[r, c] u[r]
2. t = Σ_k P[k, :] and sums of t²
3. z = W t and sums of z²
4. nt, s = z / nt, u' = s / max(||s||, eps), sigma = u'·s = ||s||² / max(||s||, eps),
   v' = t / nt written out
5. out = W / sigma

Many rows, the default where W splits into them (:func:`_column_slabs`): all of it in one
cooperative launch, a block an SM, each block all rows of a slab of columns. Wᵀu is whole for a
block's columns once it has read its slab, so its partial sums of W t over those columns follow at
once, with no barrier between the two passes over W and no pass 2: two grid barriers in all. Steps
over a slab are held in shared memory, then in registers, the rest read again. On the H200 it
leads the row slabs below on all six catalog prefill rows (16384 wide bf16 52.80 -> 48.34 µs, f16 52.53 -> 47.62; 8192 bf16 27.48 -> 25.57; 4096 bf16 18.94 -> 17.51).

Row slabs (:func:`_cooperative`, the default where column slabs do not fit): the same one
cooperative launch, each block a slab of rows, grid barriers between passes 1, 2, 3 and 4. Each
slab's first rows stay in the block's shared memory from pass 1 on (all of them up to 4096 wide),
so W is read from DRAM once where it fits there, and only the rest again. Pass 3 streams the rows
as pass 1 does, each thread holding its columns of t. It beats the five launches below on every
catalog prefill row on the H200, tuned: 2048 x 4096 23.62 -> 19.20 µs, 8192 37.79 -> 29.50, 16384
71.94 -> 62.37 in its basic form; pass 3 streamed takes these to 19.01, 27.46 and 54.94, and pass 4
writing pass 3's last rows from registers takes 16384 wide to 53.12.

The five-launch form, a launch variant (and the rule where the cooperative kernel's accumulators
would not fit in registers): passes 1 (column tiles x row chunks, each thread keeping ROW_UNROLL
rows' loads in flight), 2 (one block per column tile), 3 (one block per row), 4 (one block), 5
(one block per row, rows in the reverse of pass 3's order so the rows pass 3 read last, the
likeliest still in L2, are read first), each a launch.

A single row (R == 1, the decode workloads) is one launch: with w = W[0] and u0 = u[0],
t = u0 w, so ||t||² = u0² ||w||², s = w·v' = u0 ||w||² / nt and sigma follow from one reduction
(a one-barrier block reduction, see block_reduce), over a cluster of blocks where the row is wide
enough (block_reduce.cluster_split). The five launches' pass 3 keeps TileLang's all-reduce: the
one-barrier form measured 1-7% slower on the prefill rows (H200).

Launch variants (``npuops run --tune``): the cooperative kernel's threads; the column slabs'
threads and steps held in registers; threads of the per-row kernels (3, 5 and the single row), the
single row's cluster, row chunks of the column partials, and programmatic dependent launch
(``pdl``): each of passes 2-5 may start while the pass before it finishes, passes 3 and 5 loading
their rows of W before they wait for it (``griddepcontrol``); the default comes first.

TileLang is imported when a kernel is built. (No ``from __future__ import annotations`` here:
TileLang evaluates the prim_funcs' tensor annotations, which must see the enclosing shapes.)
"""


from collections.abc import Callable

import torch
from npuops import VECTOR_BYTES, compile_kernel, multiprocessors, tilelang_dtype

from .block_reduce import block_reducer, cluster_kernel, cluster_split, exchange_slots, thread_major

F32 = "float32"
COLUMN_TILE = 2048  # columns per block of the column-partial kernel (256 threads x 8)
ROW_CHUNKS = 16  # the fewest row chunks of the column partials
COLUMN_PARTIAL_BLOCKS = 256  # about two blocks per SM
ROW_UNROLL = 8  # rows of W each column-partial thread has in flight (one 16-byte load each)
SUM_TILE = 256  # columns per block summing the partials (64 threads x 4)
THREADS = 1024  # threads of the one-block kernels
ROW_THREADS = 512  # the single row's default, and the per-row kernels' without pdl (fastest of 256-1024 on
#                    most catalog workloads on the H200; 256 on 4096 columns); with pdl, half that


def unsupported(rows: int, cols: int) -> str | None:
    """Why these kernels cannot take W [rows, cols]: each block's share must split evenly."""
    if cols % THREADS or (rows > 1 and cols % COLUMN_TILE):
        return f"the spectral-norm kernels need columns divisible by {THREADS if rows == 1 else COLUMN_TILE}, got {cols}"
    if rows > 1 and rows % THREADS:
        return f"the spectral-norm kernels need one row or a multiple of {THREADS} rows, got {rows}"
    return None


def default_row_chunks(rows: int, cols: int) -> int:
    """Row chunks of the column partials: about COLUMN_PARTIAL_BLOCKS blocks, at least ROW_CHUNKS
    chunks and at least ROW_UNROLL rows each."""
    return min(rows // ROW_UNROLL, max(ROW_CHUNKS, COLUMN_PARTIAL_BLOCKS // (cols // COLUMN_TILE)))


def launch_variants(rows: int, cols: int, dtype: torch.dtype) -> list[dict[str, int]]:
    """Launch configurations ``npuops run --tune`` chooses among for W [rows, cols] of ``dtype``,
    the default first."""
    if rows == 1:
        split = cluster_split(cols)
        clustered = [{"threads": t, "cluster": split[0]} for t in (split[1], split[1] * 2)] if split else []
        return clustered + [{"threads": t} for t in (ROW_THREADS, ROW_THREADS * 2, ROW_THREADS // 2)]
    chunks = default_row_chunks(rows, cols)
    pairs = [(ROW_THREADS, chunks), (ROW_THREADS // 2, chunks), (ROW_THREADS * 2, chunks), (ROW_THREADS, chunks // 2)]
    if chunks * 2 * ROW_UNROLL <= rows:
        pairs.append((ROW_THREADS, chunks * 2))
    # Programmatic dependent launch first, at half the threads: it won every prefill tuning on the
    # H200 (W8 27.90 -> 23.87 µs, W5 41.70 -> 38.14 at 256 threads; W2 75.74 ->
    # 72.27 at 256 and 512 alike), 256 threads all but W3 (71.95 at 512 against 72.16).
    variants = [{"threads": t, "row_chunks": k} for t, k in pairs]
    # Column slabs first: on the H200 they led the row-slab cooperative kernel
    # on all six catalog prefill rows (16384 wide bf16 52.80 -> 48.34 µs, 8192 bf16 27.48 -> 25.57,
    # 4096 bf16 18.94 -> 17.51), 512 threads ahead of 256 on each.
    slabs = [{"threads": t, "column_slabs": True, "register_steps": k} for t, k in column_slab_choices(rows, cols, dtype)]
    # The row-slab cooperative kernel next, at 512 threads (H200: 2048 x 4096 19.01 µs against
    # 19.17 at 256, 8192 wide 27.46 against 28.13), or 256 where 512 would not have whole vectors a thread.
    cooperative = [{"threads": t, "cooperative": True} for t in (ROW_THREADS, ROW_THREADS // 2) if cooperative_fits(rows, cols, t)]
    return slabs + cooperative + [{**config, "pdl": True} for config in (variants[1], variants[0])] + variants


def _single_row(cols: int, dt: str, itemsize: int, eps: float, threads: int = ROW_THREADS, cluster: int = 1):
    import tilelang.language as T

    span = cols // cluster  # columns of one block
    reduce = block_reducer(threads, span, itemsize, cluster)

    @T.prim_func
    def main(W: T.Tensor((1, cols), dt), U: T.Tensor((1,), dt), Out: T.Tensor((1, cols), dt),
             UOut: T.Tensor((1,), dt), VOut: T.Tensor((cols,), dt)):
        with cluster_kernel(cluster, cluster, threads) as block:
            start = block * span
            if cluster > 1:
                T.cluster_arrive_relaxed()
            w = T.alloc_fragment((1, span), dt)
            T.annotate_layout({w: thread_major(span, threads, itemsize)})
            exchange = exchange_slots(1, threads, cluster)
            ww = T.alloc_fragment((1,), F32)
            u0 = T.alloc_var(F32)
            u0 = T.Cast(F32, U[0])  # loaded with the row: after the reduction its latency would add
            for g, c in T.Parallel(1, span):
                w[g, c] = W[0, start + c]
            if cluster > 1:
                T.cluster_wait()  # every block of the cluster has started: the reduction may write to it
            reduce(lambda _, c: T.Cast(F32, w[0, c]) * T.Cast(F32, w[0, c]), ww, "sum", exchange, 0)  # ||w||²
            nt = T.max(T.sqrt(u0 * u0 * ww[0]), eps)  # ||t||, t = u0 w
            s = u0 * ww[0] / nt  # w·v'
            u_new = s / T.max(T.abs(s), eps)
            # Variables, not expressions TileLang would inline: an f32 division per element binds the issue rate.
            v_scale, inv_sigma = T.alloc_var(F32), T.alloc_var(F32)
            v_scale, inv_sigma = u0 / nt, 1.0 / (u_new * s)
            # Both outputs computed into registers first, so each is stored in whole 16-byte vectors.
            v_new, out = T.alloc_fragment((1, span), dt), T.alloc_fragment((1, span), dt)
            T.annotate_layout({v_new: thread_major(span, threads, itemsize), out: thread_major(span, threads, itemsize)})
            for g, c in T.Parallel(1, span):
                v_new[g, c] = T.Cast(dt, T.Cast(F32, w[g, c]) * v_scale)
                out[g, c] = T.Cast(dt, T.Cast(F32, w[g, c]) * inv_sigma)
            for g, c in T.Parallel(1, span):
                VOut[start + c] = v_new[g, c]
                Out[g, start + c] = out[g, c]
            UOut[0] = T.Cast(dt, u_new)

    return main


def _column_partials(rows: int, cols: int, dt: str, row_chunks: int, pdl: bool = False):
    import tilelang.language as T

    chunk = rows // row_chunks

    @T.prim_func
    def main(W: T.Tensor((rows, cols), dt), U: T.Tensor((rows,), dt), P: T.Tensor((row_chunks, cols), F32)):
        with T.Kernel(cols // COLUMN_TILE, row_chunks, threads=COLUMN_TILE // 8) as (bc, k):
            acc = T.alloc_fragment((COLUMN_TILE,), F32)
            for c in T.Parallel(COLUMN_TILE):
                acc[c] = 0.0
            for step in T.serial(chunk // ROW_UNROLL):
                for i in T.unroll(ROW_UNROLL):
                    for c in T.Parallel(COLUMN_TILE):
                        r = k * chunk + step * ROW_UNROLL + i
                        acc[c] += T.Cast(F32, W[r, bc * COLUMN_TILE + c]) * T.Cast(F32, U[r])
            for c in T.Parallel(COLUMN_TILE):
                P[k, bc * COLUMN_TILE + c] = acc[c]
            if pdl:
                T.pdl_trigger()

    return main


def _sum_partials(cols: int, row_chunks: int, pdl: bool = False):
    import tilelang.language as T

    @T.prim_func
    def main(P: T.Tensor((row_chunks, cols), F32), Tv: T.Tensor((cols,), F32),
             Squares: T.Tensor((cols // SUM_TILE,), F32)):
        with T.Kernel(cols // SUM_TILE, threads=SUM_TILE // 4) as b:
            t = T.alloc_fragment((SUM_TILE,), F32)
            sq = T.alloc_fragment((SUM_TILE,), F32)
            total = T.alloc_fragment((1,), F32)
            if pdl:
                T.pdl_sync()
            for c in T.Parallel(SUM_TILE):
                t[c] = 0.0
            for k in T.unroll(row_chunks):
                for c in T.Parallel(SUM_TILE):
                    t[c] += P[k, b * SUM_TILE + c]
            for c in T.Parallel(SUM_TILE):
                Tv[b * SUM_TILE + c] = t[c]
                sq[c] = t[c] * t[c]
            T.reduce_sum(sq, total, dim=0)
            Squares[b] = total[0]
            if pdl:
                T.pdl_trigger()

    return main


def _row_dots(rows: int, cols: int, dt: str, threads: int = ROW_THREADS, pdl: bool = False):
    import tilelang.language as T

    @T.prim_func
    def main(W: T.Tensor((rows, cols), dt), Tv: T.Tensor((cols,), F32), Z: T.Tensor((rows,), F32)):
        with T.Kernel(rows, threads=threads) as r:
            prod = T.alloc_fragment((cols,), F32)
            total = T.alloc_fragment((1,), F32)
            if pdl:  # the row loads while the kernels before finish; t is read once they have
                w = T.alloc_fragment((cols,), dt)
                for c in T.Parallel(cols):
                    w[c] = W[r, c]
                T.pdl_sync()
                for c in T.Parallel(cols):
                    prod[c] = T.Cast(F32, w[c]) * Tv[c]
            else:
                for c in T.Parallel(cols):
                    prod[c] = T.Cast(F32, W[r, c]) * Tv[c]
            T.reduce_sum(prod, total, dim=0)
            Z[r] = total[0]
            if pdl:
                T.pdl_trigger()

    return main


def _finish(rows: int, cols: int, dt: str, eps: float, pdl: bool = False):
    import tilelang.language as T

    tiles = cols // SUM_TILE

    @T.prim_func
    def main(Z: T.Tensor((rows,), F32), Tv: T.Tensor((cols,), F32), Squares: T.Tensor((tiles,), F32),
             UOut: T.Tensor((rows,), dt), VOut: T.Tensor((cols,), dt), Sigma: T.Tensor((1,), F32)):
        with T.Kernel(1, threads=THREADS) as _:
            tt = T.alloc_local((1,), F32)
            z = T.alloc_fragment((rows,), F32)
            sq_z = T.alloc_fragment((rows,), F32)
            zz = T.alloc_fragment((1,), F32)
            if pdl:
                T.pdl_sync()
            tt[0] = 0.0
            for i in T.serial(tiles):  # a few dozen tiles: every thread sums them
                tt[0] += Squares[i]
            for r in T.Parallel(rows):
                z[r] = Z[r]
                sq_z[r] = z[r] * z[r]
            T.reduce_sum(sq_z, zz, dim=0)  # ||z||²
            nt = T.max(T.sqrt(tt[0]), eps)  # ||t||
            ns = T.sqrt(zz[0]) / nt  # ||s||, s = z / nt
            for r in T.Parallel(rows):
                UOut[r] = T.Cast(dt, z[r] / nt / T.max(ns, eps))
            inv_nt = T.alloc_var(F32)
            inv_nt = 1.0 / nt
            for c in T.Parallel(cols):
                VOut[c] = T.Cast(dt, Tv[c] * inv_nt)
            Sigma[0] = ns * ns / T.max(ns, eps)
            if pdl:
                T.pdl_trigger()

    return main


def _scale(rows: int, cols: int, dt: str, threads: int = ROW_THREADS, pdl: bool = False):
    import tilelang.language as T

    @T.prim_func
    def main(W: T.Tensor((rows, cols), dt), Sigma: T.Tensor((1,), F32), Out: T.Tensor((rows, cols), dt)):
        with T.Kernel(rows, threads=threads) as b:
            inv_sigma = T.alloc_var(F32)  # a variable: TileLang would inline the division per element
            if pdl:  # the row loads while the kernels before finish; sigma is read once they have
                w = T.alloc_fragment((cols,), dt)
                for c in T.Parallel(cols):
                    w[c] = W[rows - 1 - b, c]
                T.pdl_sync()
                inv_sigma = 1.0 / Sigma[0]
                for c in T.Parallel(cols):
                    Out[rows - 1 - b, c] = T.Cast(dt, T.Cast(F32, w[c]) * inv_sigma)
            else:
                inv_sigma = 1.0 / Sigma[0]
                for c in T.Parallel(cols):
                    Out[rows - 1 - b, c] = T.Cast(dt, T.Cast(F32, W[rows - 1 - b, c]) * inv_sigma)

    return main


COOPERATIVE_VECTORS_IN_FLIGHT = 16  # 16-byte loads of W each thread has in flight in passes 1 and 3
COOPERATIVE_MAX_COLUMNS_PER_THREAD = 32  # pass 1's accumulators, in registers
# A block's shared memory (sm_90's most, less some for the passes' small exchanges): the rows of its
# slab that fit are held there from pass 1 on, so passes 3 and 4 read them there, and the L2 has
# only the others to keep.
SHARED_BYTES, SHARED_SPARE = 227 * 1024, 8192
COOPERATIVE_MAX_SLAB = 32  # rows a block: pass 3 ends each row's sum on a thread of its own, the warps' partial
#                            sums of every row in the spare shared memory


def cooperative_blocks(rows: int, cols: int, sms: int | None = None) -> int:
    """Blocks of the cooperative kernel: one an SM (of ``sms``, by default the GPU's) at most (a
    cooperative launch needs every block resident), a power of two dividing the rows and the columns."""
    blocks = 1 << ((sms or multiprocessors()).bit_length() - 1)
    while rows % blocks or cols % blocks:
        blocks //= 2
    return blocks


def cooperative_fits(rows: int, cols: int, threads: int) -> bool:
    """Whether :func:`_cooperative` takes W [rows, cols] at ``threads``: whole 16-byte vectors a
    thread, at most COOPERATIVE_MAX_COLUMNS_PER_THREAD accumulators (pass 1) and as many columns of t
    (pass 3) a thread, at most COOPERATIVE_MAX_SLAB rows a block."""
    return (rows > 1 and cols % (threads * 8) == 0 and cols // threads <= COOPERATIVE_MAX_COLUMNS_PER_THREAD
            and rows // cooperative_blocks(rows, cols) <= COOPERATIVE_MAX_SLAB)


def row_groups(count: int, in_flight: int) -> list[tuple[int, int, int]]:
    """(steps, rows a step, first row) covering ``count`` rows in_flight at a time, then the rest."""
    return [(count // in_flight, in_flight, 0), (1 if count % in_flight else 0, count % in_flight, count - count % in_flight)]


def held_rows(rows: int, cols: int, itemsize: int, blocks: int) -> int:
    """Rows of each block's slab the cooperative kernel holds in shared memory."""
    return min(rows // blocks, max(0, SHARED_BYTES - SHARED_SPARE) // (cols * itemsize))


def block_summer(threads: int):
    """A macro ``block_sum(value, partial, warp_sums, out, b, tx)``: out[b] = the sum of every
    thread's value() (thread 0 stores it), over each warp by shuffles, then over the warps through
    warp_sums (threads // 32 shared f32); partial, a (1,) local, ends holding it on thread 0."""
    import tilelang.language as T

    @T.macro
    def block_sum(value, partial, warp_sums, out, b, tx):
        partial[0] = T.warp_reduce_sum(value())
        if tx % 32 == 0:
            warp_sums[tx // 32] = partial[0]
        T.sync_threads()
        if tx == 0:
            for k in T.serial(1, threads // 32):
                partial[0] += warp_sums[k]
            out[b] = partial[0]

    return block_sum


def chunk_summer(threads: int, blocks: int, chunk: int):
    """A macro ``sum_chunk(partials, parts, total, b, tx)``: total[0] = the sum over k < blocks of
    partials[k, b * chunk + tx] on each thread tx < chunk, 0 on the others; entry b * chunk + tx
    is summed by the threads tx, tx + chunk, ..., then over them through parts (a (threads //
    chunk, chunk) shared f32 buffer)."""
    import tilelang.language as T

    summers = threads // chunk

    @T.macro
    def sum_chunk(partials, parts, total, b, tx):
        total[0] = 0.0
        if tx < summers * chunk:
            for k in T.serial(T.ceildiv(blocks - tx // chunk, summers)):
                total[0] += partials[tx // chunk + k * summers, b * chunk + tx % chunk]
            parts[tx // chunk, tx % chunk] = total[0]
        T.sync_threads()
        total[0] = 0.0
        if tx < chunk:
            for k in T.serial(summers):
                total[0] += parts[k, tx]

    return sum_chunk


def _cooperative(rows: int, cols: int, dt: str, itemsize: int, eps: float, threads: int, blocks: int):
    """All five passes in one cooperative launch, each block a slab of rows, grid barriers where a
    pass needs the whole of the one before: W is read from DRAM once (pass 1), the first rows of
    each slab held in shared memory (:func:`held_rows`), the others read again (from the L2 where it
    kept them), but for the last few, which pass 3 leaves in registers for pass 4; no launch or drain
    between passes."""
    import tilelang.language as T

    vec = 8
    block_sum = block_summer(threads)
    slab, chunk = rows // blocks, cols // blocks  # this block's rows, and columns of t it sums
    sum_chunk = chunk_summer(threads, blocks, chunk)
    held = held_rows(rows, cols, itemsize, blocks)  # at least 3 rows of 16384 f32 columns: cooperative_fits
    per_row = cols // (threads * vec)  # vectors of a row per thread (passes 1 and 3)
    in_flight = max(1, COOPERATIVE_VECTORS_IN_FLIGHT // per_row)  # rows
    summers = threads // chunk  # threads summing each column of t (pass 2)
    warps = threads // 32
    # Rows not held that pass 4 takes from pass 3's registers: its last group (row_groups) of them.
    streamed = slab - held
    kept = streamed % in_flight or min(streamed, in_flight)

    @T.prim_func
    def main(W: T.Tensor((rows, cols), dt), U: T.Tensor((rows,), dt), Out: T.Tensor((rows, cols), dt),
             UOut: T.Tensor((rows,), dt), VOut: T.Tensor((cols,), dt), P: T.Tensor((blocks, cols), F32),
             Tv: T.Tensor((cols,), F32), Squares: T.Tensor((blocks,), F32), Z: T.Tensor((rows,), F32),
             ZSquares: T.Tensor((blocks,), F32)):
        with T.Kernel(blocks, threads=threads) as b:
            tx = T.get_thread_binding()
            lane, warp = tx % 32, tx // 32
            first = b * slab
            # 1. P[b, :] = this slab's Wᵀu; its first rows kept
            held_w = T.alloc_shared((held, cols), dt)
            acc = T.alloc_fragment((1, cols), F32)
            T.annotate_layout({acc: thread_major(cols, threads, itemsize)})  # whole 16-byte vectors of W
            for g, c in T.Parallel(1, cols):
                acc[g, c] = 0.0
            for start, count, hold in ((0, held, True), (held, slab - held, False)):
                # in_flight rows at a time (their loads in flight together), then the rest
                for steps, unroll, offset in row_groups(count, in_flight):
                    for step in T.serial(steps):
                        for i in T.unroll(unroll):
                            for g, c in T.Parallel(1, cols):
                                r = start + offset + step * unroll + i
                                if hold:
                                    held_w[r, c] = W[first + r, c]
                                acc[g, c] += T.Cast(F32, W[first + r, c]) * T.Cast(F32, U[first + r])
            for g, c in T.Parallel(1, cols):
                P[b, c] = acc[g, c]
            T.sync_grid()
            # 2. t over this block's columns (column c summed by the threads c, c + chunk, ...), and
            # their sum of squares
            column_sums = T.alloc_shared((summers, chunk), F32)
            warp_sums = T.alloc_shared((warps,), F32)
            total = T.alloc_local((1,), F32)
            sum_chunk(P, column_sums, total, b, tx)
            if tx < chunk:
                Tv[b * chunk + tx] = total[0]
            t_squared = T.alloc_local((1,), F32)
            block_sum(lambda: total[0] * total[0], t_squared, warp_sums, Squares, b, tx)
            T.sync_grid()
            # 3. z = W t over the slab: each thread's share of t in registers (the columns whose W
            # vectors it loads), rows streamed as in pass 1 (held ones from shared memory), each row's
            # products summed over the warp, then over the block's warps
            t_share = T.alloc_local((per_row, vec), F32)
            w = T.alloc_local((in_flight, per_row, vec), dt)
            dots = T.alloc_local((in_flight,), F32)
            row_sums = T.alloc_shared((warps, slab), F32)
            z_squares = T.alloc_shared((warps,), F32)
            z_squared = T.alloc_local((1,), F32)
            for j in T.unroll(per_row):
                for e in T.vectorized(vec):
                    t_share[j, e] = Tv[(j * threads + tx) * vec + e]
            for start, count, hold in ((0, held, True), (held, slab - held, False)):
                for steps, unroll, offset in row_groups(count, in_flight):
                    for step in T.serial(steps):
                        for i in T.unroll(unroll):
                            r = start + offset + step * unroll + i
                            dots[i] = 0.0
                            for j in T.unroll(per_row):
                                for e in T.vectorized(vec):
                                    if hold:
                                        w[i, j, e] = held_w[r, (j * threads + tx) * vec + e]
                                    else:
                                        w[i, j, e] = W[first + r, (j * threads + tx) * vec + e]
                                for e in T.unroll(vec):
                                    dots[i] += T.Cast(F32, w[i, j, e]) * t_share[j, e]
                        for i in T.unroll(unroll):
                            dots[i] = T.warp_reduce_sum(dots[i])
                            if lane == 0:
                                row_sums[warp, start + offset + step * unroll + i] = dots[i]
            T.sync_threads()
            z_squared[0], dots[0] = 0.0, 0.0
            if tx < slab:  # cooperative_fits: slab <= 32 rows
                for k in T.serial(warps):
                    dots[0] += row_sums[k, tx]
                Z[first + tx] = dots[0]
                z_squared[0] = dots[0] * dots[0]
            block_sum(lambda: z_squared[0], z_squared, z_squares, ZSquares, b, tx)
            T.sync_grid()
            # 4. the scalars, from every block's sums; u', v' (this block's share) and W / sigma
            t_partials, z_partials = T.alloc_fragment((blocks,), F32), T.alloc_fragment((blocks,), F32)
            z_total = T.alloc_fragment((1,), F32)
            for k in T.Parallel(blocks):
                t_partials[k] = Squares[k]
                z_partials[k] = ZSquares[k]
            t_total = T.alloc_fragment((1,), F32)
            T.reduce_sum(t_partials, t_total, dim=0)
            T.reduce_sum(z_partials, z_total, dim=0)
            # Variables, not expressions TileLang would inline per element.
            nt, ns, inv_sigma = T.alloc_var(F32), T.alloc_var(F32), T.alloc_var(F32)
            nt = T.max(T.sqrt(t_total[0]), eps)  # ||t||
            ns = T.sqrt(z_total[0]) / nt  # ||s||, s = z / nt
            inv_sigma = T.max(ns, eps) / (ns * ns)
            for r in T.Parallel(slab):
                UOut[first + r] = T.Cast(dt, Z[first + r] / nt / T.max(ns, eps))
            for c in T.Parallel(chunk):
                VOut[b * chunk + c] = T.Cast(dt, Tv[b * chunk + c] / nt)
            # the rows read from DRAM again, then the last ones pass 3 left in registers, then the held
            for r, c in T.Parallel(slab - held - kept, cols):
                Out[first + held + r, c] = T.Cast(dt, T.Cast(F32, W[first + held + r, c]) * inv_sigma)
            out = T.alloc_local((vec,), dt)
            for i in T.unroll(kept):
                for j in T.unroll(per_row):
                    for e in T.unroll(vec):
                        out[e] = T.Cast(dt, T.Cast(F32, w[i, j, e]) * inv_sigma)
                    for e in T.vectorized(vec):
                        Out[first + slab - kept + i, (j * threads + tx) * vec + e] = out[e]
            for r, c in T.Parallel(held, cols):
                Out[first + r, c] = T.Cast(dt, T.Cast(F32, held_w[r, c]) * inv_sigma)

    return main


COLUMN_SLAB_IN_FLIGHT = 8  # 16-byte loads of W each thread of the column-slab kernel has in flight


def column_slab_blocks(rows: int, cols: int, itemsize: int, sms: int | None = None) -> int | None:
    """Blocks of :func:`_column_slabs`: the most, at most one an SM (of ``sms``, by default the
    GPU's), whose slabs of columns are whole 16-byte vectors of a row spread over a power of two of
    a warp's lanes, with an equal share of the rows each for the last sums; None where no count does."""
    vec = VECTOR_BYTES // itemsize
    for blocks in range(min(sms or multiprocessors(), cols // vec), 0, -1):
        lanes = cols // blocks // vec
        if cols % blocks == 0 and rows % blocks == 0 and (cols // blocks) % vec == 0 and lanes <= 32 \
                and lanes & (lanes - 1) == 0:
            return blocks
    return None


def column_slabs_fit(rows: int, cols: int, itemsize: int, threads: int, sms: int | None = None) -> bool:
    """Whether :func:`_column_slabs` takes W [rows, cols] at ``threads``: each step over a slab
    covers a whole number of rows, the rows split evenly into steps, and a block's share of the
    rows for the last sums is at most a thread each."""
    blocks = column_slab_blocks(rows, cols, itemsize, sms)
    if rows < 2 or blocks is None:
        return False
    lanes = cols // blocks // (VECTOR_BYTES // itemsize)
    return threads % lanes == 0 and rows % (threads // lanes) == 0 and rows // blocks <= threads


# Steps held in registers, for each dtype and threads count, in the order tuning tries them. 512
# threads with 4 first, the default, which spills on no shape tried: it led 0 on the three rows
# where they differ, on the H200 (16384 wide bf16 48.34 against 48.78 µs). The
# most that no catalog shape spills (ptxas -v): bf16 6 at 512 threads and 24 at 256, f16 12 and
# 32, whose conversion to f32 takes fewer registers than bf16's (the sources differ only in the
# type). 8192 wide, 5 steps hold at 512 threads all that shared memory does not. In tunings on
# the H200, 16384 wide f16 ran 45.47 µs with 8 against 47.90 with 4,
# bf16 47.71 with 6 against 48.21, 8192 wide bf16 25.57 with 5 against 25.81. The wider options
# spill on shapes of other lanes (3072 x 6144: bf16 at 512 threads from 6, f16 from 8): slower
# there, never wrong, and tuning measures them.
COLUMN_SLAB_REGISTER_STEPS = {
    torch.bfloat16: {512: (4, 6, 0), 256: (0, 16, 24)},
    torch.float16: {512: (4, 12, 8, 0), 256: (0, 16, 24, 32)},
}


def column_slab_choices(rows: int, cols: int, dtype: torch.dtype) -> list[tuple[int, int]]:
    """(threads, register_steps) of the column-slab kernel's launch variants for W [rows, cols],
    in the order of COLUMN_SLAB_REGISTER_STEPS (none held in registers for a dtype it lacks): each
    threads count that fits, each number of steps it would hold in registers once (none where
    shared memory holds every step)."""
    itemsize = dtype.itemsize
    choices, blocks = [], column_slab_blocks(rows, cols, itemsize)
    for threads, options in COLUMN_SLAB_REGISTER_STEPS.get(dtype, {512: (0,), 256: (0,)}).items():
        if column_slabs_fit(rows, cols, itemsize, threads):
            held = (column_slab_steps(rows, cols, itemsize, threads, k, blocks)[1] for k in options)
            choices += [choice for choice in dict.fromkeys((threads, k) for k in held)]
    return choices


def column_slab_steps(rows: int, cols: int, itemsize: int, threads: int, register_steps: int,
                      blocks: int) -> tuple[int, int, int]:
    """Steps of :func:`_column_slabs` over a slab (a 16-byte vector a thread each) held in shared
    memory, held in registers (at most ``register_steps``) and read again, in that order."""
    width = cols // blocks
    lanes = width // (VECTOR_BYTES // itemsize)
    steps, chunk = rows * lanes // threads, rows // blocks
    warps = threads // 32
    # the sums' shared memory: pass 1's warp sums and t, the rows' partial sums of z and z, block sums
    spare = 4 * (warps * width + width + threads + chunk + 2 * warps) + 1024
    in_shared = min(steps, (SHARED_BYTES - spare) // (threads * VECTOR_BYTES))
    in_registers = min(steps - in_shared, register_steps)
    return in_shared, in_registers, steps - in_shared - in_registers


def _column_slabs(rows: int, cols: int, dt: str, itemsize: int, eps: float, threads: int, blocks: int,
                  register_steps: int):
    """The power iteration in one cooperative launch, each block a slab of W's columns (all rows):
    t = Wᵀu is whole for a block's columns once it has read them, so its share of z = W t (partial
    sums over its columns, every row) follows at once, from the slab it holds, with no grid barrier
    between; one barrier before the rows' sums of z, one before the scalars. Each thread takes one
    16-byte vector of a row a step, ``lanes`` threads a row, ``row_step`` rows a step, the loads of
    COLUMN_SLAB_IN_FLIGHT steps at a time; the first steps stay in shared memory from pass 1 on, the
    next ``register_steps`` in registers, the rest are read again: pass 3 from the last pass 1
    read, so that what the L2 still holds is read first, and pass 4 the other way."""
    import tilelang.language as T

    vec = VECTOR_BYTES // itemsize
    width = cols // blocks  # columns of a block's slab
    lanes = width // vec  # threads along a row of the slab
    row_step = threads // lanes  # rows a step covers
    chunk = rows // blocks  # rows whose z the block sums
    summers = threads // chunk  # threads summing each of them
    warps = threads // 32
    in_flight = COLUMN_SLAB_IN_FLIGHT
    in_shared, in_registers, streamed = column_slab_steps(rows, cols, itemsize, threads, register_steps, blocks)
    first_streamed = in_shared + in_registers
    lane_masks = tuple(1 << k for k in range(lanes.bit_length() - 1))  # xor partners within a row's lanes
    row_masks = tuple(lanes << k for k in range((32 // lanes).bit_length() - 1))  # partners with the same columns
    block_sum, sum_chunk = block_summer(threads), chunk_summer(threads, blocks, chunk)

    @T.macro
    def slab_dot(w, i, dots, t_share, z_partials, b, row, lane):
        """z_partials[b, row] = the slab's part of row's dot with t, from w[i] on each of its lanes."""
        dots[i] = 0.0
        for e in T.unroll(vec):
            dots[i] += T.Cast(F32, w[i, e]) * t_share[e]
        for mask in lane_masks:
            dots[i] += T.shfl_xor(dots[i], mask)
        if lane == 0:
            z_partials[b, row] = dots[i]

    @T.macro
    def visit_slab(visit, streamed_step, row_of, W, w, register_w, shared_w, column, tx):
        """visit(values, i, row) for each step of the slab, values[i] its 16-byte vector on this
        thread: the steps read again (streamed_step(n) the n-th of them), then those held in
        registers, then those in shared memory."""
        for steps, unroll, offset in row_groups(streamed, in_flight):
            for step in T.serial(steps):
                for i in T.unroll(unroll):
                    for e in T.vectorized(vec):
                        w[i, e] = W[row_of(streamed_step(offset + step * unroll + i)), column + e]
                for i in T.unroll(unroll):
                    visit(w, i, row_of(streamed_step(offset + step * unroll + i)))
        for j in T.unroll(in_registers):
            visit(register_w, j, row_of(in_shared + j))
        for steps, unroll, offset in row_groups(in_shared, in_flight):
            for step in T.serial(steps):
                for i in T.unroll(unroll):
                    for e in T.vectorized(vec):
                        w[i, e] = shared_w[offset + step * unroll + i, tx, e]
                for i in T.unroll(unroll):
                    visit(w, i, row_of(offset + step * unroll + i))

    @T.macro
    def sum_of_blocks(partials, total, warp_lane):
        """total[0] = the sum of partials[0..blocks), on every thread: each warp sums them all (a
        few loads a lane), so no thread waits for another."""
        total[0] = 0.0
        for k in T.serial(T.ceildiv(blocks - warp_lane, 32)):
            total[0] += partials[warp_lane + k * 32]
        total[0] = T.warp_reduce_sum(total[0])

    @T.macro
    def scaled_store(w, i, out, inv_sigma, Out, row, column):
        for e in T.unroll(vec):
            out[e] = T.Cast(dt, T.Cast(F32, w[i, e]) * inv_sigma)
        for e in T.vectorized(vec):
            Out[row, column + e] = out[e]

    @T.prim_func
    def main(W: T.Tensor((rows, cols), dt), U: T.Tensor((rows,), dt), Out: T.Tensor((rows, cols), dt),
             UOut: T.Tensor((rows,), dt), VOut: T.Tensor((cols,), dt), ZPartials: T.Tensor((blocks, rows), F32),
             TSquares: T.Tensor((blocks,), F32), ZSquares: T.Tensor((blocks,), F32)):
        with T.Kernel(blocks, threads=threads) as b:
            tx = T.get_thread_binding()
            lane = tx % lanes
            column = b * width + lane * vec  # of this thread's vector in every row it takes
            row_of = lambda nth: nth * row_step + tx // lanes  # this thread's row in step nth
            # 1. t over the slab's columns; the first steps kept in shared memory, the next in registers
            shared_w = T.alloc_shared((max(in_shared, 1), threads, vec), dt)
            register_w = T.alloc_local((max(in_registers, 1), vec), dt)
            w = T.alloc_local((in_flight, vec), dt)
            u = T.alloc_local((in_flight,), F32)
            acc = T.alloc_local((vec,), F32)
            for e in T.unroll(vec):
                acc[e] = 0.0
            for first, count, held in ((0, in_shared, True), (first_streamed, streamed, False)):
                for steps, unroll, offset in row_groups(count, in_flight):
                    for step in T.serial(steps):
                        for i in T.unroll(unroll):
                            for e in T.vectorized(vec):
                                w[i, e] = W[row_of(first + offset + step * unroll + i), column + e]
                            u[i] = T.Cast(F32, U[row_of(first + offset + step * unroll + i)])
                        for i in T.unroll(unroll):
                            if held:
                                for e in T.vectorized(vec):
                                    shared_w[offset + step * unroll + i, tx, e] = w[i, e]
                            for e in T.unroll(vec):
                                acc[e] += T.Cast(F32, w[i, e]) * u[i]
                if held:  # the steps after those in shared memory, into registers
                    for j in T.unroll(in_registers):
                        for e in T.vectorized(vec):
                            register_w[j, e] = W[row_of(in_shared + j), column + e]
                    for j in T.unroll(in_registers):
                        for e in T.unroll(vec):
                            acc[e] += T.Cast(F32, register_w[j, e]) * T.Cast(F32, U[row_of(in_shared + j)])
            for e in T.unroll(vec):
                for mask in row_masks:
                    acc[e] += T.shfl_xor(acc[e], mask)
            warp_t = T.alloc_shared((warps, width), F32)
            if tx % 32 < lanes:
                for e in T.unroll(vec):
                    warp_t[tx // 32, lane * vec + e] = acc[e]
            T.sync_threads()
            t_slab = T.alloc_shared((width,), F32)
            total = T.alloc_local((1,), F32)
            total[0] = 0.0
            if tx < width:
                for k in T.serial(warps):
                    total[0] += warp_t[k, tx]
                t_slab[tx] = total[0]
            t_squared, warp_sums = T.alloc_local((1,), F32), T.alloc_shared((warps,), F32)
            block_sum(lambda: total[0] * total[0], t_squared, warp_sums, TSquares, b, tx)
            # 2. the slab's part of z = W t, every row: the rows read again (last read first), then the held
            t_share = T.alloc_local((vec,), F32)
            dots = T.alloc_local((max(in_flight, in_registers),), F32)  # a slot for each step visited at once
            for e in T.unroll(vec):
                t_share[e] = t_slab[lane * vec + e]
            visit_slab(lambda vectors, slot, at_row: slab_dot(vectors, slot, dots, t_share, ZPartials, b, at_row, lane),
                       lambda nth: first_streamed + streamed - 1 - nth, row_of, W, w, register_w, shared_w, column, tx)
            T.sync_grid()
            # 3. z over this block's rows (row r's partials summed by the threads r, r + chunk, ...)
            z_parts, z_rows = T.alloc_shared((summers, chunk), F32), T.alloc_shared((chunk,), F32)
            sum_chunk(ZPartials, z_parts, total, b, tx)
            if tx < chunk:
                z_rows[tx] = total[0]
            z_squared, z_squares = T.alloc_local((1,), F32), T.alloc_shared((warps,), F32)
            block_sum(lambda: total[0] * total[0], z_squared, z_squares, ZSquares, b, tx)
            T.sync_grid()
            # 4. the scalars, from every block's sums; u' (this block's rows), v' (its columns), W / sigma
            t_total, z_total = T.alloc_local((1,), F32), T.alloc_local((1,), F32)
            sum_of_blocks(TSquares, t_total, tx % 32)
            sum_of_blocks(ZSquares, z_total, tx % 32)
            nt, ns, inv_sigma = T.alloc_var(F32), T.alloc_var(F32), T.alloc_var(F32)
            nt = T.max(T.sqrt(t_total[0]), eps)  # ||t||
            ns = T.sqrt(z_total[0]) / nt  # ||s||, s = z / nt
            inv_sigma = T.max(ns, eps) / (ns * ns)
            if tx < chunk:
                UOut[b * chunk + tx] = T.Cast(dt, z_rows[tx] / nt / T.max(ns, eps))
            if tx < width:
                VOut[b * width + tx] = T.Cast(dt, t_slab[tx] / nt)
            out = T.alloc_local((vec,), dt)
            visit_slab(lambda vectors, slot, at_row: scaled_store(vectors, slot, out, inv_sigma, Out, at_row, column),
                       lambda nth: first_streamed + nth, row_of, W, w, register_w, shared_w, column, tx)

    return main


def _outputs_like(weight, u, v):
    """W / sigma, u' and v', each like its input."""
    return torch.empty_like(weight), torch.empty_like(u), torch.empty_like(v)


def build_power_iteration(shape: tuple[int, int], dtype: torch.dtype, eps: float, device: torch.device,
                          threads: int | None = None, row_chunks: int | None = None,
                          cluster: int | None = None, pdl: bool | None = None, cooperative: bool = False,
                          column_slabs: bool = False, register_steps: int = 0) -> Callable:
    """fn(weight, u, v) -> (weight / sigma, u', v'); v is not read (v' depends on W and u only).
    ``threads``, ``row_chunks``, ``cluster``, ``pdl``, ``cooperative``, ``column_slabs`` and
    ``register_steps``: a launch configuration from :func:`launch_variants` (by default its first
    that the device's SMs take)."""
    rows, cols = shape
    dt = tilelang_dtype(dtype)
    # A cooperative launch needs every block resident: at most the device's SMs.
    sms = multiprocessors(device)
    if threads is None:
        default = next(v for v in launch_variants(rows, cols, dtype)
                       if not v.get("column_slabs") or column_slabs_fit(rows, cols, dtype.itemsize, v["threads"], sms))
        threads, cluster = default["threads"], default.get("cluster", 1)
        pdl = default.get("pdl", False) if pdl is None else pdl
        cooperative = default.get("cooperative", False)
        column_slabs, register_steps = default.get("column_slabs", False), default.get("register_steps", 0)
    cluster, pdl = cluster or 1, bool(pdl)
    if column_slabs:
        if not column_slabs_fit(rows, cols, dtype.itemsize, threads, sms):
            raise ValueError(f"column slabs cannot split W [{rows}, {cols}] of {dtype} over {sms} SMs at {threads} threads; "
                             f"these shapes can: {[v for v in launch_variants(rows, cols, dtype) if v.get('column_slabs')]}")
        blocks = column_slab_blocks(rows, cols, dtype.itemsize, sms)
        kernel = compile_kernel(_column_slabs(rows, cols, dt, dtype.itemsize, eps, threads, blocks, register_steps))

        def power_iteration_column_slabs(weight, u, v):
            f32 = dict(dtype=torch.float32, device=weight.device)
            z_partials, t_squares, z_squares = (torch.empty((blocks, rows), **f32), torch.empty(blocks, **f32),
                                                torch.empty(blocks, **f32))
            out, u_out, v_out = _outputs_like(weight, u, v)
            kernel(weight, u, out, u_out, v_out, z_partials, t_squares, z_squares)
            return out, u_out, v_out

        power_iteration_column_slabs.config = {"kernels": 1, "threads": threads, "column_slabs": True, "blocks": blocks,
                                               "register_steps": register_steps}
        return power_iteration_column_slabs
    if cooperative:
        blocks = cooperative_blocks(rows, cols, sms)
        kernel = compile_kernel(_cooperative(rows, cols, dt, dtype.itemsize, eps, threads, blocks))

        def power_iteration_cooperative(weight, u, v):
            f32 = dict(dtype=torch.float32, device=weight.device)
            p, t, squares, z, z_squares = (torch.empty((blocks, cols), **f32), torch.empty(cols, **f32),
                                           torch.empty(blocks, **f32), torch.empty(rows, **f32),
                                           torch.empty(blocks, **f32))
            out, u_out, v_out = _outputs_like(weight, u, v)
            kernel(weight, u, out, u_out, v_out, p, t, squares, z, z_squares)
            return out, u_out, v_out

        power_iteration_cooperative.config = {"kernels": 1, "threads": threads, "cooperative": True, "blocks": blocks}
        return power_iteration_cooperative
    if rows == 1:
        kernel = compile_kernel(_single_row(cols, dt, dtype.itemsize, eps, threads, cluster))

        def one_row(weight, u, v):
            out, u_out, v_out = _outputs_like(weight, u, v)
            kernel(weight, u, out, u_out, v_out)
            return out, u_out, v_out

        one_row.config = {"kernels": 1, "threads": threads, "cluster": cluster}
        return one_row

    row_chunks = row_chunks or default_row_chunks(rows, cols)
    partials, sum_partials, row_dots, finish, scale = (
        compile_kernel(_column_partials(rows, cols, dt, row_chunks, pdl)),
        compile_kernel(_sum_partials(cols, row_chunks, pdl)), compile_kernel(_row_dots(rows, cols, dt, threads, pdl)),
        compile_kernel(_finish(rows, cols, dt, eps, pdl)), compile_kernel(_scale(rows, cols, dt, threads, pdl)))

    def power_iteration(weight, u, v):
        f32 = dict(dtype=torch.float32, device=weight.device)
        p, t, squares, z, sigma = (torch.empty((row_chunks, cols), **f32), torch.empty(cols, **f32),
                                   torch.empty(cols // SUM_TILE, **f32), torch.empty(rows, **f32),
                                   torch.empty(1, **f32))
        out, u_out, v_out = _outputs_like(weight, u, v)
        partials(weight, u, p)
        sum_partials(p, t, squares)
        row_dots(weight, t, z)
        finish(z, t, squares, u_out, v_out, sigma)
        scale(weight, sigma, out)
        return out, u_out, v_out

    power_iteration.config = {"kernels": 5, "threads": threads, "column_tile": COLUMN_TILE, "row_chunks": row_chunks,
                              "row_unroll": ROW_UNROLL, "pdl": pdl}
    return power_iteration
