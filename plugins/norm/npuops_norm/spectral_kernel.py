"""TileLang kernels for one spectral-norm power iteration (SpectralNormPowerIterFwd).

W [R, C] is read three times — nothing less is possible: v' needs all of Wᵀu before W v' can
start, and W / sigma needs all of W v' — and written once. Five launches, all f32 inside:

1. column partials  P[k, c] = Σ_{r in row chunk k} W[r, c] u[r]   (grid: column tiles × row chunks)
2. v' = t / max(||t||, eps), t = Σ_k P[k, :]                       (one block)
3. s = W v'                                                        (one block per row)
4. u' = s / max(||s||, eps), sigma = u'·s                           (one block)
5. out = W / sigma                                                 (one block per row)

A single row (R == 1, the decode workloads) is one block doing all of it in registers.

Launch variants (``npuops run --tune``): threads of the per-row kernels (3, 5 and the single row)
and row chunks of the column partials; the default comes first. The row kernels' sweep found
1024-thread blocks 40-80% slower than ~32 elements per thread there; whether that holds here is
for a tuning run to say.

TileLang is imported when a kernel is built. (No ``from __future__ import annotations`` here:
TileLang evaluates the prim_funcs' tensor annotations, which must see the enclosing shapes.)
"""


from collections.abc import Callable

import torch
from npuops.kernels import compile_kernel, tilelang_dtype

F32 = "float32"
COLUMN_TILE = 2048  # columns per block of the column-partial kernel (256 threads x 8)
ROW_CHUNKS = 16  # row chunks of the column partials: 8 x 16 blocks for 16384 columns
THREADS = 1024  # threads of the one-block kernels (2, 4) and the default of the per-row ones


def unsupported(rows: int, cols: int) -> str | None:
    """Why these kernels cannot take W [rows, cols]: each block's share must split evenly."""
    if cols % THREADS or (rows > 1 and cols % COLUMN_TILE):
        return f"the spectral-norm kernels need columns divisible by {THREADS if rows == 1 else COLUMN_TILE}, got {cols}"
    if rows > 1 and rows % THREADS:
        return f"the spectral-norm kernels need one row or a multiple of {THREADS} rows, got {rows}"
    return None


def launch_variants(rows: int, cols: int) -> list[dict[str, int]]:
    """Launch configurations ``npuops run --tune`` chooses among, the default first."""
    if rows == 1:
        return [{"threads": t} for t in (THREADS, THREADS // 2, THREADS // 4)]
    return [{"threads": t, "row_chunks": k} for t, k in ((THREADS, ROW_CHUNKS), (THREADS // 2, ROW_CHUNKS),
                                                          (THREADS // 4, ROW_CHUNKS), (THREADS // 4, ROW_CHUNKS * 4))]


def _single_row(cols: int, dt: str, eps: float, threads: int = THREADS):
    import tilelang.language as T

    @T.prim_func
    def main(W: T.Tensor((1, cols), dt), U: T.Tensor((1,), dt), Out: T.Tensor((1, cols), dt),
             UOut: T.Tensor((1,), dt), VOut: T.Tensor((cols,), dt)):
        with T.Kernel(1, threads=threads) as _:
            w = T.alloc_fragment((cols,), F32)
            t = T.alloc_fragment((cols,), F32)
            total = T.alloc_fragment((1,), F32)
            for c in T.Parallel(cols):
                w[c] = T.Cast(F32, W[0, c])
                t[c] = w[c] * T.Cast(F32, U[0]) * w[c] * T.Cast(F32, U[0])
            T.reduce_sum(t, total, dim=0)  # ||Wᵀu||²
            for c in T.Parallel(cols):
                t[c] = w[c] * T.Cast(F32, U[0]) / T.max(T.sqrt(total[0]), eps)  # v'
                VOut[c] = T.Cast(dt, t[c])
            for c in T.Parallel(cols):
                t[c] = w[c] * t[c]
            T.reduce_sum(t, total, dim=0)  # s = w·v'
            # u' = s / max(|s|, eps) and sigma = u' s
            for c in T.Parallel(cols):
                Out[0, c] = T.Cast(dt, w[c] / (total[0] / T.max(T.abs(total[0]), eps) * total[0]))
            UOut[0] = T.Cast(dt, total[0] / T.max(T.abs(total[0]), eps))

    return main


def _column_partials(rows: int, cols: int, dt: str, row_chunks: int = ROW_CHUNKS):
    import tilelang.language as T

    chunk = rows // row_chunks

    @T.prim_func
    def main(W: T.Tensor((rows, cols), dt), U: T.Tensor((rows,), dt), P: T.Tensor((row_chunks, cols), F32)):
        with T.Kernel(cols // COLUMN_TILE, row_chunks, threads=COLUMN_TILE // 8) as (bc, k):
            acc = T.alloc_fragment((COLUMN_TILE,), F32)
            T.clear(acc)
            for r in T.serial(chunk):
                for c in T.Parallel(COLUMN_TILE):
                    acc[c] += T.Cast(F32, W[k * chunk + r, bc * COLUMN_TILE + c]) * T.Cast(F32, U[k * chunk + r])
            for c in T.Parallel(COLUMN_TILE):
                P[k, bc * COLUMN_TILE + c] = acc[c]

    return main


def _normalize_v(cols: int, dt: str, eps: float, row_chunks: int = ROW_CHUNKS):
    import tilelang.language as T

    @T.prim_func
    def main(P: T.Tensor((row_chunks, cols), F32), V: T.Tensor((cols,), F32), VOut: T.Tensor((cols,), dt)):
        with T.Kernel(1, threads=THREADS) as _:
            t = T.alloc_fragment((cols,), F32)
            sq = T.alloc_fragment((cols,), F32)
            total = T.alloc_fragment((1,), F32)
            T.clear(t)
            for k in T.serial(row_chunks):
                for c in T.Parallel(cols):
                    t[c] += P[k, c]
            for c in T.Parallel(cols):
                sq[c] = t[c] * t[c]
            T.reduce_sum(sq, total, dim=0)
            for c in T.Parallel(cols):
                V[c] = t[c] / T.max(T.sqrt(total[0]), eps)
                VOut[c] = T.Cast(dt, t[c] / T.max(T.sqrt(total[0]), eps))

    return main


def _row_dots(rows: int, cols: int, dt: str, threads: int = THREADS):
    import tilelang.language as T

    @T.prim_func
    def main(W: T.Tensor((rows, cols), dt), V: T.Tensor((cols,), F32), S: T.Tensor((rows,), F32)):
        with T.Kernel(rows, threads=threads) as r:
            prod = T.alloc_fragment((cols,), F32)
            total = T.alloc_fragment((1,), F32)
            for c in T.Parallel(cols):
                prod[c] = T.Cast(F32, W[r, c]) * V[c]
            T.reduce_sum(prod, total, dim=0)
            S[r] = total[0]

    return main


def _normalize_u(rows: int, dt: str, eps: float):
    import tilelang.language as T

    @T.prim_func
    def main(S: T.Tensor((rows,), F32), UOut: T.Tensor((rows,), dt), Sigma: T.Tensor((1,), F32)):
        with T.Kernel(1, threads=THREADS) as _:
            s = T.alloc_fragment((rows,), F32)
            sq = T.alloc_fragment((rows,), F32)
            total = T.alloc_fragment((1,), F32)
            for r in T.Parallel(rows):
                s[r] = S[r]
                sq[r] = s[r] * s[r]
            T.reduce_sum(sq, total, dim=0)
            for r in T.Parallel(rows):
                UOut[r] = T.Cast(dt, s[r] / T.max(T.sqrt(total[0]), eps))
            # sigma = u'·s = ||s||² / max(||s||, eps)
            Sigma[0] = total[0] / T.max(T.sqrt(total[0]), eps)

    return main


def _scale(rows: int, cols: int, dt: str, threads: int = THREADS):
    import tilelang.language as T

    @T.prim_func
    def main(W: T.Tensor((rows, cols), dt), Sigma: T.Tensor((1,), F32), Out: T.Tensor((rows, cols), dt)):
        with T.Kernel(rows, threads=threads) as r:
            for c in T.Parallel(cols):
                Out[r, c] = T.Cast(dt, T.Cast(F32, W[r, c]) / Sigma[0])

    return main


def build_power_iteration(shape: tuple[int, int], dtype: torch.dtype, eps: float, device: torch.device,
                          threads: int = THREADS, row_chunks: int = ROW_CHUNKS) -> Callable:
    """fn(weight, u, v) -> (weight / sigma, u', v'); v is not read (v' depends on W and u only).
    ``threads`` and ``row_chunks``: a launch configuration from :func:`launch_variants`."""
    rows, cols = shape
    dt = tilelang_dtype(dtype)
    if rows == 1:
        kernel = compile_kernel(_single_row(cols, dt, eps, threads))

        def one_row(weight, u, v):
            out = torch.empty_like(weight)
            u_out, v_out = torch.empty_like(u), torch.empty_like(v)
            kernel(weight, u, out, u_out, v_out)
            return out, u_out, v_out

        one_row.config = {"kernels": 1, "threads": threads}
        return one_row

    partials, normalize_v, row_dots, normalize_u, scale = (
        compile_kernel(_column_partials(rows, cols, dt, row_chunks)), compile_kernel(_normalize_v(cols, dt, eps, row_chunks)),
        compile_kernel(_row_dots(rows, cols, dt, threads)), compile_kernel(_normalize_u(rows, dt, eps)),
        compile_kernel(_scale(rows, cols, dt, threads)))

    def power_iteration(weight, u, v):
        f32 = dict(dtype=torch.float32, device=weight.device)
        p, v_f32, s, sigma = (torch.empty((row_chunks, cols), **f32), torch.empty(cols, **f32),
                              torch.empty(rows, **f32), torch.empty(1, **f32))
        out, u_out, v_out = torch.empty_like(weight), torch.empty_like(u), torch.empty_like(v)
        partials(weight, u, p)
        normalize_v(p, v_f32, v_out)
        row_dots(weight, v_f32, s)
        normalize_u(s, u_out, sigma)
        scale(weight, sigma, out)
        return out, u_out, v_out

    power_iteration.config = {"kernels": 5, "threads": threads, "column_tile": COLUMN_TILE, "row_chunks": row_chunks}
    return power_iteration
