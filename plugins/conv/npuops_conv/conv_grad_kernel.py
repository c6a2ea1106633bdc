"""The TileLang kernels of the convolution gradients: one spec module, a few named kernels.

Every kernel is described by the *forward* convolution it differentiates or transposes (a
:class:`ConvGeometry`, in the kernels' terms a :class:`conv_kernel.Problem`), channels-last
throughout as the forward kernels: ``x`` [N, *in_size, C_in], ``w`` [C_out, *kernel, Cg] (Cg =
C_in / groups, Og = C_out / groups), ``dy`` [N, *out_size, C_out]; 1-d and 2-d are 3-d with
leading spatial dims of 1, which the index arithmetic folds away.

Data gradient (:func:`dgrad_kernel`; Conv2dDgrad's grad_input and Conv2dTranspose's output, which
is the same computation plus an optional bias over C_in): ``dx[n, i, g*Cg + c] = sum over taps t,
co < Og of dy[n, o(i, t), g*Og + co] * w[g*Og + co, t, c]`` over the taps whose window hits ``i``.

*Stride phases* (no zero insertion, no product with an inserted zero). Per spatial dim of stride
``s``, dilation ``d``, padding ``p``: input row ``i`` is read by output row ``o`` through tap ``k``
iff ``o*s = i + p - k*d``. Rows of one phase ``r = (i + p) mod s`` are hit exactly by the taps with
``k*d = r (mod s)``: with ``g = gcd(s, d)`` these are ``k = first[r] + step*u``, ``step = s/g``,
``u < count[r]`` (none where ``g`` does not divide ``r``: those rows get zeros). Numbering a
phase's rows ``i = i0[r] + s*j`` (``i0[r] = (r - p) mod s``, ``j < q = ceil(size/s)``), the
output row is ``o = j + base[r] - u*(d/g)`` with ``base[r] = (i0[r] + p - first[r]*d) / s``
(exact): every term a build-time constant per phase, the row ``j`` dense. So each phase is a dense
implicit GEMM: ``M = N * q_d*q_h*q_w`` rows (the same for every phase; rows with ``i >= size`` are
masked, at most one per dim and phase), ``N_gemm = Cg``, ``K = taps_in_phase * Og`` ordered
(phase tap, co): a K tile lies in one tap (``tiles_per_tap = ceil(Og/block_K)``), so the A tile
(``dy`` rows, the tile's ``co`` contiguous) is one predicated row gather and the B tile is the
rectangle ``w2d[g*Og + co0 : +block_K, tap*Cg + c0 : +block_N]`` of the weight viewed
``[C_out, taps*Cg]``: one ``T.copy`` (its bounds checks zero-fill past C_out / past taps*Cg; rows
or columns that spill into the next group or tap meet zero A elements or reach output columns that
are not written). Phases are the grid's third dim (phase-major, then group, then split); a block
runs its phase's K tiles (a loop extent chosen per block where the phases' tap counts differ). At
stride 1 there is one phase with every tap, ``base = p``: ``o = i + p - k*d`` (the flipped kernel
is only index arithmetic). Padding, dilation, groups and Conv2dTranspose's ``output_padding``
(rows past the last window: ``o >= out`` masked, zero) are index arithmetic. fp32 accumulation,
the epilogue adds the transpose's bias and casts to the op's dtype. A channels-first output
(``output_layout``: ``dx`` [N, C_in, prod(in_size)], what torch's conv_transpose2d returns for
NCHW-contiguous tensors) is written as the forward kernels' is (``conv_kernel.ChannelsFirst``: the
tile staged in shared memory, stored down its columns), each phase row to its input position.

Split-K (stride 1, one group; few output tiles against a deep K such as Conv2dTranspose W7,
K = 9 * 2048): the grid's third dim is the split; split ``s`` writes its fp32 partial tile to a
workspace ``[splits, rows, C_in]`` and a second kernel of the same prim_func sums the partials in
index order 0..splits-1 and applies the epilogue: the bits do not depend on block scheduling.

Direct data gradient (depthwise, thin groups, Cg or Og below 16): a block of ``block_M`` phase rows x
``block_N`` input channels, serial loops over the phase's taps and the group's Og output
channels, masked loads through the same phase arithmetic (so the CPU-target test of this kernel
checks it).

Weight gradient (:func:`wgrad_kernel`): ``dw[g*Og + co, t*Cg + c] = sum over positions P of
dy[P, g*Og + co] * x[src(P, t), g*Cg + c]``, a GEMM with ``M = Og``, ``N = taps*Cg``, ``K = N *
prod(out_size)`` positions (often huge). The A tile is ``dy[k0 : +block_K, co0 : +block_M]``
(one ``T.copy``, used transposed: ``T.gemm(..., transpose_A=True)``), the B tile the im2col gather
of the forward kernel's window arithmetic (``conv_kernel._source``; one tap per tile where Cg is a
multiple of block_N). The K range is split over ``splits`` blocks per output tile; each writes an
fp32 partial to a workspace ``[splits, C_out, taps*Cg]`` and a reduction kernel sums them in index
order (no atomics: the same bits run to run). Direct weight gradient (depthwise / thin groups):
a block of ``block_M`` weight elements (ordered tap, co, c, so consecutive threads read
consecutive channels) x one of ``splits`` position ranges, each thread summing its positions in
order into a workspace, then the same ordered reduction. The bias gradient (where the workload
has one) is ``db[c] = sum over positions of dy[P, c]``: a kernel of per-(range, row-slot) fp32
partial column sums ``[ranges * rows, C_out]``, each thread summing its rows in order, then an
ordered sum per channel.

TileLang is imported when a kernel is built (no ``from __future__ import annotations``: TileLang
evaluates the prim_funcs' parameter annotations).
"""

import dataclasses
import math
from dataclasses import dataclass
from functools import cached_property, partial

import torch
from npuops import KernelSpec, in_order, multiprocessors, tilelang_dtype

from .conv_kernel import (ChannelsFirst, ConvLaunch, Problem, _all, _div, _mod, _source, box_position, channel_block,
                          gemm_variants, is_one, no_empty_split, ordered_sum, prim_func_over, staged_store,
                          staging_columns, store_partials, tile_allocator, tile_product, too_large, zero_fill)
from .layouts import CHANNELS_LAST
from .ops._geometry import ConvGeometry
from .tuned import DGRAD, DGRAD_BIAS, WGRAD, tuned_launch

F32 = "float32"
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MIN_GEMM = 16  # channels (per group) below which a GEMM side is mostly padding: the direct kernels
DIRECT_THREADS = 256
DGRAD_SPLIT_MIN_TILES = 32  # K tiles before the data gradient's default splits K
SPLIT_TILES_PER_SPLIT = 8  # ... at least this many each split keeps
DGRAD_MAX_SPLITS = 16
WGRAD_MIN_TILES_PER_SPLIT = 4  # a weight-gradient split keeps at least 4 K tiles (256 positions at 64)
WGRAD_MAX_SPLITS = 64
BIAS_COLUMNS = 128  # channels a bias-gradient block sums
BIAS_ROWS = 8  # ... rows at a time (its fp32 partials: BIAS_ROWS per range and channel)


def wgrad_target_blocks() -> int:
    """The blocks weight-gradient splits aim at: about two waves on the GPU."""
    return 2 * multiprocessors()


def unsupported(geometry: ConvGeometry, dtype: torch.dtype) -> str | None:
    """Why no gradient kernel here takes this convolution (None: one does)."""
    if dtype not in DTYPES:
        return f"the TileLang conv gradient kernels take fp16, bf16 and fp32 inputs, not {dtype}"
    return too_large(geometry)


# -- the stride phases ---------------------------------------------------------------------------

@dataclass(frozen=True)
class DimPhases:
    """One spatial dim's stride phases (see the module docstring): per phase ``r`` the first phase
    row ``i0``, the taps ``first + step*u`` (``u < count``) and ``base``; the output row of phase
    row ``j`` through tap ``u`` is ``j + base - u*delta``. ``q``: rows per phase."""

    size: int
    out: int
    kernel: int
    stride: int
    pad: int
    dilation: int

    @cached_property
    def step(self) -> int:
        return self.stride // math.gcd(self.stride, self.dilation)

    @cached_property
    def delta(self) -> int:
        return self.dilation // math.gcd(self.stride, self.dilation)

    @property
    def q(self) -> int:
        return -(-self.size // self.stride)

    @cached_property
    def taps(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(k for k in range(self.kernel) if k * self.dilation % self.stride == r)
                     for r in range(self.stride))

    @property
    def count(self) -> tuple[int, ...]:
        return tuple(len(t) for t in self.taps)

    @property
    def first(self) -> tuple[int, ...]:
        return tuple(t[0] if t else 0 for t in self.taps)

    @property
    def i0(self) -> tuple[int, ...]:
        return tuple((r - self.pad) % self.stride for r in range(self.stride))

    @property
    def base(self) -> tuple[int, ...]:
        bases = []
        for r in range(self.stride):
            top = self.i0[r] + self.pad - self.first[r] * self.dilation
            assert not self.taps[r] or top % self.stride == 0
            bases.append(top // self.stride)
        return tuple(bases)

    @property
    def row_check(self) -> bool:
        """Whether a phase row can fall past the input (``i0 + s*(q-1) >= size``)."""
        return any(i0 + self.stride * (self.q - 1) >= self.size for i0 in self.i0)

    @property
    def low_check(self) -> bool:
        """Whether an output row can fall below 0."""
        return any(self.base[r] - (self.count[r] - 1) * self.delta < 0 for r in range(self.stride) if self.count[r])

    @property
    def high_check(self) -> bool:
        """Whether an output row can fall past the output (rows past the last window)."""
        return any(self.q - 1 + self.base[r] > self.out - 1 for r in range(self.stride) if self.count[r])


@dataclass(frozen=True)
class Grad:
    """A convolution gradient in the kernels' terms: the forward problem, its dims' phases; the data
    gradient's output layout (``CHANNELS_LAST`` or ``CHANNELS_FIRST``, see :func:`dgrad_kernel`)."""

    problem: Problem
    bias: bool = False  # Conv2dTranspose's bias (C_in), or Conv2dWgrad's bias gradient (C_out)
    output_layout: str = CHANNELS_LAST

    @property
    def geometry(self) -> ConvGeometry:
        return self.problem.geometry

    @property
    def dtype(self) -> torch.dtype:
        return self.problem.dtype

    @cached_property
    def dims(self) -> tuple[DimPhases, ...]:
        p = self.problem
        return tuple(DimPhases(*v) for v in zip(p.in3, p.out3, p.kernel3, p.stride3, p.pad3, p.dilation3, strict=True))

    @property
    def phases(self) -> int:
        return math.prod(d.stride for d in self.dims)

    @property
    def rows(self) -> int:
        """Rows of each phase's GEMM (N * q_d * q_h * q_w)."""
        return self.geometry.batch * math.prod(d.q for d in self.dims)

    @property
    def channels_first(self) -> ChannelsFirst | None:
        """How the data gradient writes a channels-first output ``[N, C_in, prod(in_size)]``; None
        for a channels-last one."""
        if self.output_layout == CHANNELS_LAST:
            return None
        return ChannelsFirst(math.prod(self.geometry.in_size), self.dtype)

    @property
    def max_taps(self) -> int:
        return math.prod(max(d.count) for d in self.dims)

    @property
    def positions(self) -> int:
        """The weight gradient's K: output positions N * prod(out_size)."""
        return self.problem.m


# -- launch rules ----------------------------------------------------------------------------------

def _block_K(dtype: torch.dtype, per_tap: int) -> int:
    """K tile: 128 bytes of a row where ``per_tap`` allows, else the widest of 64 / 32 bytes dividing it,
    else a full 128-byte row (the tail masked)."""
    row = 128 // dtype.itemsize
    smallest = max(32 // dtype.itemsize, 8)
    for block_K in (row, row // 2, row // 4):
        if block_K >= smallest and per_tap % block_K == 0:
            return block_K
    return row if per_tap >= row else max(smallest, row // 2)


def _n_tile(columns: int) -> int:
    return 32 if columns <= 32 else 64 if columns <= 64 else 128


def dgrad_default(q: Grad) -> ConvLaunch:
    """Direct where a GEMM side is thin (Cg or Og < 16: depthwise, thin groups, 3-channel stems),
    else the phase GEMM with the forward rules' tiles; split-K where there is one phase and group
    and few output tiles face a deep K."""
    p, g = q.problem, q.geometry
    if p.cg < MIN_GEMM or p.og < MIN_GEMM:
        return _direct(g.in_channels)
    return _dgrad_gemm_launch(q)


def _dgrad_gemm_launch(q: Grad) -> ConvLaunch:
    """The phase GEMM's launch (see :func:`dgrad_default`)."""
    p, g = q.problem, q.geometry
    block_K = _block_K(q.dtype, p.og)
    block_N = _n_tile(p.cg)
    tiles = lambda bM, bN: -(-q.rows // bM) * -(-p.cg // bN) * g.groups * q.phases
    # Never 128 x 256: the gathered operand's producer threads cap a thread at 128 registers, all
    # of them that tile's accumulator (ptxas: ~770 bytes spilled, wgmma serialized).
    sms = multiprocessors()
    if tiles(128, block_N) >= sms:
        block_M, stages = 128, 3
    else:
        block_M, stages = 64, 4
    threads = 256 if block_M * block_N >= 64 * 128 else 128
    k_tiles = q.max_taps * -(-p.og // block_K)
    splits = 1
    count = tiles(block_M, block_N)
    if q.phases == 1 and g.groups == 1 and k_tiles >= DGRAD_SPLIT_MIN_TILES and count < sms // 2:
        splits = min(k_tiles // SPLIT_TILES_PER_SPLIT, -(-sms // count), DGRAD_MAX_SPLITS)
        splits = no_empty_split(k_tiles, splits)
    per_split = -(-k_tiles // splits)
    return ConvLaunch("split_k" if splits > 1 else "gemm", block_M, block_N, block_K,
                      max(1, min(stages, per_split)), threads, splits)


def chosen_dgrad(q: Grad) -> ConvLaunch:
    """The launch a plain run takes: the one tuning chose for this problem (``tuned_launches.json``,
    see :mod:`npuops_conv.tuned`), else the rule's."""
    return tuned_launch(q.geometry, q.dtype, kind=DGRAD_BIAS if q.bias else DGRAD) or dgrad_default(q)


def chosen_wgrad(q: Grad) -> ConvLaunch:
    """As :func:`chosen_dgrad`, for the weight gradient."""
    return tuned_launch(q.geometry, q.dtype, kind=WGRAD) or wgrad_default(q)


def _direct(channels: int, outputs: int = 1024, threads: int = DIRECT_THREADS) -> ConvLaunch:
    block_N = channel_block(channels, 64)
    return ConvLaunch("direct", max(1, outputs // block_N), block_N, 0, 0, threads, 1)


def dgrad_variants(q: Grad) -> list[dict]:
    first = dgrad_default(q)
    variants = [first]
    p = q.problem
    if first.kernel == "direct":
        variants += [_direct(q.geometry.in_channels, outputs=512), _direct(q.geometry.in_channels, threads=128)]
        if p.og >= MIN_GEMM:
            # Only the input channels thin (a 3-channel stem): the direct kernel reads each dy row
            # once an input channel, the GEMM once, its N tile mostly padding (stem W28/W29 ran
            # 0.18x of cuDNN direct on the H200).
            variants.append(_dgrad_gemm_launch(q))
    else:
        k_tiles = q.max_taps * -(-p.og // first.block_K)
        variants += gemm_variants(first.block_K, k_tiles, wide=p.cg >= 256,
                                  splittable=q.phases == 1 and q.geometry.groups == 1)
    return [v.as_dict() for v in dict.fromkeys([chosen_dgrad(q), *variants])]  # the tuned launch first


def wgrad_default(q: Grad) -> ConvLaunch:
    """Direct where Og or taps*Cg is below 16 (depthwise, thin groups), else the GEMM (Og rows,
    taps*Cg columns) with its positions split so that about two waves of blocks run."""
    p = q.problem
    columns = p.taps * p.cg
    if p.og < MIN_GEMM or columns < MIN_GEMM:
        return wgrad_direct_launch(q)
    block_M = 64 if p.og <= 64 else 128
    # An accumulator of at most 64 fp32 a consumer thread: 128 x 256 spills (see dgrad_default).
    widest = 256 if block_M == 64 else 128
    if p.cg % 64 == 0:  # the aligned form: an N tile inside one tap, whole-vector loads
        block_N = max(b for b in (256, 128, 64) if b <= widest and p.cg % b == 0)
    else:
        block_N = _n_tile(columns) if columns <= 128 else 128
    block_K = 128 // q.dtype.itemsize
    launch = _with_splits(q, block_M, block_N, block_K, 3, _threads(block_M, block_N))
    # Few weight tiles and positions too few to split further (a 7x7 map's 196, a 64-channel layer's
    # weights): smaller tiles until a wave of blocks runs, 64 rows first, then narrower columns.
    sms = multiprocessors()
    while launch.splits * _wgrad_tiles(q, launch.block_M, launch.block_N) < sms and launch.block_N > 32:
        block_M, block_N = (64, launch.block_N) if launch.block_M > 64 else (64, launch.block_N // 2)
        launch = _with_splits(q, block_M, block_N, block_K, 3, _threads(block_M, block_N))
    return launch


def _threads(block_M: int, block_N: int) -> int:
    return 256 if block_M * block_N >= 64 * 128 else 128


def _wgrad_tiles(q: Grad, block_M: int, block_N: int) -> int:
    p = q.problem
    return -(-p.og // block_M) * -(-(p.taps * p.cg) // block_N) * q.geometry.groups


def _with_splits(q: Grad, block_M, block_N, block_K, stages, threads, splits=None) -> ConvLaunch:
    k_tiles = -(-q.positions // block_K)
    if splits is None:
        tiles = _wgrad_tiles(q, block_M, block_N)
        splits = max(1, min(wgrad_target_blocks() // tiles, k_tiles // WGRAD_MIN_TILES_PER_SPLIT, WGRAD_MAX_SPLITS))
    splits = no_empty_split(k_tiles, max(1, min(splits, k_tiles)))
    per_split = -(-k_tiles // splits)
    return ConvLaunch("split_k" if splits > 1 else "gemm", block_M, block_N, block_K, max(1, min(stages, per_split)),
                      threads, splits)


def wgrad_direct_launch(q: Grad, outputs: int = 256, threads: int = 256) -> ConvLaunch:
    """``outputs`` weight elements a block, the positions split so that about two waves run (each
    range at least 16 positions)."""
    p = q.problem
    elements = q.geometry.out_channels * p.taps * p.cg
    blocks = -(-elements // outputs)
    splits = max(1, min(wgrad_target_blocks() // blocks, q.positions // 16, 1024))
    splits = no_empty_split(q.positions, splits)
    return ConvLaunch("direct", outputs, 1, 0, 0, threads, splits)


def wgrad_variants(q: Grad) -> list[dict]:
    first = wgrad_default(q)
    variants = [first]
    if first.kernel == "direct":
        # Its threads walk their position range serially, a load's latency a step: shorter ranges
        # (8 positions) too, for the few-element layers that ran latency-bound (depthwise Conv2dWgrad
        # W14: 0.28x of cuDNN on the H200, 24 positions a thread).
        variants += [wgrad_direct_launch(q, outputs=128, threads=128),
                     dataclasses.replace(first, splits=no_empty_split(q.positions, max(1, first.splits // 2))),
                     dataclasses.replace(first, splits=no_empty_split(
                         q.positions, min(1024, max(first.splits * 2, q.positions // 8))))]
    else:
        bK = first.block_K
        for bM, bN, threads in ((128, 128, 256), (64, 128, 128), (64, 256, 256)):
            if bN <= 2 * _n_tile(q.problem.taps * q.problem.cg):
                variants.append(_with_splits(q, bM, bN, bK, 3, threads))
        variants.append(_with_splits(q, first.block_M, first.block_N, bK, 3, first.threads,
                                     splits=max(1, first.splits * 2)))
        variants.append(_with_splits(q, first.block_M, first.block_N, bK, 3, first.threads,
                                     splits=max(1, first.splits // 2)))
    return [v.as_dict() for v in dict.fromkeys([chosen_wgrad(q), *variants])]  # the tuned launch first


# -- index helpers (Python functions returning TIR expressions, called inside the kernels) ----------

def _pick(values, index):
    """``values[index]`` for a build-time tuple and a run-time ``index`` (a chain of int32 selects; a
    constant where the values agree or the index is one)."""
    import tilelang.language as T

    values = tuple(values)
    if isinstance(index, int):
        return values[index]
    if all(v == values[0] for v in values):
        return values[0]
    expr = T.int32(values[-1])
    for i in range(len(values) - 2, -1, -1):
        expr = T.if_then_else(index == i, T.int32(values[i]), expr)
    return expr


def _phase_of_dims(q: Grad, phase):
    """Per-dim phase indices of the flat ``phase`` (0 for stride-1 dims)."""
    sd, sh, sw = (d.stride for d in q.dims)
    return (_div(phase, sh * sw) if sd > 1 else 0, _mod(_div(phase, sw), sh) if sh > 1 else 0,
            _mod(phase, sw) if sw > 1 else 0)


def _counts(q: Grad, phase):
    return [_pick(d.count, r) for d, r in zip(q.dims, _phase_of_dims(q, phase), strict=True)]


def _phase_taps(q: Grad, phase):
    """Taps of ``phase`` (the product of its dims' counts)."""
    total = 1
    for c in _counts(q, phase):
        if not is_one(c):
            total = total * c
    return total


def _tap_of(q: Grad, phase, t):
    """(per-dim u, tap index in the weight) of the phase's local tap ``t`` (u_w fastest)."""
    rs = _phase_of_dims(q, phase)
    us = box_position(t, _counts(q, phase))
    ks = [_pick(d.first, r) + d.step * u for d, r, u in zip(q.dims, rs, us, strict=True)]
    _, kH, kW = q.problem.kernel3
    return us, (ks[0] * kH + ks[1]) * kW + ks[2]


def _phase_row(q: Grad, m):
    """(n, j_d, j_h, j_w) of phase-GEMM row ``m``."""
    qd, qh, qw = (d.q for d in q.dims)
    return m // (qd * qh * qw), _mod(m // (qh * qw), qd), _mod(m // qw, qh), m % qw if qw > 1 else 0


def _dx_row(q: Grad, m, phase, check_m: bool = True):
    """(inside, flat input row) of phase row ``m``: whether it is a row of the input."""
    n, *js = _phase_row(q, m)
    conditions = [m < q.rows] if check_m else []
    coordinates = []
    for d, r, j in zip(q.dims, _phase_of_dims(q, phase), js, strict=True):
        i = _pick(d.i0, r) + d.stride * j
        coordinates.append(i)
        if d.row_check:
            conditions.append(i < d.size)
    D, H, W = (d.size for d in q.dims)
    return _all(conditions), ((n * D + coordinates[0]) * H + coordinates[1]) * W + coordinates[2]


def _dy_row(q: Grad, m, phase, us, check_m: bool = True):
    """(inside, flat dy row) that phase row ``m`` reads through the tap of per-dim ``us``."""
    n, *js = _phase_row(q, m)
    conditions = [m < q.rows] if check_m else []
    coordinates = []
    for d, r, j, u in zip(q.dims, _phase_of_dims(q, phase), js, us, strict=True):
        o = j + _pick(d.base, r) - u * d.delta
        coordinates.append(o)
        if d.low_check:
            conditions.append(o >= 0)
        if d.high_check:
            conditions.append(o < d.out)
    OD, OH, OW = (d.out for d in q.dims)
    return _all(conditions), ((n * OD + coordinates[0]) * OH + coordinates[1]) * OW + coordinates[2]


# -- the data gradient -----------------------------------------------------------------------------

def dgrad_kernel(geometry: ConvGeometry, dtype: torch.dtype, bias: bool = False, names=("grad_output", "weight"),
                 kernel: str | None = None, output_layout: str = CHANNELS_LAST, **launch) -> KernelSpec:
    """The data gradient of the forward convolution ``geometry`` (Conv2dDgrad; Conv2dTranspose,
    with ``bias`` over C_in), the default launch's or the one named. Parameters: ``names[0]``
    (dy [N*prod(out_size), C_out]), ``names[1]`` (weight [C_out, taps*Cg]), ``bias`` [C_in] when
    ``bias``, ``output`` and for split-K ``workspace`` [splits, rows, C_in] fp32 (channels last in
    either output layout; not returned). ``output_layout``: ``CHANNELS_LAST``, the output
    [N*prod(in_size), C_in] returned as [N, *in_size, C_in]; or ``CHANNELS_FIRST``, [N, C_in,
    prod(in_size)] returned as [N, C_in, *in_size] (NC[D]HW-contiguous, written so by the
    epilogue, each phase row to its input position: no transposing pass)."""
    problem = unsupported(geometry, dtype)
    if problem:
        raise ValueError(problem)
    q = Grad(Problem(geometry, dtype), bias, output_layout)
    config = chosen_dgrad(q) if kernel is None else ConvLaunch(kernel, **launch)
    if config.kernel == "direct":
        return _dgrad_direct(q, config, names)
    if config.kernel in ("gemm", "split_k"):
        return _dgrad_gemm(q, config, names)
    raise ValueError(f"unknown conv gradient kernel {config.kernel!r}")


def _dgrad_params(q: Grad, config: ConvLaunch, names):
    g = q.geometry
    params = [(names[0], (q.problem.m, g.out_channels)), (names[1], (g.out_channels, q.problem.k))]
    dtypes = [q.dtype, q.dtype]
    if q.bias:
        params.append(("bias", (g.in_channels,)))
        dtypes.append(q.dtype)
    positions = math.prod(g.in_size)
    params.append(("output", (g.batch, g.in_channels, positions) if q.channels_first
                   else (q.problem.rows_in, g.in_channels)))
    dtypes.append(q.dtype)
    outputs = {"output": q.dtype}
    if config.kernel == "split_k":
        params.append(("workspace", (config.splits, q.problem.rows_in, g.in_channels)))
        dtypes.append(torch.float32)
        outputs["workspace"] = torch.float32
    returned = (g.batch, g.in_channels, *g.in_size) if q.channels_first else (g.batch, *g.in_size, g.in_channels)
    return tuple(params), dtypes, outputs, (("output", returned),)


def _dgrad_gemm(q: Grad, config: ConvLaunch, names, emulate_gemm: bool = False) -> KernelSpec:
    """The phase GEMM (``emulate_gemm``: T.gemm replaced by a scalar loop, for the CPU target)."""
    import tilelang.language as T

    p, g = q.problem, q.geometry
    dt = tilelang_dtype(q.dtype)
    bM, bN, bK, stages, threads, splits = (config.block_M, config.block_N, config.block_K, config.num_stages,
                                           config.threads, config.splits)
    Cg, Og, C_in, groups, phases, rows = p.cg, p.og, g.in_channels, g.groups, q.phases, q.rows
    per_tap = -(-Og // bK)
    k_tiles = q.max_taps * per_tap
    split = config.kernel == "split_k"
    if split and (groups != 1 or phases != 1):
        raise ValueError("the data gradient splits K at stride 1 with one group only")
    per_split = -(-k_tiles // splits)
    uniform = all(len(set(d.count)) == 1 for d in q.dims)  # every phase runs max_taps taps
    # Split-K runs at stride 1, where the phase rows are the input's: the sum stores them as they are.
    reduce = ordered_sum(splits, rows, C_in, lambda total, c, Bias, _, __: T.Cast(dt, _bias_add(q, total, c, Bias)),
                         q.channels_first)
    # Each phase row to its input position (rows past the input left out), in either layout: the
    # store's row_count is the phase.
    store = staged_store(bM, bN, q.channels_first, partial(_dx_row, q))
    # Split-K blocks stage fp32 partials for the channels-last workspace; the others, the output.
    staged_columns = staging_columns(bN, None if split else q.channels_first)

    _smem = tile_allocator(emulate_gemm)
    zero, product = zero_fill(emulate_gemm), tile_product(emulate_gemm)

    def _phase(bz):
        return bz // (groups * splits) if phases > 1 else 0

    def _group(bz):
        return bz // splits % groups if groups > 1 else 0

    def _k_tile(bz, ko):
        return bz % splits * per_split + ko if split else ko

    def _extent(bz):
        if split:
            return per_split
        return k_tiles if uniform else _phase_taps(q, _phase(bz)) * per_tap

    def _a(dY, m, bz, kt, kk):
        us, _ = _tap_of(q, _phase(bz), kt // per_tap)
        co = kt % per_tap * bK + kk
        inside, row = _dy_row(q, m, _phase(bz), us)
        extra = [co < Og] if Og % bK else []
        if split and per_split * splits > k_tiles:
            extra.append(kt < k_tiles)
        return T.if_then_else(_all([inside, *extra]), dY[row, _group(bz) * Og + co], 0)

    def _b_row(bz, kt):
        return _group(bz) * Og + kt % per_tap * bK

    def _b_col(bz, kt, bx):
        return _tap_of(q, _phase(bz), kt // per_tap)[1] * Cg + bx * bN

    # Input channels fewer than a GEMM side wants (a 3-channel stem): a B tile row may span several
    # taps' columns, which T.copy does not build for (sm_90a codegen fails on its partial vectors),
    # so it is gathered, the other taps' columns (and K tiles past the last) read as zeros.
    thin = Cg < MIN_GEMM

    def _b(Wt, bz, kt, bx, kk, j):
        inside = [bx * bN + j < Cg, *([kt % per_tap * bK + kk < Og] if Og % bK else []),
                  *([kt < k_tiles] if split and per_split * splits > k_tiles else [])]
        return T.if_then_else(_all(inside), Wt[_b_row(bz, kt) + kk, _b_col(bz, kt, bx) + j], 0)

    @T.macro
    def body(dY, Wt, Bias, Y, Work):
        with T.Kernel(T.ceildiv(Cg, bN), T.ceildiv(rows, bM), phases * groups * splits, threads=threads) as (bx, by, bz):
            A_s = _smem((bM, bK), dt)
            B_s = _smem((bK, bN), dt)
            acc = T.alloc_fragment((bM, bN), F32)
            C_s = _smem((bM, staged_columns), F32 if split else dt)
            zero(acc)
            for ko in T.Pipelined(_extent(bz), num_stages=stages):
                for i, kk in T.Parallel(bM, bK):
                    A_s[i, kk] = _a(dY, by * bM + i, bz, _k_tile(bz, ko), kk)
                if thin:
                    for kk, j in T.Parallel(bK, bN):
                        B_s[kk, j] = _b(Wt, bz, _k_tile(bz, ko), bx, kk, j)
                else:
                    T.copy(Wt[_b_row(bz, _k_tile(bz, ko)), _b_col(bz, _k_tile(bz, ko), bx)], B_s)
                product(A_s, B_s, acc)
            if split:
                store_partials()(acc, C_s, Work, bz, by * bM, bx * bN, rows, Cg)
            else:
                for i, j in T.Parallel(bM, bN):
                    C_s[i, j] = T.Cast(dt, _bias_add(q, acc[i, j], _group(bz) * Cg + T.min(bx * bN + j, Cg - 1), Bias))
                store(C_s, Y, by * bM, bx * bN, _phase(bz), Cg, _group(bz) * Cg)
        if split:
            reduce(Work, Y, Bias, None, None)

    params, dtypes, outputs, returns = _dgrad_params(q, config, names)
    roles = ["dy", "w", *(["bias"] if q.bias else []), "y", *(["work"] if split else [])]
    prim_func = prim_func_over(params, dtypes, lambda a: body(a["dy"], a["w"], a.get("bias"), a["y"], a.get("work")), roles)
    return KernelSpec(prim_func, params, outputs, returns,
                      {**config.as_dict(), "k_tiles": k_tiles, "phases": phases, "op": "dgrad",
                       "output_layout": q.output_layout})


def _bias_add(q: Grad, value, column, Bias):
    import tilelang.language as T

    return value + T.Cast(F32, Bias[column]) if q.bias else value


def _dgrad_direct(q: Grad, config: ConvLaunch, names) -> KernelSpec:
    """The data gradient on CUDA cores, phase by phase: a block of ``block_M`` phase rows x
    ``block_N`` input channels."""
    import tilelang.language as T

    p, g = q.problem, q.geometry
    dt = tilelang_dtype(q.dtype)
    bM, bN, threads = config.block_M, config.block_N, config.threads
    Cg, Og, C_in, phases, rows = p.cg, p.og, g.in_channels, q.phases, q.rows
    uniform = all(len(set(d.count)) == 1 for d in q.dims)
    write = q.channels_first.write(bM, bN, partial(_dx_row, q)) if q.channels_first else None  # as the GEMM's

    def _phase(bz):
        return bz if phases > 1 else 0

    def _taps(bz):
        return q.max_taps if uniform else _phase_taps(q, _phase(bz))

    def _dy(dY, m, bz, t, c, co):
        us, _ = _tap_of(q, _phase(bz), t)
        inside, row = _dy_row(q, m, _phase(bz), us)
        return T.if_then_else(inside, dY[row, c // Cg * Og + co], 0)

    def _w(Wt, bz, t, c, co):
        return Wt[c // Cg * Og + co, _tap_of(q, _phase(bz), t)[1] * Cg + c % Cg]

    @T.macro
    def body(dY, Wt, Bias, Y, Work):
        with T.Kernel(T.ceildiv(C_in, bN), T.ceildiv(rows, bM), phases, threads=threads) as (bx, by, bz):
            acc = T.alloc_fragment((bM, bN), F32)
            for i, j in T.Parallel(bM, bN):  # not T.clear: TileLang's CPU target fills no fragment
                acc[i, j] = 0
            for t in T.serial(_taps(bz)):
                for co in T.serial(Og):
                    for i, j in T.Parallel(bM, bN):
                        acc[i, j] += (T.Cast(F32, _dy(dY, by * bM + i, bz, t, T.min(bx * bN + j, C_in - 1), co))
                                      * T.Cast(F32, _w(Wt, bz, t, T.min(bx * bN + j, C_in - 1), co)))
            if write is not None:
                write(lambda i, j: T.Cast(dt, _bias_add(q, acc[i, j], T.min(bx * bN + j, C_in - 1), Bias)),
                      Y, by * bM, bx * bN, _phase(bz), C_in, 0)
            else:
                for i, j in T.Parallel(bM, bN):
                    if _dx_row(q, by * bM + i, _phase(bz))[0] and bx * bN + j < C_in:
                        Y[_dx_row(q, by * bM + i, _phase(bz))[1], bx * bN + j] = T.Cast(
                            dt, _bias_add(q, acc[i, j], bx * bN + j, Bias))

    params, dtypes, outputs, returns = _dgrad_params(q, config, names)
    roles = ["dy", "w", *(["bias"] if q.bias else []), "y"]
    prim_func = prim_func_over(params, dtypes, lambda a: body(a["dy"], a["w"], a.get("bias"), a["y"], None), roles)
    return KernelSpec(prim_func, params, outputs, returns,
                      {**config.as_dict(), "phases": phases, "op": "dgrad", "output_layout": q.output_layout})


# -- the weight gradient ---------------------------------------------------------------------------

def wgrad_kernel(geometry: ConvGeometry, dtype: torch.dtype, kernel: str | None = None, **launch) -> KernelSpec:
    """The weight gradient (and the bias gradient where ``geometry.bias``) of the forward
    convolution ``geometry``. Parameters: ``input`` [N*prod(in_size), C_in], ``grad_output``
    [N*prod(out_size), C_out], ``grad_weight`` [C_out, taps*Cg] (returned [C_out, *kernel, Cg]),
    ``grad_bias`` [C_out] (bias), then the fp32 workspaces (not returned): ``workspace``
    [splits, C_out, taps*Cg] (split-K and direct), ``bias_workspace`` [ranges*8, C_out] (bias)."""
    problem = unsupported(geometry, dtype)
    if problem:
        raise ValueError(problem)
    q = Grad(Problem(geometry, dtype), geometry.bias)
    config = chosen_wgrad(q) if kernel is None else ConvLaunch(kernel, **launch)
    if config.kernel not in ("gemm", "split_k", "direct"):
        raise ValueError(f"unknown conv gradient kernel {config.kernel!r}")
    return _wgrad(q, config)


def bias_ranges(q: Grad) -> int:
    """Position ranges of the bias gradient's partial sums: about two waves of blocks, each range at
    least 8 row steps."""
    blocks = -(-q.geometry.out_channels // BIAS_COLUMNS)
    return max(1, min(wgrad_target_blocks() // blocks, q.positions // (8 * BIAS_ROWS)))


def _wgrad_params(q: Grad, config: ConvLaunch):
    g, p = q.geometry, q.problem
    params = [("input", (p.rows_in, g.in_channels)), ("grad_output", (p.m, g.out_channels)),
              ("grad_weight", (g.out_channels, p.k))]
    dtypes = [q.dtype, q.dtype, q.dtype]
    outputs = {"grad_weight": q.dtype}
    returns = [("grad_weight", (g.out_channels, *g.kernel, p.cg))]
    if q.bias:
        params.append(("grad_bias", (g.out_channels,)))
        dtypes.append(q.dtype)
        outputs["grad_bias"] = q.dtype
        returns.append(("grad_bias", (g.out_channels,)))
    if config.kernel != "gemm":
        params.append(("workspace", (config.splits, g.out_channels, p.k)))
        dtypes.append(torch.float32)
        outputs["workspace"] = torch.float32
    if q.bias:
        params.append(("bias_workspace", (bias_ranges(q) * BIAS_ROWS, g.out_channels)))
        dtypes.append(torch.float32)
        outputs["bias_workspace"] = torch.float32
    return tuple(params), dtypes, outputs, tuple(returns)


def _wgrad(q: Grad, config: ConvLaunch, emulate_gemm: bool = False) -> KernelSpec:
    import tilelang.language as T

    p, g = q.problem, q.geometry
    dt = tilelang_dtype(q.dtype)
    bM, bN, bK, stages, threads, splits = (config.block_M, config.block_N, config.block_K, config.num_stages,
                                           config.threads, config.splits)
    Cg, Og, C_out, groups, P = p.cg, p.og, g.out_channels, g.groups, q.positions
    Kw = p.k  # taps * Cg: the weight gradient's columns
    kind = config.kernel
    k_tiles = -(-P // bK) if kind != "direct" else 0
    per_split = -(-k_tiles // splits) if kind != "direct" else -(-P // splits)
    aligned = kind != "direct" and Cg % bN == 0
    elements = C_out * Kw
    reduce = ordered_sum(splits, C_out, Kw, lambda total, *_: T.Cast(dt, total))
    ranges = bias_ranges(q) if q.bias else 0
    b_cols = min(BIAS_COLUMNS, 1 << max(2, (C_out - 1).bit_length()))
    b_steps = -(-P // (ranges * BIAS_ROWS)) if q.bias else 0  # row steps of a range
    b_threads = max(32, min(256, BIAS_ROWS * b_cols))

    _smem = tile_allocator(emulate_gemm)
    zero, product = zero_fill(emulate_gemm), tile_product(emulate_gemm, transpose_A=True)

    def _group(bz):
        return bz // splits if groups > 1 else 0

    def _k_tile(bz, ko):
        return bz % splits * per_split + ko if splits > 1 else ko

    def _b(X, k, bz, bx, j):
        """B[k, bx*bN + j]: the input through tap (column // Cg), channel column % Cg."""
        if aligned:
            tap, c = bx * bN // Cg, bx * bN % Cg + j
            extra = []
        else:
            column = bx * bN + j
            tap, c = (column, 0) if Cg == 1 else (column // Cg, column % Cg)
            extra = [column < Kw]
        inside, row = _source(p, k, tap)
        return T.if_then_else(_all([inside, *extra]), X[row, _group(bz) * Cg + c], 0)

    def _direct_element(e):
        """(co, tap, c) of the direct kernel's element ``e``, ordered (tap, co, c)."""
        return e // Cg % C_out, e // (Cg * C_out), e % Cg

    @T.macro
    def gemm(X, dY, dW, Work):
        with T.Kernel(T.ceildiv(Kw, bN), T.ceildiv(Og, bM), groups * splits, threads=threads) as (bx, by, bz):
            A_s = _smem((bK, bM), dt)
            B_s = _smem((bK, bN), dt)
            acc = T.alloc_fragment((bM, bN), F32)
            C_s = _smem((bM, staging_columns(bN)), F32 if splits > 1 else dt)
            zero(acc)
            for ko in T.Pipelined(per_split, num_stages=stages):
                # dy rows past the positions and columns past C_out are zero-filled; columns of the
                # next group reach output rows that are not written.
                T.copy(dY[_k_tile(bz, ko) * bK, _group(bz) * Og + by * bM], A_s)
                for kk, j in T.Parallel(bK, bN):
                    B_s[kk, j] = _b(X, _k_tile(bz, ko) * bK + kk, bz, bx, j)
                product(A_s, B_s, acc)
            if splits > 1:
                store_partials()(acc, C_s, Work, bz % splits, _group(bz) * Og + by * bM, bx * bN,
                                 (_group(bz) + 1) * Og, Kw)
            else:
                for i, j in T.Parallel(bM, bN):
                    C_s[i, j] = T.Cast(dt, acc[i, j])
                for i, j in T.Parallel(bM, bN):
                    if by * bM + i < Og and bx * bN + j < Kw:
                        dW[_group(bz) * Og + by * bM + i, bx * bN + j] = C_s[i, j]

    def _direct_product(X, dY, k, e):
        co, tap, c = _direct_element(e)
        inside, row = _source(p, k, tap)
        x = T.if_then_else(inside, X[row, co // Og * Cg + c], 0)
        return T.Cast(F32, x) * T.Cast(F32, dY[T.min(k, P - 1), co])

    @T.macro
    def direct(X, dY, Work):
        with T.Kernel(T.ceildiv(elements, bM), splits, threads=threads) as (bx, by):
            acc = T.alloc_fragment((bM,), F32)
            for i in T.Parallel(bM):
                acc[i] = 0
            for k in in_order(per_split):
                for i in T.Parallel(bM):
                    acc[i] += _direct_product(X, dY, by * per_split + k, T.min(bx * bM + i, elements - 1))
            for i in T.Parallel(bM):
                if bx * bM + i < elements:
                    Work[by, _direct_element(bx * bM + i)[0], _direct_element(bx * bM + i)[1] * Cg
                         + _direct_element(bx * bM + i)[2]] = acc[i]

    @T.macro
    def bias(dY, dB, BWork):
        with T.Kernel(T.ceildiv(C_out, b_cols), ranges, threads=b_threads) as (bx, by):
            part = T.alloc_fragment((BIAS_ROWS, b_cols), F32)
            for i, j in T.Parallel(BIAS_ROWS, b_cols):
                part[i, j] = 0
            for step in T.serial(b_steps):
                for i, j in T.Parallel(BIAS_ROWS, b_cols):
                    part[i, j] += T.if_then_else(
                        (by * b_steps + step) * BIAS_ROWS + i < P and bx * b_cols + j < C_out,
                        T.Cast(F32, dY[T.min((by * b_steps + step) * BIAS_ROWS + i, P - 1),
                                       T.min(bx * b_cols + j, C_out - 1)]), T.float32(0))
            for i, j in T.Parallel(BIAS_ROWS, b_cols):
                if bx * b_cols + j < C_out:
                    BWork[by * BIAS_ROWS + i, bx * b_cols + j] = part[i, j]
        with T.Kernel(T.ceildiv(C_out, 128), threads=128) as cx:
            total = T.alloc_fragment((128,), F32)
            for j in T.Parallel(128):
                total[j] = 0
            for s in in_order(ranges * BIAS_ROWS):  # a fixed order: deterministic
                for j in T.Parallel(128):
                    total[j] += BWork[s, T.min(cx * 128 + j, C_out - 1)]
            for j in T.Parallel(128):
                if cx * 128 + j < C_out:
                    dB[cx * 128 + j] = T.Cast(dt, total[j])

    def run(a):
        if kind == "direct":
            direct(a["x"], a["dy"], a["work"])
            reduce(a["work"], a["dw"], None, None, None)
        else:
            gemm(a["x"], a["dy"], a["dw"], a.get("work"))
            if kind == "split_k":
                reduce(a["work"], a["dw"], None, None, None)
        if q.bias:
            bias(a["dy"], a["db"], a["bwork"])

    params, dtypes, outputs, returns = _wgrad_params(q, config)
    roles = ["x", "dy", "dw", *(["db"] if q.bias else []), *(["work"] if kind != "gemm" else []),
             *(["bwork"] if q.bias else [])]
    prim_func = prim_func_over(params, dtypes, run, roles)
    extra = {"k_tiles": k_tiles, "aligned": aligned} if kind != "direct" else {}
    return KernelSpec(prim_func, params, outputs, returns, {**config.as_dict(), **extra, "op": "wgrad"})


# -- prim_funcs of any parameter list --------------------------------------------------------------
