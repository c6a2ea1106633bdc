"""The one TileLang template behind every row-wise norm kernel of this plugin.

A :class:`RowNorm` says what the op does to a row (which statistic, which affine, fused residual
add, int8 epilogue, ...); :func:`rowwise_kernel` turns it and a workload's shape into a kernel:
one thread block per row (a cluster of blocks for a few wide rows, see :func:`row_cluster`; as a
launch variant, a block taking every so many rows, ``pipelined``), the
row held in registers (loaded once, 16-byte vectors), a block-wide reduction per group, then the
normalized row written once. Every op therefore moves the minimum: each input read once, each
output written once.

TileLang is imported when a kernel is built, so specs load without it.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from npuops import (EVICT_LAST_LOAD, VECTOR_BYTES, KernelKey, KernelSpec, load_vectors_evict_last, multiprocessors,
                    tilelang_dtype, wide_indices)

from .block_reduce import (WARP, block_reducer, cluster_kernel, cluster_split, exchange_barrier_initializer,
                           exchange_slots, group_major, group_values, moments_reducer, reduces_groups, vector_elements)

F32 = "float32"
# A kernel prelude: a fence for the compiler alone (no instruction), which memory accesses do not cross.
COMPILER_FENCE = 'static __device__ __forceinline__ void npuops_compiler_fence() { asm volatile("" ::: "memory"); }\n'
ROUNDING_MAGIC = 12582912.0  # 1.5 * 2^23: x + it rounds x (|x| < 2^22) to an integer, half to even
MAX_THREADS = 1024
# Rows one warp holds whole take several a block, a warp each, where they fill two blocks an SM
# (packed_rows): Triton's kernel (torch.compile) takes several rows a program too.
PACKED_ROWS = (4, 8)
# Launch rule read off a sweep of launches on the H200: about 32
# elements per thread was fastest or within 2% at 4096, 8192 and 16384 wide rows (1024
# threads lost 40-80%), and asking for two blocks per SM took LayerNorm 16384 from 80 registers
# and one resident row per SM to 64 and two: 64.5 -> 42 us. Four blocks per SM spilled (100 us).
ELEMENTS_PER_THREAD = 32
MIN_BLOCKS_PER_SM = 2
# Tuning variants for many rows: registers capped at 128, 96 and 64 a thread (as many blocks per SM
# as that leaves room for), where that asks for more blocks than the rule. These rows are bound by
# the bytes each SM has in flight, and registers bound the rows in flight: in Nsight Compute,
# 2048 rows of 4096 took 9.0 us with 48 registers at 128 threads (L2Norm), 9.8 with 63 (RMSNorm),
# 10.6 with 80 (LayerNorm). Four blocks (a 128-register cap at 128 threads, 64 at 256) won 26 of
# the 66 tunings of the catalog that offered them on the H200 (RMSNorm 405b prefill 34.21 -> 32.77
# µs); the other caps' block counts (5, 8, 10, 16) won 22 of the 48 that offered them (RMSNorm 70b
# prefill 17.95 -> 17.42 at 128 threads x 8 blocks,
# Gemma 18.26 -> 17.63, LayerNormQuant 18.82 -> 18.18 at 128 x 5). ptxas keeps LayerNorm 8192
# wide at 128 threads within 96 without spilling (five blocks), not within 64.
REGISTER_CAPS = (128, 96, 64)
REGISTERS_PER_SM = 65536
MAX_BLOCKS_PER_SM = 32
# Staged variants: the row (and a fused add's residual) copied into shared memory with cp.async,
# so the bytes in flight are bounded by shared memory (228 KiB an SM, 1 KiB of it reserved per
# block) rather than by the registers that would hold them. They won 14 of the 56 tunings that
# offered them on the H200, most by under 2% (RMSNormQuant 405b prefill 29.63 ->
# 28.35 µs, WeightNorm 33.44 -> 32.80); LayerNorm's rows, which they were written for, stayed
# faster in registers (16384 wide: 37.95 against 38.34).
SHARED_PER_SM, SHARED_RESERVED_PER_BLOCK = 228 * 1024, 1024 + 256  # the reserved KiB and the exchange slots
# A handful of rows (decode) is latency-bound: shorter per-thread shares (8 elements was fastest at
# 4096 wide, equal at 8192) and the weight loaded with the row.
FEW_ROWS = 8
FEW_ROWS_ELEMENTS_PER_THREAD = 8
# Many wide rows: twice the share per thread (16384 wide, and LayerNorm-kind rows 8192 wide), with
# four blocks an SM where ptxas holds that without spilling: at 128 threads (128 registers) and for
# light rows (64 registers at 256 threads). Read off tunings on the H200, where this
# beat 32 elements x two blocks on most such rows: RMSNorm 2048 x 16384 bf16 36.30 -> 32.74 µs
# (256 x 4), LayerNorm 2048 x 8192 f16 22.88 -> 19.10 (128 x 4), LayerNormQuant 22.13 -> 17.12.
# Heavier rows at 256 threads x 4 spilled (LayerNorm 16384 wide: 93 µs; GroupRMS f16 39.9 against
# 33.3 at two blocks); the other kinds 8192 wide were as fast or faster at 256 threads
# (RMSNormQuant 15.71 against 16.29 at 128).
WIDE_ROW, MEANVAR_WIDE_ROW = 16384, 8192
WIDE_ROW_ELEMENTS_PER_THREAD = 64
WIDE_ROW_BLOCKS_PER_SM = 4
# Many rows 4096 wide with a per-column or per-row operand are pipelined by rule, at four blocks an
# SM: in tunings on the H200 128 threads x 4 pipelined beat 128 x 2 unpipelined on all 12
# such rows (LayerNorm 2048 x 4096 bf16 12.03 -> 11.65 µs, f16 12.40 -> 11.65; RMSNorm 11.55 -> 10.94
# and 11.68 -> 10.94; LayerNormQuant 11.87 -> 11.01; Gemma 11.68 -> 11.04; AdaLN 12.35 -> 12.22;
# WeightNorm 10.94 -> 10.72). Rows with neither (L1, L2) lost up to 2% so (10.72 -> 10.94 µs), and
# RMSNormQuant's, whose weight loads with the row, 1.7% (9.57 -> 9.73).
PIPELINED_ROW = 4096
PIPELINED_BLOCKS_PER_SM = 4
PIPELINE_SPARE_REGISTERS = 32  # a thread's registers besides its two rows


def one_wave_rows() -> int:
    """Rows that fit one block an SM of the GPU the kernel is for: they gain nothing from budgeting
    registers for two. 64 rows of 32768 (L1Norm, 1024 threads) took 9.84 µs so and 6.69 with
    registers unbounded (L2Norm 9.44 against 6.66)."""
    return multiprocessors()


def elements_per_thread(spec: RowNorm, rows: int, hidden: int) -> int:
    if rows <= FEW_ROWS:
        return FEW_ROWS_ELEMENTS_PER_THREAD
    if absmax_joins_statistic(spec):
        return ELEMENTS_PER_THREAD  # RMSNormQuant 2048 x 16384 bf16: 512 x 2 26.72 µs, 256 x 2 31.20
    if spec.stat == "meanvar" and chunkable(spec) and hidden >= WIDE_ROW and not holds_f32(spec, rows):
        return ELEMENTS_PER_THREAD  # LayerNorm 2048 x 16384 in 16 bits: 512 x 2 37.52 µs, 256 x 2 38.88
    wide = hidden >= (MEANVAR_WIDE_ROW if spec.stat == "meanvar" else WIDE_ROW)
    return WIDE_ROW_ELEMENTS_PER_THREAD if rows > one_wave_rows() and wide else ELEMENTS_PER_THREAD


def light(spec: RowNorm) -> bool:
    """Rows whose kernel holds little beside the row: one statistic of a plain row, no residual, no
    epilogue."""
    return (stageable(spec) and spec.stat in ("rms", "l2", "l1") and not spec.residual
            and spec.quant_min_scale is None and not spec.modulated)


def holds_f32(spec: RowNorm, rows: int) -> bool:
    """The rule's ``f32_row``: many plain LayerNorm rows, quantized or not, held in f32 from their
    load. On the H200 it was as fast or faster at the rule's launch on every such row measured:
    LayerNormQuant 2048 x 16384 bf16 35.07 -> 31.65 µs, x 8192 18.75 -> 17.47, f16 32.10 -> 31.36
    and 17.22 -> 17.22; LayerNorm 2048 x 8192 19.63 -> 18.98, x 4096 12.21 -> 12.18, and x 16384
    37.57 at 512 threads (32 elements, 16 bits) -> 37.15 at 256 (64 in f32: at 512 they spilled)."""
    return rows > FEW_ROWS and f32_rowable(spec) and not spec.modulated


def held_in_f32(spec: RowNorm, rows: int, f32_row: bool | None = None, staged: bool = False,
                chunked: bool = False) -> bool:
    """Whether a launch holds its rows in f32: as ``f32_row`` asks, else as :func:`holds_f32` says
    where the row is neither staged nor chunked."""
    return holds_f32(spec, rows) and not staged and not chunked if f32_row is None else f32_row


def absmax_joins_statistic(spec: RowNorm) -> bool:
    """Quantized RMS rows without bias or modulation: y = x w / rms, so max |y| = max |x w| / rms,
    reduced with the sum of squares behind the same barrier once the weight is loaded with the row
    (the rule's ``prefetch`` for them), and q formed from x w without y. At the rule's launch on
    the H200, against the weight read after two reductions: RMSNormQuant 2048 x 16384 bf16 29.34 ->
    26.72 µs, f16 29.49 -> 27.94, x 8192 15.79 -> 14.91 and 15.87 -> 15.87, x 4096 10.69 -> 9.70;
    decode 405b 5.06 -> 4.32."""
    return spec.quant_min_scale is not None and spec.stat == "rms" and not spec.bias and not spec.modulated


def prefetches(spec: RowNorm, rows: int, threads: int, rows_per_block: int = 1) -> bool:
    """The rule's ``prefetch`` (per-row operands loaded with the row, not after its reduction):
    for few rows (decode), for quantized rows whose absmax joins their statistic, and for rows a
    warp holds, one a block, whose blocks are too small for registers to bound the rows in flight
    (32 a multiprocessor at most): the operands' latency then overlaps the row's. LayerNorm
    300 x 1000 f32 (H100, event time of the tune): 4.80 µs against 5.12 at the rule's 32 threads."""
    return (rows <= FEW_ROWS or absmax_joins_statistic(spec)
            or (threads == WARP and rows_per_block == 1 and loads_operands(spec)))


def loads_operands(spec: RowNorm) -> bool:
    """Whether a row has operands to load beside itself: a weight, bias, modulation or gain."""
    return spec.weight is not None or spec.bias or spec.modulated or spec.stat == "l2_gain"


def pipelines(spec: RowNorm, rows: int, hidden: int) -> bool:
    """The rule's ``pipelined`` (see PIPELINED_ROW): many plain rows over 2048 and at most 4096 wide,
    unpadded (a multiple of 32: some power-of-two thread count divides them), with a weight, bias,
    modulation or gain, but RMSNormQuant's."""
    return (rows > one_wave_rows() * MIN_BLOCKS_PER_SM and pipelinable(spec)
            and PIPELINED_ROW // 2 < hidden <= PIPELINED_ROW
            and hidden % 32 == 0 and loads_operands(spec) and not absmax_joins_statistic(spec))


def evicts_last(spec: RowNorm, rows: int) -> bool:
    """The rule's ``evict_last`` (where :func:`evict_lastable`): many rows with a residual, two
    tensors read and two written a row. On the H200, at the tuned launch and at the rule's,
    FusedAddRMSNorm 2048 x 16384 bf16 65.65 -> 63.06 µs, x 8192 f16 32.86 -> 31.62,
    FusedAddLayerNorm x 16384 33.95 -> 33.05; rows 4096 wide moved under 1%."""
    return rows > FEW_ROWS and spec.residual


def evict_lastable(spec: RowNorm, hidden: int, threads: int, itemsize: int) -> bool:
    """Whether rows ``hidden`` wide over ``threads`` may be loaded with the evict_last hint
    (``rowwise_kernel(evict_last=True)``, in registers, one block a row): unpadded rows (or groups
    of whole warps), whole 16-byte vectors a thread."""
    lanes = threads // spec.groups
    return (spec.segments == 1 and hidden % threads == 0 and reduces_groups(spec.groups, threads, hidden // spec.groups)
            and vector_elements(hidden // spec.groups, lanes, itemsize) * itemsize == VECTOR_BYTES)


def min_blocks_per_sm(spec: RowNorm, rows: int, hidden: int, threads: int) -> int:
    """Blocks per SM to budget registers for: only rows beyond one block an SM share one."""
    if rows <= one_wave_rows():
        return 1
    wide_share = elements_per_thread(spec, rows, hidden) == WIDE_ROW_ELEMENTS_PER_THREAD <= hidden // threads
    if wide_share and (threads <= 128 or light(spec)):
        return WIDE_ROW_BLOCKS_PER_SM
    return MIN_BLOCKS_PER_SM


@dataclass(frozen=True)
class RowNorm:
    stat: str  # "rms": x/sqrt(mean x² + eps); "meanvar": (x-mean)/sqrt(var + eps);
    #            "l2"/"l1": x / max(||x||_p, eps); "l2_gain": g[row] * x / ||x|| (weight norm)
    eps: float = 0.0
    groups: int = 1  # statistics per equal group of the row
    weight: str | None = None  # None, "w" (y * w) or "1+w" (Gemma: y * (1 + w))
    bias: bool = False
    residual: bool = False  # residual += x (written back) and normalize the sum
    quant_min_scale: float | None = None  # int8 per-row quantization of y (outputs q, scale)
    modulated: bool = False  # AdaLN: y * (1 + scale[sample]) + shift[sample]
    pair: bool = False  # QK-norm: the same norm on two tensors, one launch
    input_name: str = "x"  # the op's name for the row tensor (weight norm calls it v)
    # x viewed as [segments, rows, hidden]: each row's statistic spans all its segments
    # (normalizing over dims 0 and 2 of a 3-D tensor, as L2NormFwd with dim=[0, 2]).
    segments: int = 1


def row_class(rows: int) -> int:
    """Which of the launch rule's row-count classes ``rows`` falls in (every decision of the rule
    and of :func:`launch_variants` that depends on the row count is one of these thresholds): a
    build for one row count serves every other of its class, the count given at launch."""
    wave = one_wave_rows()
    return sum(rows > limit for limit in (FEW_ROWS, wave, wave * MIN_BLOCKS_PER_SM))


def class_row_counts() -> tuple[int, ...]:
    """A row count of each of :func:`row_class`'s classes, the first of each."""
    wave = one_wave_rows()
    return (1, FEW_ROWS + 1, wave + 1, wave * MIN_BLOCKS_PER_SM + 1)


def launch_key(spec: RowNorm, shape: tuple[int, ...], dtype: torch.dtype, samples: int = 1) -> KernelKey:
    """What a kernel of :func:`rowwise_kernel` for rows of ``shape`` depends on (its row count is
    given at launch): rows of equal keys share a build. Every row class's kernel computes any row
    count correctly, the class only tuning its launch: the classes share the key's first part."""
    rows = math.prod(shape[:-1]) // spec.segments
    return KernelKey((spec, dtype, shape[-1], shape[0] if spec.segments > 1 else None, samples, wide_indices(shape)),
                     row_class(rows))


def row_cluster(spec: RowNorm, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[int, int] | None:
    """(blocks, threads) splitting each row over a cluster (block_reduce.cluster_split): a few wide
    plain rows only."""
    rows = math.prod(shape[:-1])
    if rows > FEW_ROWS or spec.groups > 1 or spec.segments > 1:
        return None
    return cluster_split(shape[-1])


def launch_threads(hidden: int, itemsize: int, per_thread: int = ELEMENTS_PER_THREAD) -> tuple[int, int]:
    """(threads per row-block, padded row length). Prefers a power-of-two thread count dividing the row
    so each thread's share loads as whole 16-byte vectors, with about ``per_thread`` elements each;
    a row no such count divides is padded up (and masked) to a multiple of the threads."""
    widest = VECTOR_BYTES // itemsize

    def score(threads: int) -> tuple[int, float]:
        share = hidden // threads
        vector = next(v for v in (widest, widest // 2, widest // 4, 1) if v and share % v == 0)
        return vector, -abs(math.log2(share / per_thread))

    powers = [32 << i for i in range((MAX_THREADS // 32).bit_length())]  # TileLang's block all-reduce
    fits = [t for t in powers if hidden % t == 0]
    if fits:
        return max(fits, key=score), hidden
    threads = max(t for t in powers if t == 32 or t * per_thread <= hidden)
    return threads, -(-hidden // threads) * threads


def launch_variants(spec: RowNorm, shape: tuple[int, ...], dtype: torch.dtype) -> list[dict[str, int]]:
    """Launch configurations ``npuops run --tune`` chooses among, the rule's first: half, twice and
    four times its elements per thread (at most 64), and for many rows also no register bound,
    registers capped at 128, 96 and 64 a thread, the per-row operands (weight, bias, gain) loaded
    with the row instead of after its reduction, outputs stored a vector at a time (fewer registers),
    plain rows staged in shared memory, and plain rows without a residual pipelined."""
    hidden, rows = shape[-1] * spec.segments, math.prod(shape[:-1]) // spec.segments
    grouped = spec.groups > 1 or spec.segments > 1
    base = FEW_ROWS_ELEMENTS_PER_THREAD if rows <= FEW_ROWS else ELEMENTS_PER_THREAD
    shares = (elements_per_thread(spec, rows, hidden), base, base // 2, *(m * base for m in (2, 4) if m * base <= 64))
    two_blocks = [MIN_BLOCKS_PER_SM] if rows > one_wave_rows() else []
    variants = []
    for per_thread in dict.fromkeys(shares):
        threads, padded = launch_threads(hidden, dtype.itemsize, per_thread)
        if grouped and padded != hidden:
            continue
        capped = [min(REGISTERS_PER_SM // (cap * threads), MAX_BLOCKS_PER_SM) for cap in REGISTER_CAPS]
        more = [blocks for blocks in capped if blocks > MIN_BLOCKS_PER_SM] if rows > FEW_ROWS else []
        for blocks in dict.fromkeys((min_blocks_per_sm(spec, rows, hidden, threads), *two_blocks, 1, *more)):
            config = {"threads": threads, "min_blocks": blocks}
            if config not in variants:
                variants.append(config)
    rule_threads = variants[0]["threads"]  # the first share is the rule's
    if hidden % rule_threads and not grouped:
        # A row no power of two divides takes, for each share above, the widest block whose share
        # fits the row: a 1000-wide f32 row 32 threads in every one (LayerNorm 300 x 1000 f32: 0.80x
        # torch.compile's kernel time on the H100), where a block 2 or 4 times as wide pads it to 1024.
        variants += [config for config in ({"threads": t, "min_blocks": variants[0]["min_blocks"]}
                                           for t in (2 * rule_threads, 4 * rule_threads) if t <= MAX_THREADS)
                     if config not in variants]
    if rows > FEW_ROWS and loads_operands(spec):
        # the other choice than the rule's (prefetches)
        variants += [{**config, "prefetch": not prefetches(spec, rows, config["threads"])} for config in variants
                     if config["min_blocks"] > 1]
    if rows > FEW_ROWS and chunkable(spec) and hidden >= WIDE_ROW:
        # Stored a vector at a time: of 13 tunings on the H200 they won the two
        # LayerNorm rows 16384 wide (36.90 against 37.52 µs, 34.94 against 35.65) and tied FusedAddRMS
        # there; narrower rows ran faster with every load ahead (LayerNorm 4096 wide 12.42 against 11.97).
        variants += [{**config, "chunked": True} for config in variants
                     if config["min_blocks"] > 1 and not config.get("prefetch") and hidden % config["threads"] == 0]
    if rows > FEW_ROWS and f32_rowable(spec):  # the other choice than the rule's (holds_f32)
        variants += [{**config, "f32_row": not holds_f32(spec, rows)} for config in variants if not config.get("chunked")]
    if rows > FEW_ROWS and stageable(spec):
        # Staged: the register variants' block counts and as many blocks as shared memory holds,
        # where that leaves at least the smallest register cap.
        fit = SHARED_PER_SM // (staged_bytes(spec, hidden, dtype) + SHARED_RESERVED_PER_BLOCK)
        for threads in dict.fromkeys(c["threads"] for c in variants if hidden % c["threads"] == 0):
            asked = {c["min_blocks"] for c in variants if c["threads"] == threads} | {fit}
            variants += [{"threads": threads, "min_blocks": blocks, "staged": True} for blocks in sorted(asked)
                         if 1 < blocks <= fit and blocks * threads * REGISTER_CAPS[-1] <= REGISTERS_PER_SM]
    if rows > one_wave_rows() * MIN_BLOCKS_PER_SM and pipelinable(spec):
        # The plain register launches, pipelined, where the two rows a thread holds leave it
        # PIPELINE_SPARE_REGISTERS of its share. They won 14 of 109 tunings on the H200: 13 of
        # 2048 x 4096 (LayerNorm 12.03 -> 11.36 µs) and RMSNormQuant 2048 x 16384 f16 (27.87 ->
        # 27.30); on wider rows they lost by up to 6.5% at two blocks an SM (LayerNormQuant
        # 2048 x 8192 17.12 against 18.21), the barrier after each row, and where the rows took
        # more registers they spilled (RMSNorm 2048 x 16384 f16 at 256 threads x 4:
        # 152.67 µs). Rows held in f32 at 128 registers a thread (LayerNorm(Quant) 8192 wide at
        # 128 threads x 4, 16384 wide at 256 x 2) hold both rows without spilling (ptxas -v); at 32
        # or 64 registers the rest of the kernel's state spilled (1024 threads, 16384 wide: 34.0 to
        # 66.96 µs against 26.8 to 32.5 for the fastest).
        def rows_fit(threads: int, blocks: int) -> bool:
            share = hidden // threads
            held = share * (4 if holds_f32(spec, rows) else dtype.itemsize) + share * dtype.itemsize  # bytes
            return held // 4 + PIPELINE_SPARE_REGISTERS <= REGISTERS_PER_SM // (threads * blocks)
        variants += [{**config, "pipelined": True} for config in variants if set(config) == {"threads", "min_blocks"}
                     and config["min_blocks"] in (2, 4) and hidden % config["threads"] == 0
                     and rows_fit(config["threads"], config["min_blocks"])]
    if spec.groups == 1 and spec.segments == 1:
        variants.append({**variants[0], "tile_allreduce": True})
        if spec.stat == "meanvar":
            variants.append({**variants[0], "welford": False})
    elif spec.segments == 1:
        # Groups of whole warps reduce through block_reducer; TileLang's all-reduce stays a choice:
        # with one warp a group it was 2-3% faster (GroupRMS 4096 wide, 256 threads, H200).
        variants += [{**config, "tile_allreduce": True} for config in variants
                     if reduces_groups(spec.groups, config["threads"], hidden // spec.groups)]
    if rows > FEW_ROWS and spec.quant_min_scale is None:
        # The other choice than the rule's (evicts_last) for rows in registers as 16-bit values: on
        # the H200 the hint slowed rows held in f32 (LayerNorm 2048 x 16384 35.90 against
        # 38.42 µs) and quantized rows (RMSNormQuant x 16384 f16 27.41 against 28.21) and sped up wide RMS
        # rows (QKNorm x 16384 65.85 -> 64.82, GroupRMSNorm 32.57 -> 32.08, AdaLN x 4096 11.66 -> 11.30).
        variants += [{**config, "evict_last": not evicts_last(spec, rows)} for config in variants
                     if not config.get("staged") and not config.get("tile_allreduce")
                     and not held_in_f32(spec, rows, config.get("f32_row"), chunked=config.get("chunked", False))
                     and evict_lastable(spec, hidden, config["threads"], dtype.itemsize)]
    split = row_cluster(spec, shape, dtype)
    if split:
        # The rule's cluster first, then twice the threads, then half the blocks; then each with its
        # blocks' results exchanged through mbarriers, not measured yet (the decode rows of two
        # cluster reductions, LayerNormQuant's, take 2.56-2.66 µs of kernel time on the H200 against
        # RMSNormQuant's one, 1.98).
        blocks, threads = split
        clustered = [{"threads": threads, "min_blocks": 1, "cluster": blocks},
                     {"threads": threads * 2, "min_blocks": 1, "cluster": blocks},
                     {"threads": threads * 2, "min_blocks": 1, "cluster": blocks // 2}]
        variants = [*clustered, *({**config, "exchange_barriers": True} for config in clustered), *variants]
    if packable(spec) and rows > FEW_ROWS and variants[0]["threads"] == WARP:
        # Rows a warp holds, several a block, the most first: the rule's where packed_rows says.
        packs = [{"threads": WARP * packed, "min_blocks": variants[0]["min_blocks"], "rows_per_block": packed}
                 for packed in row_packings(hidden)]
        variants = packs + variants if packed_rows(spec, shape, dtype) > 1 else variants + packs
    if pipelines(spec, rows, hidden):  # the rule's launch first (unpadded: its threads divide the row)
        rule = {"threads": variants[0]["threads"], "min_blocks": PIPELINED_BLOCKS_PER_SM, "pipelined": True}
        variants = [rule, *(v for v in variants if v != rule)]
    return variants


def stageable(spec: RowNorm) -> bool:
    """Whether rows may be staged in shared memory (``rowwise_kernel(staged=True)``): plain rows,
    one tensor each."""
    return spec.groups == 1 and spec.segments == 1 and not spec.pair


def chunkable(spec: RowNorm) -> bool:
    """Whether a row's output may be formed and stored a vector at a time (``rowwise_kernel(chunked=True)``):
    plain rows with per-column operands to load, no int8 epilogue."""
    return stageable(spec) and spec.quant_min_scale is None and (spec.weight is not None or spec.bias or spec.modulated)


def f32_rowable(spec: RowNorm) -> bool:
    """Whether a row may be held in f32 from its load (``rowwise_kernel(f32_row=True)``): plain
    mean-and-variance rows without a residual, whose every element is otherwise converted three
    times (twice for the moments, once for the output). As fast or faster at the rule's launch on
    every such row measured on the H200 (LayerNormQuant 2048 x 16384 bf16 35.07 -> 31.65 µs,
    LayerNorm 2048 x 8192 19.63 -> 18.98); RMSNormQuant's rows, converted twice, gained nothing."""
    return stageable(spec) and spec.stat == "meanvar" and not spec.residual


def pipelinable(spec: RowNorm) -> bool:
    """Whether rows may be pipelined (``rowwise_kernel(pipelined=True)``): plain rows without a residual."""
    return stageable(spec) and not spec.residual


def packed_rows(spec: RowNorm, shape: tuple[int, ...], dtype: torch.dtype) -> int:
    """Rows a block takes by the launch rule: several, a warp each (the most that split evenly),
    where the rule gives a row one warp that loads it in one vector a lane and the rows fill two
    blocks an SM (row_class's last class, so no build class of its own); else one. RMSNorm
    4096 x 128 bf16 (H100, kernel time): 8 rows a block 2.05 µs, 4 rows 2.13, a block a row 3.82
    at best (torch.compile 1.92-3.86 in three runs). Rows of several vectors a lane gained
    nothing: LayerNorm 1576 x 768 f16 (three a lane) 3.33 µs at 8 rows a block, 3.17 a block a row
    (H100, kernel time, two runs)."""
    hidden, rows = shape[-1] * spec.segments, math.prod(shape[:-1]) // spec.segments
    if not packable(spec) or rows <= one_wave_rows() * MIN_BLOCKS_PER_SM:
        return 1
    if launch_threads(hidden, dtype.itemsize, elements_per_thread(spec, rows, hidden))[0] != WARP:
        return 1
    if hidden * dtype.itemsize > WARP * VECTOR_BYTES:  # more than a vector a lane: blocks a row do enough
        return 1
    return next(iter(row_packings(hidden)), 1)


def row_packings(hidden: int) -> list[int]:
    """Rows of ``hidden`` a block may take, a warp each (:data:`PACKED_ROWS` whose rows split
    evenly over the warps' shares), the most first."""
    return [n for n in sorted(PACKED_ROWS, reverse=True) if reduces_groups(n, WARP * n, hidden)]


def packable(spec: RowNorm) -> bool:
    """Whether a block may take several rows (``rowwise_kernel(rows_per_block=...)``), a group of
    whole warps each: plain rows whose operands are per column (no per-row gain, AdaLN samples or
    int8 scales)."""
    return (stageable(spec) and spec.quant_min_scale is None and not spec.modulated
            and spec.stat != "l2_gain")


def staged_bytes(spec: RowNorm, hidden: int, dtype: torch.dtype) -> int:
    """Shared memory a staged row takes (its residual's too)."""
    return hidden * dtype.itemsize * (2 if spec.residual else 1)


def rowwise_unsupported(spec: RowNorm, shape: tuple[int, ...], dtype: torch.dtype) -> str | None:
    """Why :func:`rowwise_kernel` cannot take rows of ``shape`` (None: it can). Masked padding of
    several groups at once gave wrong sums on the H200 (2x1000, 8 groups), so grouped rows must
    split evenly over the threads."""
    hidden, rows = shape[-1], math.prod(shape[:-1]) // spec.segments
    if spec.groups > 1 and launch_threads(hidden, dtype.itemsize, elements_per_thread(spec, rows, hidden))[1] != hidden:
        return f"the grouped row kernel needs a hidden size divisible by 32, got {hidden}"
    return None


def rowwise_kernel(spec: RowNorm, shape: tuple[int, ...], dtype: torch.dtype, samples: int = 1,
                   threads: int | None = None, min_blocks: int | None = None, prefetch: bool | None = None,
                   tile_allreduce: bool = False, cluster: int | None = None, welford: bool = True,
                   staged: bool = False, chunked: bool = False, f32_row: bool | None = None,
                   pipelined: bool | None = None, evict_last: bool | None = None,
                   exchange_barriers: bool = False, rows_per_block: int | None = None) -> KernelSpec:
    """The kernel for rows of ``shape`` (leading dims are rows; the last is normalized; with
    ``spec.segments`` the first dim is the segments). ``threads``, ``min_blocks`` (blocks per
    SM the registers are budgeted for) and ``prefetch`` (per-row operands loaded with the row)
    override the launch rule; ``tile_allreduce`` reduces plain rows and groups of whole warps with
    TileLang's block all-reduce too (a variant: on the H200 up to 3% faster on a few 16384-wide
    prefill rows, slower on every decode row; 2-3% faster with one warp a group);
    ``cluster`` (blocks per row, see :func:`row_cluster`) too; ``welford`` takes a plain unmasked
    row's mean and variance in one reduction (block_reduce.moments_reducer) rather than a mean then
    a centered sum; ``staged`` copies a plain row (and its residual) into shared memory with cp.async
    rather than into registers (:func:`stageable`); ``chunked`` forms and stores the output a vector
    a thread at a time (:func:`chunkable`); ``f32_row`` holds the row in f32 from its load on
    (:func:`f32_rowable`), converted once rather than at each use, the output formed in its place
    (by default as :func:`holds_f32` says, where the row is neither staged nor chunked); ``pipelined``
    launches ``min_blocks`` blocks an SM, each taking every so many rows, the next row's loads issued
    before this row's reductions (:func:`pipelinable`; by default for the rule's launch as
    :func:`pipelines` says); ``evict_last`` loads the row (and its residual) with the L2 hint of
    ``npuops.kernels.EVICT_LAST_LOAD`` (:func:`evict_lastable`; by default as :func:`evicts_last` says);
    ``exchange_barriers`` has a cluster's blocks exchange their reductions' results through an
    mbarrier each rather than a cluster barrier each (block_reduce.cluster_sharer);
    ``rows_per_block`` has each block take that many rows, each as a group of whole warps
    (:func:`packable`; ``threads`` then counts all the block's; by default as :func:`packed_rows` says)."""
    import tilelang.language as T

    rule_launch = threads is None and min_blocks is None
    if rows_per_block is None:
        rows_per_block = packed_rows(spec, shape, dtype) if rule_launch and cluster is None else 1
    segs = spec.segments
    hidden = shape[-1]
    rows = math.prod(shape[:-1]) // segs
    dt = tilelang_dtype(dtype)
    packed = rows_per_block > 1
    if packed:
        if not packable(spec) or cluster not in (None, 1) or staged or chunked or pipelined:
            raise ValueError(f"several rows a block must be plain rows with per-column operands, in registers, not "
                             f"split over a cluster, got {spec} with cluster={cluster}, staged={staged}, "
                             f"chunked={chunked}, pipelined={pipelined}")
        cluster, pipelined, threads = 1, False, threads or WARP * rows_per_block
        if not reduces_groups(rows_per_block, threads, hidden):
            raise ValueError(f"{rows_per_block} rows of {hidden} over {threads} threads: each row takes whole warps "
                             f"and whole shares of its row")
    # A block's groups: the statistics it takes (a row's groups, its segments or the rows it packs).
    G = rows_per_block if packed else spec.groups if segs == 1 else segs
    n = hidden if packed else hidden // spec.groups  # elements of one group (or one whole segment)
    if cluster is None:  # the rule's split, unless the launch names its threads
        split = row_cluster(spec, shape, dtype) if threads is None else None
        cluster, threads = split or (1, threads)
    span = hidden * rows_per_block if packed else hidden * segs // cluster  # elements one block holds
    if threads is None:
        threads, padded = launch_threads(span, dtype.itemsize, elements_per_thread(spec, rows, span))
    else:
        padded = -(-span // threads) * threads
    if pipelined is None:  # the rule's launch only: a launch variant names its own
        pipelined = rule_launch and pipelines(spec, rows, span) and not staged and not chunked
    if min_blocks is None:
        min_blocks = PIPELINED_BLOCKS_PER_SM if pipelined else min_blocks_per_sm(spec, rows, span, threads)
    if segs > 1:
        padded = hidden * segs
    masked = padded != span
    if masked and G > 1:
        raise ValueError(rowwise_unsupported(spec, shape, dtype))
    # A plain row (one group, one segment) is laid out thread-major and reduced with one barrier
    # (see block_reduce), and so are groups of whole warps; other grouped rows (and segments, whose
    # statistic is joint) by TileLang's block all-reduce, which takes two barriers a power-of-two
    # stride.
    plain = G == 1 and not tile_allreduce
    own_reducer = plain or (not tile_allreduce and segs == 1 and reduces_groups(G, threads, padded // G))
    if staged and (not stageable(spec) or cluster > 1 or masked):
        raise ValueError(f"a staged row must be one plain unpadded row a block, got {G} groups, {segs} segments, "
                         f"{cluster} blocks a row, {span} elements over {threads} threads")
    if chunked and (not chunkable(spec) or tile_allreduce or masked or cluster > 1 or staged):
        raise ValueError(f"a row stored a vector at a time must be one plain unpadded row a block in registers with "
                         f"per-column operands, got {G} groups, {segs} segments, {cluster} blocks a row, "
                         f"{span} elements over {threads} threads{', staged' if staged else ''}")
    f32_row = held_in_f32(spec, rows, f32_row, staged, chunked)
    if f32_row and (not f32_rowable(spec) or staged or chunked):
        raise ValueError("a row held in f32 must be a plain mean-and-variance row without a residual, in registers")
    if pipelined and (not pipelinable(spec) or cluster > 1 or staged or chunked or masked):
        raise ValueError("a pipelined row must be one plain unpadded row a block in registers, with no residual")
    # The row count is a launch argument: one build serves every row count whose launch decisions
    # (made above for ``shape``'s) are the same (``row_class``); int64 indices past 2^31 elements.
    row_count = T.dynamic("rows", "int64" if wide_indices(shape) else "int32")
    # blocks (each a row, or pipelined: several)
    grid = (T.min(row_count, multiprocessors() * min_blocks) if pipelined
            else T.ceildiv(row_count, rows_per_block) if packed else row_count)
    vec = vector_elements(span, threads, dtype.itemsize)
    vectors = span // (threads * vec)
    if cluster > 1 and (not plain or hidden % cluster or masked):
        raise ValueError(f"a row split over {cluster} blocks needs one group and slices the {threads} threads of a "
                         f"block share evenly, got rows {hidden} wide in {G} groups")
    if exchange_barriers and cluster == 1:
        raise ValueError("exchange barriers are for rows split over a cluster, got one block a row")
    m = padded // G  # per-group length held in registers; the tail past n (if any) is masked
    lanes = threads // G  # threads a group
    lane_vector = vector_elements(m, lanes, dtype.itemsize)  # elements of one of a thread's vectors
    hintable = own_reducer and cluster == 1 and not staged and evict_lastable(spec, span, threads, dtype.itemsize)
    if evict_last is None:
        evict_last = evicts_last(spec, rows) and hintable
    if evict_last and not hintable:
        raise ValueError(f"rows loaded with the evict_last hint must be unpadded, in registers, one block a row and "
                         f"whole 16-byte vectors a thread, got {G} groups of {m} over {threads} threads"
                         f"{', staged' if staged else ''}{f', {cluster} blocks a row' if cluster > 1 else ''}")
    rows_per_sample = row_count // samples
    # Where this block's slice of the row starts: bound when the kernel's block index is (a cluster
    # splits the row; otherwise 0).
    slice_start = {"column": 0}

    def col(g, j):
        """Column of element j of group g; clamped in bounds on padded rows (the tail is masked)."""
        if packed:  # a group is a row
            return j
        if cluster > 1:
            return slice_start["column"] + j
        if m == n:
            return g * n + j
        if n % lane_vector == 0:  # a padded row's tail clamped a vector at a time: the loads stay vector loads
            last = n // lane_vector - 1
            return g * n + T.min(j // lane_vector, last) * lane_vector + j % lane_vector
        return T.min(g * n + j, hidden - 1)

    def at(row, g, j):
        """Index of element j of group (or segment) g of ``row`` in a row tensor (packed: of
        block ``row``'s row g, the rows past the last clamped to it)."""
        if packed:
            return (T.min(row * rows_per_block + g, row_count - 1), j)
        return (g, row, j) if segs > 1 else (row, col(g, j))

    def stored(row, g, j):
        """Whether element j of group g of ``row`` is stored: not in a padded row's masked tail, nor
        in a packed block's rows past the last."""
        kept = ([j < n] if masked else []) + ([row * rows_per_block + g < row_count] if packed else [])
        return functools.reduce(T.And, kept) if kept else True


    def in_row(j, x):
        """x for element j of a group; 0 in the masked tail of a padded row."""
        return T.if_then_else(j < n, x, 0.0) if masked else x

    def value(raw, g, j):
        """Element j of group g in f32; 0 in the masked tail of a padded row."""
        return in_row(j, T.Cast(F32, raw[g, j]))

    def centered(raw, mean, g, j):
        """The value the statistic is taken of (minus the mean, for meanvar)."""
        if spec.stat != "meanvar":
            return value(raw, g, j)
        return in_row(j, value(raw, g, j) - mean[g])

    # With few rows (decode) the weight, bias, gain and AdaLN's shift and scale are loaded with the
    # row, so their DRAM latency overlaps the row's instead of following the reduction; W, B, Shift
    # and Scale are then (G, m) fragments. With many rows that costs registers (fewer rows in flight
    # per SM): a tuning choice, but where :func:`prefetches` says.
    if prefetch is None:
        prefetch = prefetches(spec, rows, threads, rows_per_block)

    def affine(V, g, j):
        return T.Cast(F32, V[g, j] if prefetch else V[col(g, j)])

    def modulation(V, row, g, j):
        """AdaLN's shift or scale for element j of group g of ``row`` (its sample's), in f32."""
        return T.Cast(F32, V[g, j] if prefetch else V[row // rows_per_sample, col(g, j)])

    def weighted(y, W, g, j):
        """y times the weight of element j of group g (as the spec has it)."""
        if spec.weight == "w":
            return y * affine(W, g, j)
        if spec.weight == "1+w":
            return y * (1.0 + affine(W, g, j))
        return y

    def normalized(raw, mean, stat, W, B, Shift, Scale, row, g, j):
        """Element j of group g of the output row, in f32."""
        y = weighted(centered(raw, mean, g, j) * stat[g], W, g, j)
        if spec.bias:
            y = y + affine(B, g, j)
        if spec.modulated:
            y = y * (1.0 + modulation(Scale, row, g, j)) + modulation(Shift, row, g, j)
        return y

    def row_fragment(dtype_):
        """A (G, m) register fragment; laid out group-major where block_reducer reduces it."""
        fragment = T.alloc_fragment((G, m), dtype_)
        if own_reducer:
            T.annotate_layout({fragment: group_major(G, m, threads, dtype.itemsize)})
        return fragment

    def group_fragment():
        """A (G,) fragment of per-group results (see ``row_fragment``)."""
        fragment = T.alloc_fragment((G,), F32)
        if own_reducer and G > 1:
            T.annotate_layout({fragment: group_values(G, threads)})
        return fragment

    @T.macro
    def load_row(fragment, element):
        """fragment[g, j] = element(g, j) over the row (a row fragment, see ``row_fragment``)."""
        for g, j in T.Parallel(G, m):
            fragment[g, j] = element(g, j)

    @T.macro
    def stream_row(fragment, element):
        """load_row of a row tensor's elements (``element(g, j)`` indexes one), with evict_last through
        the hint: into a 16-bit fragment first where the row is held in f32."""
        if not evict_last:
            load_row(fragment, element)
        elif str(fragment.dtype) == dt:
            load_vectors_evict_last(fragment, element, m, lanes, lane_vector)
        else:
            loaded = row_fragment(dt)
            load_vectors_evict_last(loaded, element, m, lanes, lane_vector)
            load_row(fragment, lambda g, j: loaded[g, j])

    # Per-element terms of the reductions, as functions of (g, j) for reduce_row.
    def values_of(raw):
        return lambda g, j: value(raw, g, j)

    def statistic_terms(raw, mean):
        def term(g, j):
            c = centered(raw, mean, g, j)
            return T.abs(c) if spec.stat == "l1" else c * c
        return term

    def magnitudes(y):
        def term(g, j):
            return in_row(j, T.abs(y[g, j]))
        return term

    def weighted_magnitudes(raw, W):
        """|x w|, an RMS row's |y| times its rms: its max is taken with the sum of squares."""
        def term(g, j):
            return T.abs(weighted(value(raw, g, j), W, g, j))
        return term

    reduce_own = block_reducer(threads, m, dtype.itemsize, cluster, G, exchange_barriers=exchange_barriers) \
        if own_reducer else None
    absmax_with_statistic = own_reducer and prefetch and absmax_joins_statistic(spec)
    reduce_together = block_reducer(threads, m, dtype.itemsize, cluster, G, together=True,
                                    exchange_barriers=exchange_barriers) if absmax_with_statistic else None
    welford = welford and plain and not masked and spec.stat == "meanvar"
    reduce_moments = moments_reducer(threads, m, dtype.itemsize, cluster, exchange_barriers) if welford else None
    # A row's reductions, each with an exchange slot of its own (Welford's takes the first two).
    slots = {name: i for i, name in enumerate(
        [*(["mean"] if spec.stat == "meanvar" else []), "statistic", *(["absmax"] if spec.quant_min_scale is not None else [])])}
    # A reduction of two results waits on its first slot's barrier alone (block_reduce.cluster_sharer).
    barrier_slots = tuple(i for name, i in slots.items()
                          if not (name == "statistic" and welford) and not (name == "absmax" and absmax_with_statistic))
    init_exchange_barriers = exchange_barrier_initializer(barrier_slots) if exchange_barriers else None

    @T.macro
    def reduce_row(term, out, kind, exchange, slot):
        """out[g] = the sum (or max) of term(g, j) over each group's j (terms are non-negative for max).
        With block_reducer the warps' results meet in ``exchange[slot, :]``, a slot of the kernel's own."""
        if own_reducer:
            reduce_own(term, out, kind, exchange, slot)
        else:
            acc = T.alloc_fragment((G, m), F32)
            for g, j in T.Parallel(G, m):
                acc[g, j] = term(g, j)
            if kind == "sum":
                T.reduce_sum(acc, out, dim=1)
            else:
                T.reduce_max(acc, out, dim=1)

    @T.macro
    def normalize_row(X, W, B, R, Shift, Scale, Gain, Y, Q, S, row, pending=None):
        # By default only the row's raw 16-bit values stay live across the block reductions; every
        # f32 value is recomputed from them where needed. Half the registers of an f32 copy, so more
        # rows are in flight per SM (the bound on these memory-bound kernels); f32_row trades that
        # for one conversion per element.
        raw = T.alloc_shared((G, m), dt) if staged else row_fragment(F32 if f32_row else dt)
        exchange = exchange_slots(len(slots), threads, cluster, exchange_barriers) if own_reducer else None
        if cluster > 1:  # the barriers' inits (if any) go before the cluster's start barrier
            if exchange_barriers:
                init_exchange_barriers(exchange)
            T.cluster_arrive_relaxed()
        stat = group_fragment()
        mean = group_fragment()
        if staged:
            T.async_copy(X[row, 0:m], raw[0, 0:m])
            if spec.residual:
                staged_residual = T.alloc_shared((G, m), dt)
                T.async_copy(R[row, 0:m], staged_residual[0, 0:m])
            T.ptx_wait_group(0)
            T.sync_threads()
        elif pending is not None:  # pipelined: the row arrived in ``pending``, which now takes the next
            load_row(raw, lambda g, j: pending[g, j])
            if row + grid < row_count:
                stream_row(pending, lambda g, j: X[at(row + grid, g, j)])
        else:
            stream_row(raw, lambda g, j: X[at(row, g, j)])
        if prefetch and spec.weight is not None:
            W_row = row_fragment(dt)
            load_row(W_row, lambda g, j: W[col(g, j)])
        if prefetch and spec.bias:
            B_row = row_fragment(dt)
            load_row(B_row, lambda g, j: B[col(g, j)])
        if prefetch and spec.modulated:
            Shift_row, Scale_row = row_fragment(dt), row_fragment(dt)
            load_row(Shift_row, lambda g, j: Shift[row // rows_per_sample, col(g, j)])
            load_row(Scale_row, lambda g, j: Scale[row // rows_per_sample, col(g, j)])
        if prefetch:
            W, B = W_row if spec.weight is not None else W, B_row if spec.bias else B
            Shift, Scale = (Shift_row, Scale_row) if spec.modulated else (Shift, Scale)
        if prefetch and spec.stat == "l2_gain":
            gain = T.alloc_fragment((1,), F32)
            gain[0] = T.Cast(F32, Gain[row, 0])
        if spec.residual:
            residual = (lambda g, j: staged_residual[g, j]) if staged else (lambda g, j: R[at(row, g, j)])
            if evict_last:
                loaded_residual = row_fragment(dt)
                stream_row(loaded_residual, residual)
                residual = lambda g, j: loaded_residual[g, j]
            for g, j in T.Parallel(G, m):
                raw[g, j] = T.Cast(dt, T.Cast(F32, raw[g, j]) + T.Cast(F32, residual(g, j)))
            for g, j in T.Parallel(G, m):
                if stored(row, g, j):
                    R[at(row, g, j)] = raw[g, j]
        if cluster > 1:
            T.cluster_wait()  # every block of the cluster has started: the reductions may write to it
        if welford:
            reduce_moments(lambda j: value(raw, 0, j), mean, stat, exchange)
        else:
            if spec.stat == "meanvar":
                reduce_row(values_of(raw), mean, "sum", exchange, slots["mean"])
                for g in T.Parallel(G):
                    mean[g] = mean[g] / n
            if absmax_with_statistic:
                scale = group_fragment()
                reduce_together(((statistic_terms(raw, mean), stat, "sum", slots["statistic"]),
                                 (weighted_magnitudes(raw, W), scale, "max", slots["absmax"])), exchange)
            else:
                reduce_row(statistic_terms(raw, mean), stat, "sum", exchange, slots["statistic"])
        if segs > 1:
            joint = T.alloc_fragment((1,), F32)
            T.reduce_sum(stat, joint, dim=0)
            for g in T.Parallel(G):
                stat[g] = joint[0]
        for g in T.Parallel(G):
            if spec.stat in ("rms", "meanvar"):
                stat[g] = T.rsqrt(stat[g] / n + spec.eps)
            elif spec.stat == "l2":
                stat[g] = 1.0 / T.max(T.sqrt(stat[g]), spec.eps)
            elif spec.stat == "l1":
                stat[g] = 1.0 / T.max(stat[g], spec.eps)
            else:  # l2_gain
                stat[g] = (gain[0] if prefetch else T.Cast(F32, Gain[row, 0])) / T.sqrt(stat[g])
        if chunked:
            # One vector a thread at a time, a compiler fence after each: the compiler cannot hoist
            # every vector's weight and bias loads above the first store, which took registers for
            # all of them (LayerNorm 4096 wide at 128 threads: 80, 56 chunked). Each vector's loads
            # then wait in turn: faster only on rows 16384 wide. A tuple,
            # not a range, which TileLang would make a loop indexing the row's registers at run time.
            for k in tuple(range(vectors)):
                for i in T.Parallel(threads * vec):
                    j = k * threads * vec + i
                    Y[row, col(0, j)] = T.Cast(dt, normalized(raw, mean, stat, W, B, Shift, Scale, row, 0, j))
                T.call_extern("handle", "npuops_compiler_fence")
        elif spec.quant_min_scale is None:
            for g, j in T.Parallel(G, m):
                raw[g, j] = T.Cast(raw.dtype, normalized(raw, mean, stat, W, B, Shift, Scale, row, g, j))
            for g, j in T.Parallel(G, m):
                if stored(row, g, j):
                    Y[at(row, g, j)] = T.Cast(dt, raw[g, j])
        elif absmax_with_statistic:
            q = row_fragment("int8")
            for g in T.Parallel(G):
                scale[g] = T.max(scale[g] * stat[g] / 127.0, spec.quant_min_scale)
                S[row, 0] = scale[g]
                scale[g] = stat[g] / scale[g]  # q = x w / (rms scale), rounded as in the branch below
            for g, j in T.Parallel(G, m):
                q[g, j] = T.Cast("int8", T.reinterpret(weighted(value(raw, g, j), W, g, j) * scale[g] + ROUNDING_MAGIC,
                                                       "int32"))
            for g, j in T.Parallel(G, m):
                if not masked or j < n:
                    Q[at(row, g, j)] = q[g, j]
        else:
            # y is computed once, in f32, and held for the quantization: computing it again per
            # term of the absmax reduction read the weight (and bias) one element at a time there,
            # which TileLang cannot vectorize inside the reducer's unrolled loop.
            y = raw if f32_row else row_fragment(F32)
            for g, j in T.Parallel(G, m):
                y[g, j] = normalized(raw, mean, stat, W, B, Shift, Scale, row, g, j)
            q = row_fragment("int8")
            scale = group_fragment()
            reduce_row(magnitudes(y), scale, "max", exchange, slots["absmax"])
            for g in T.Parallel(G):
                scale[g] = T.max(scale[g] / 127.0, spec.quant_min_scale)
                S[row, 0] = scale[g]
                # One division per row: an IEEE f32 division per element (about ten instructions
                # and a branch) made the quantizing kernels issue-bound. vLLM multiplies by the
                # inverse too; a value this moves across a .5 boundary is within the int8 tolerance.
                scale[g] = 1.0 / scale[g]
            for g, j in T.Parallel(G, m):
                # y / scale rounded half to even in one FMA: y * (1 / scale) + 1.5 * 2^23 is a float
                # whose low mantissa bits hold the integer, and its low byte is the int8. Two float
                # conversions per element (round, then to int; 16 a clock per SM on sm_90, FP32 math 128)
                # made the quantizing kernels issue-bound. No clamp: |y| <= 127 * scale, so
                # |y / scale| rounds to 127 at most (y is finite).
                q[g, j] = T.Cast("int8", T.reinterpret(y[g, j] * scale[g] + ROUNDING_MAGIC, "int32"))
            for g, j in T.Parallel(G, m):
                if not masked or j < n:
                    Q[at(row, g, j)] = q[g, j]

    row_shape, vec_shape = ((segs, row_count, hidden) if segs > 1 else (row_count, hidden)), (hidden,)
    params: list[tuple[str, tuple[int, ...]]] = []

    def arg(name: str, shape: tuple, type_: str = dt):
        params.append((name, tuple("rows" if d is row_count else d for d in shape)))
        return T.arg(name, T.Tensor(shape, type_))

    @T.prim_func
    def main():
        # Each buffer gets its own Python name: the builder names kernel parameters after them.
        if spec.pair:
            Xq, Wq = arg("q", row_shape), arg("q_weight", vec_shape)
            Xk, Wk = arg("k", row_shape), arg("k_weight", vec_shape)
            Yq, Yk = arg("q_out", row_shape), arg("k_out", row_shape)
        else:
            X = arg(spec.input_name, row_shape)
            R = arg("residual", row_shape) if spec.residual else None
            W = arg("weight", vec_shape) if spec.weight is not None else None
            B = arg("bias", vec_shape) if spec.bias else None
            Shift = arg("shift", (samples, hidden)) if spec.modulated else None
            Scale = arg("scale", (samples, hidden)) if spec.modulated else None
            Gain = arg("g", (row_count, 1)) if spec.stat == "l2_gain" else None
            if spec.quant_min_scale is not None:
                Q, S = arg("q", row_shape, "int8"), arg("scale_out", (row_count, 1), F32)
            else:
                Y = arg("y", row_shape)
        with cluster_kernel(grid * cluster, cluster, threads, 2 if spec.pair else 1,
                            prelude=(COMPILER_FENCE if chunked else "") + (EVICT_LAST_LOAD if evict_last else ""),
                            barriers=exchange_barriers) as (block, which):
            if chunked:  # loads of restrict (read-only) operands would move across the fence
                T.annotate_restrict_buffers(*(V for V in (W, B, Shift, Scale) if V is not None))
            row = block // cluster if cluster > 1 else block
            if cluster > 1:
                slice_start["column"] = block % cluster * span
            if min_blocks > 1:
                T.annotate_min_blocks_per_sm(min_blocks)
            if spec.pair:
                if which == 0:
                    normalize_row(Xq, Wq, None, None, None, None, None, Yq, None, None, row)
                else:
                    normalize_row(Xk, Wk, None, None, None, None, None, Yk, None, None, row)
            elif pipelined:
                pending = row_fragment(dt)
                stream_row(pending, lambda g, j: X[at(block, g, j)])
                for i in T.serial(T.ceildiv(row_count, grid)):
                    if block + i * grid < row_count:
                        if spec.quant_min_scale is not None:
                            normalize_row(X, W, B, R, Shift, Scale, Gain, None, Q, S, block + i * grid, pending)
                        else:
                            normalize_row(X, W, B, R, Shift, Scale, Gain, Y, None, None, block + i * grid, pending)
                    T.sync_threads()  # the next row's reductions write the exchange slots this row's read
            elif spec.quant_min_scale is not None:
                normalize_row(X, W, B, R, Shift, Scale, Gain, None, Q, S, row)
            else:
                normalize_row(X, W, B, R, Shift, Scale, Gain, Y, None, None, row)

    if spec.pair:
        returns = (("q_out", (..., hidden)), ("k_out", (..., hidden)))
    elif spec.quant_min_scale is not None:
        returns = (("q", (..., hidden)), ("scale_out", (..., 1)))
    else:
        # Segments are the first kernel dim: the rows are a dim of their own in what is returned.
        row = (..., "rows", hidden) if segs > 1 else (..., hidden)
        returns = (("y", row),) + ((("residual", row),) if spec.residual else ())
    if spec.pair:  # QK-norm's inputs are named q and k: outputs are told apart by name, not by role
        outputs = {"q_out": dtype, "k_out": dtype}
    elif spec.quant_min_scale is not None:
        outputs = {"q": torch.int8, "scale_out": torch.float32}
    else:
        outputs = {"y": dtype}
    return KernelSpec(main, tuple(params), outputs, returns,
                      {"threads": threads, "min_blocks_per_sm": min_blocks, "padded_to": padded,
                       "masked": masked, "prefetch": prefetch, "warp_reduce": own_reducer, "cluster": cluster,
                       "welford": welford, "staged": staged, "chunked": chunked, "f32_row": f32_row,
                       "pipelined": pipelined, "evict_last": evict_last, "exchange_barriers": exchange_barriers,
                       "rows_per_block": rows_per_block})
