"""TileLang top-k selection (TopkSelectorFwd): an exact radix select that reads each row (query
row, kv group) once. By default as many blocks as the GPU holds at once each take every
``grid``-th row in turn (``grid`` 0: one block per row).

Scores become order-preserving 32-bit keys (negative floats bit-flipped, others with the sign bit
set). Three phases:

1. A sample of the row (``SAMPLE_CHUNKS`` contiguous chunks spread over its range, one step of
   keys) is counted by its top 12 bits (sign, exponent, 3 mantissa bits); the digit where the
   sample's count from the top reaches its share of ``topk``, with a margin, becomes a floor.
2. One read of the row keeps every key at or above the floor, position and key, in shared memory
   (a few thousand on typical scores; ``CANDIDATES`` fit).
3. If the list holds at least ``topk`` keys (so the k-th largest is among them) and did not
   overflow, the selection is finished there: digit rounds (by default four of 8 bits), each
   counting the keys that agree with the digits found so far into a shared histogram, turning it
   into counts from the top with a parallel scan and picking the digit of the k-th largest key,
   give the threshold key T; keys above T take the next slots, keys equal to T fill the remaining
   ones (ties: any of them). Once every key with the digits found so far is needed (after the
   third round, for most rows), the key just below them is T and the rounds stop there.

A block that takes several rows tries the previous row's floor first: where, scaled to this
row's length, it listed at least ``topk`` with a margin, and at most 7/8 of the list and
1.5 ``topk`` + 512 keys (the rounds' work grows with them), it is the floor again and the sample
is skipped (on the catalog's rows, about nine rows in ten in a simulation on the CPU; on the
H200 the time saved was measured, not the count).

Rows of at most ``CANDIDATES`` keys skip the sample (every key is listed). A floor that misjudged
the row (too few keys listed, or more than the list holds, say thousands of equal scores) sends
the row to the exact fallback: the same rounds and the pick re-read the row. The slots a short row
leaves get -1. Exact for every range length (including 0) and every score distribution; only the
speed depends on the floor.

Written with tile-level operators, except the per-thread options (warp shuffles, the marked and
early loads; see :func:`launch_variants`): their twins without them (:func:`tile_level`) build for
TileLang's CPU target, where the tests check the logic against the reference without a GPU. TileLang is imported when a
kernel is built. (No ``from __future__ import annotations``: TileLang evaluates the tensor
annotations, which must see the shapes.)
"""

import torch
from npuops import KernelSpec, multiprocessors

THREADS = 256
VECTOR = 16  # keys each thread loads per step (four 16-byte loads)
DIGIT_BITS = (8, 8, 8, 8)  # the rounds' digits of the 32-bit key, top first
SAMPLE_DIGIT = (20, 12)  # fine enough that the floor's bin adds few keys beyond the margin
BINS = 1 << SAMPLE_DIGIT[1]
CANDIDATES = 4096  # listed keys at most (position and key: 32 KB of shared memory)
SAMPLE_CHUNKS = 32  # the sample: a step's keys in this many chunks spread over the row
BLOCKS_PER_SM = 5
# The default launch, the fastest measured on the H200 (topk 1024 / 2048: 1.83 / 2.07 ms):
# 256 threads, the compiler held to five blocks per SM (a 4096-key list, 34 KB of shared
# memory each), so that four other blocks' loads overlap one block's selection rounds; as many
# blocks as fit at once (``grid``: :func:`default_grid`, left out here as it depends on the GPU),
# each taking every grid-th row and reusing floors; warp shuffles for the scans and the slot
# reservations; listed keys marked once per step; the next row's first step loaded during a row's
# rounds.
DEFAULT = {"threads": THREADS, "vector": VECTOR, "blocks_per_sm": BLOCKS_PER_SM, "candidates": CANDIDATES,
           "warp_scan": True, "warp_append": True, "digit_bits": DIGIT_BITS, "marks": True, "lead": True}


def default_grid() -> int:
    """The default launch's ``grid``: as many blocks as the GPU holds at once."""
    return multiprocessors() * BLOCKS_PER_SM


def launch_variants() -> list[dict]:
    """The launch configurations ``npuops run --tune`` chooses among, the default first.

    - ``blocks_per_sm`` holds the compiler to the registers of that many blocks per SM (0: its own
      choice); ``candidates``, the list's length, sets the shared memory a block takes.
    - ``warp_scan``: histograms are counted from the top by warp shuffles (each thread sums its
      own digits, a shuffle scan over the lanes, one scratch entry per warp): two barriers per
      histogram instead of two per level of a tile-level scan.
    - ``warp_append``: each warp reserves its listed keys' slots with one atomic per step (a
      shuffle scan of the threads' counts) instead of one per key, and so the selected keys'
      output slots.
    - ``marks``: each thread marks its listed keys once, in a bitmask that the count and the
      writes both read, and compares only the floor on steps inside the row. It needs 40
      registers (ptxas), so six blocks per SM fit (34 KB of shared memory each).
    - ``lead``: the row's first step is loaded before the sample is counted (with ``grid``:
      during the previous row's rounds), so that its latency overlaps them (48 registers at five
      blocks per SM, no spills).
    - ``grid``: that many blocks (by default the GPU's SMs times five), each taking every
      grid-th row and handing its floor on to the next (0: a block per row, each sampling its row).

    The ``warp_`` options, ``marks`` and ``lead`` are written per thread, which TileLang's CPU target cannot
    build; :func:`tile_level` gives a configuration's twin without them. Measured on the H200
    (topk 1024 / 2048, ms): 512 threads with tile-level scans
    and appends 4.00 / 4.51; 256 threads, four blocks per SM with a 6144-key list 2.51 / 2.76,
    without the warp options 3.39 / 3.85, with five blocks per SM and 4096 keys 2.30 / 2.62; with
    the early end of the rounds 2.27 / 2.54, with ``marks`` 2.19 / 2.45 (six blocks per SM: 2.19
    / 2.46), with ``lead`` 2.14 / 2.44; with ``grid`` 1.86 / 2.09, and with ``lead`` too (the
    default) 1.83 / 2.07.
    Tried and dropped: 1024 threads (5.6 / 6.1), 128 threads (2.74 for topk 1024), a blocked
    tile-level scan (3.51 / 3.99 at 512 threads), three rounds of (12, 10, 10) bits (3.03 /
    3.26 at 512 threads, against 3.09 / 3.32 with four), the next step's loads issued before a
    step is listed (2.97 for topk 2048 at best: more registers, no gain), the rounds counted
    with one atomic per warp and digit through ``__match_any_sync`` (2.67 against 2.54), and
    rounds on the listed keys less the floor, skipping those whose digits are all 0 (2.20 / 2.49
    against 2.18 / 2.45: the pass that finds the largest listed key cost more than the round it
    saved)."""
    default = {**DEFAULT, "grid": default_grid()}
    return [default, {**default, "lead": False}, {**default, "grid": 0}]


def tile_level(config: dict) -> dict:
    """``config`` without its per-thread options (same sample, list and layout)."""
    return {**config, "warp_scan": False, "warp_append": False, "marks": False, "lead": False}


def scan_span(bits: int, threads: int) -> int:
    """Histogram entries a round clears and scans: at least one per thread, since a parallel
    loop shorter than the block runs on some threads only, and TileLang then drops the barriers
    between the scan's steps (measured: wrong digits, then writes past the row)."""
    return max(1 << bits, threads)


def sample_position(start, length, i, sample: int):
    """Position of the sample's i-th key in a row [start, start + length) longer than a chunk (on
    Python ints for the tests, on TileLang expressions in the kernel)."""
    chunk = sample // SAMPLE_CHUNKS
    return start + (i // chunk) * ((length - chunk) // (SAMPLE_CHUNKS - 1)) + i % chunk


def sample_quota(taken, length, sample: int):
    """Sampled keys the floor must leave above it: the sample's share of the ``taken`` keys, 25 %
    more and 16 more, so that (sampling noise aside) the listed keys reach ``taken``."""
    return taken * sample * 5 // (4 * length) + 16


def select_kernel(batch: int, seq_len: int, seq_len_kv: int, kv_group: int, topk: int,
                  threads: int = DEFAULT["threads"], vector: int = DEFAULT["vector"],
                  blocks_per_sm: int = DEFAULT["blocks_per_sm"], warp_append: bool = DEFAULT["warp_append"],
                  candidates: int = DEFAULT["candidates"], warp_scan: bool = DEFAULT["warp_scan"],
                  digit_bits: tuple[int, ...] = DEFAULT["digit_bits"], marks: bool = DEFAULT["marks"],
                  lead: bool = DEFAULT["lead"], grid: int | None = None) -> KernelSpec:
    import tilelang.language as T

    if grid is None:
        grid = default_grid()
    STEP = threads * vector  # keys a block loads per step; also the sample's size

    rows = batch * seq_len * kv_group
    blocks = min(grid, rows) if grid else rows  # ``grid``: each block takes every grid-th row
    # One shared int32 buffer (TileLang's CPU target allows a single one): histogram / counts from
    # the top with its scan scratch, listed positions and their keys (so the rounds never re-read
    # them), a few counters. The sample's histogram and scratch (2 x BINS) lie in the list's area,
    # which is only filled once the sample is done; the rounds' own (one entry per thread each)
    # follow the list: 34 KB with the default list (66 KB if every area had its own).
    rounds = [(32 - sum(digit_bits[:i + 1]), bits) for i, bits in enumerate(digit_bits)]  # (shift, bits)
    round_span = scan_span(max(digit_bits), threads)
    assert sum(digit_bits) == 32 and BINS <= candidates and round_span <= BINS  # the layouts below
    assert warp_append or not (marks or lead)  # both are the per-thread read's
    CAND, CAND_KEY = 0, candidates
    SAMPLE_HIST, HIST = 0, 2 * candidates
    counters = HIST + 2 * round_span
    CHOSEN, ABOVE, TIES, COUNT = (counters + i for i in range(4))
    # A row's steps are whole vectors when they divide it; otherwise positions past it are clamped.
    whole_steps = seq_len_kv % STEP == 0

    def key_of(score):
        bits = T.reinterpret(score, "uint32")
        return T.if_then_else(score < 0, ~bits, bits | T.uint32(0x80000000))

    def digit(key, shift, bits):
        return T.Cast("int32", (key >> shift) & T.uint32((1 << bits) - 1))

    def matches(key, threshold, shift, bits):
        """key agrees with the threshold on the digits above this round's."""
        return True if shift + bits == 32 else (key >> (shift + bits)) == (threshold >> (shift + bits))

    def floor_still_fits(floor, listed, listed_length, length, taken):
        """Whether a row of ``length`` keys, with the rows' score distribution the same, would list
        at least ``taken`` with a margin and at most 7/8 of the list (and at most 1.5 ``taken`` +
        512, so that the rounds stay short) at the floor that listed ``listed`` of ``listed_length``
        keys: then ``grid`` takes it instead of sampling. Misjudged, the row takes the exact
        fallback (and the next one samples)."""
        expected = T.Cast("float32", listed) * T.Cast("float32", length) / T.Cast("float32", T.max(listed_length, 1))
        return (T.Cast("int32", floor >> 1) != 0) & (expected >= T.Cast("float32", taken + taken // 8 + 64)) & (
            expected <= T.Cast("float32", T.min(candidates - candidates // 8, taken + taken // 2 + 512)))

    def clamped(pos):
        return pos if whole_steps else T.min(pos, seq_len_kv - 1)

    def listable(pos, score, start, end, floor):
        return (pos >= start) & (pos < end) & (key_of(score) >= floor)

    @T.macro
    def load_step(vals, Scores, b, s, g, step):
        """The row's scores at positions step * STEP + i, all loads issued before any is used: a
        plain copy, which TileLang turns into 16-byte loads (the keys are made where they are used;
        converting here kept the loads scalar: 1.4 TB/s)."""
        for i in T.Parallel(STEP):
            pos = step * STEP + i
            vals[i] = Scores[b, s, clamped(pos), g]

    @T.macro
    def load_own(own, Scores, b, s, g, step, tx):
        """Thread tx's scores of a step: positions step * STEP + (j * threads + tx) * 4 + v for j <
        vector / 4, v < 4 (16-byte loads)."""
        for j in T.unroll(vector // 4):
            for v in T.vectorized(4):
                own[j * 4 + v] = Scores[b, s, clamped(step * STEP + (j * threads + tx) * 4 + v), g]

    def row_coordinates(r):
        """(batch, query row, kv group) of row r."""
        return r // (seq_len * kv_group), (r // kv_group) % seq_len, r % kv_group

    @T.macro
    def load_first_step(own, Scores, Starts, Ends, r, tx):
        """Thread tx's scores of row r's first step (``lead``)."""
        b, s, g = row_coordinates(r)
        if Starts[b, s] // STEP < T.ceildiv(Ends[b, s], STEP):
            load_own(own, Scores, b, s, g, Starts[b, s] // STEP, tx)

    def own_position(step, tx, e):
        """The position of thread tx's e-th score of a step (see load_own)."""
        return step * STEP + ((e // 4) * threads + tx) * 4 + e % 4

    def listed_here(marked, e, pos, score, start, end, floor):
        """Whether a thread's e-th score of the step, at pos, is listed."""
        return ((marked[0] >> e) & 1) == 1 if marks else listable(pos, score, start, end, floor)

    @T.macro
    def mark_listed(marked, own, step, tx, start, end, floor_score, bounded):
        """Bit e of marked[0]: own[e] is listed, computed once for the count and the writes
        (``bounded``: the step crosses an end of the row; inside it only the floor is compared).
        Scores are compared as floats, with the floor's score: the same keys, except that -0.0
        passes a floor of +0.0 (its key is the next below), and a list of the keys from some
        key up is all the rounds need. (NaN scores, outside the op's finite inputs, are never
        listed: their rows take the exact fallback.)"""
        marked[0] = 0
        for e in T.unroll(vector):
            kept = own[e] >= floor_score[0]
            if bounded:
                kept = kept & (own_position(step, tx, e) >= start) & (own_position(step, tx, e) < end)
            marked[0] = marked[0] | T.if_then_else(kept, 1 << e, 0)

    def row_steps(start, end):
        """The steps covering [start, end)."""
        return T.serial(start // STEP, T.ceildiv(end, STEP))

    @T.macro
    def count_row(shared, vals, Scores, b, s, g, start, end, threshold, shift, bits):
        for step in row_steps(start, end):
            load_step(vals, Scores, b, s, g, step)
            for i in T.Parallel(STEP):
                pos = step * STEP + i
                if pos >= start and pos < end and matches(key_of(vals[i]), threshold, shift, bits):
                    T.atomic_add(shared[HIST + digit(key_of(vals[i]), shift, bits)], 1)

    def candidate_key(shared, c):
        return key_of(T.reinterpret(shared[CAND_KEY + c], "float32"))

    @T.macro
    def count_candidates(shared, listed, threshold, shift, bits):
        for step in T.serial(T.ceildiv(listed, threads)):
            for i in T.Parallel(threads):
                c = T.min(step * threads + i, candidates - 1)
                if step * threads + i < listed and matches(candidate_key(shared, c), threshold, shift, bits):
                    T.atomic_add(shared[HIST + digit(candidate_key(shared, c), shift, bits)], 1)

    def scratch_of(hist):
        """The scan scratch that follows a histogram (the sample's or the rounds')."""
        return hist + (BINS if hist == SAMPLE_HIST else round_span)

    @T.macro
    def suffix_scan(shared, scratch, first, count, levels):
        """shared[first + i] becomes the sum of entries i.. of ``count`` (at least one per thread;
        those from 1 << levels on are zero), by a parallel scan through the scratch area."""
        for level in T.serial(levels):
            for i in T.Parallel(count):
                shared[scratch + i] = shared[first + i] + T.if_then_else(
                    i + (1 << level) < count, shared[first + T.min(i + (1 << level), count - 1)], 0)
            T.sync_threads()
            for i in T.Parallel(count):
                shared[first + i] = shared[scratch + i]
            T.sync_threads()

    @T.macro
    def warp_suffix_scan(shared, scratch, hist, per):
        """The same as the scans above with two barriers instead of two per level: thread t sums
        its ``per`` entries, a shuffle scan adds those of the lanes above it, one scratch entry per
        warp those of the warps above."""
        tx = T.get_thread_binding()
        lane, warp = tx % 32, tx // 32
        own = T.alloc_var("int32")
        from_lane = T.alloc_var("int32")  # the sums of this lane and the lanes above it
        below = T.alloc_var("int32")
        own = 0
        for p in T.unroll(per):
            own = own + shared[hist + tx * per + p]
        from_lane = own
        for d in (1, 2, 4, 8, 16):
            below = T.shfl_down(from_lane, d)
            if lane + d < 32:
                from_lane = from_lane + below
        if lane == 0:
            shared[scratch + warp] = from_lane
        T.sync_threads()
        below = from_lane - own  # then: the entries after this thread's last, summed
        for w in T.unroll(threads // 32):
            if w > warp:
                below = below + shared[scratch + w]
        for p in T.unroll(per):  # from the thread's last entry down
            below = below + shared[hist + tx * per + per - 1 - p]
            shared[hist + tx * per + per - 1 - p] = below
        T.sync_threads()

    @T.macro
    def count_from_top(shared, hist, bits):
        """shared[hist + d] becomes the counted keys with digit >= d (see launch_variants)."""
        span = scan_span(bits, threads)  # entries past the digit's range are zero
        per = span // threads
        scratch = scratch_of(hist)
        if warp_scan:
            warp_suffix_scan(shared, scratch, hist, per)
        else:
            suffix_scan(shared, scratch, hist, span, bits)

    @T.macro
    def choose_digit(shared, hist, need, bits):
        """Counts from the top (shared[hist + d] = counted keys with digit >= d); then the digit
        where that count reaches ``need`` (0 if none does) goes to shared[CHOSEN], written by
        exactly one thread, and every thread may read it."""
        T.sync_threads()  # every thread's atomics have landed
        count_from_top(shared, hist, bits)
        n = 1 << bits
        for i in T.Parallel(n):  # the counts only fall with the digit: one digit qualifies
            if (i == 0 or shared[hist + i] >= need) and (i == n - 1 or shared[hist + T.min(i + 1, n - 1)] < need):
                shared[CHOSEN] = i
        T.sync_threads()

    def above_chosen(shared, bits):
        """Counted keys whose digit is above the chosen one."""
        n = 1 << bits
        return T.if_then_else(shared[CHOSEN] < n - 1, shared[HIST + T.min(shared[CHOSEN] + 1, n - 1)], 0)

    @T.macro
    def pick(shared, Indices, b, s, g, pos, key, threshold, need, taken):
        """Keys above the threshold take the next slot; equal ones the last ``need`` slots."""
        # Compared as int64: inside the grid's row loop, TVM's bound solver fails on these
        # unsigned conditions ("cannot make uint from negative value -1").
        if T.Cast("int64", key) > T.Cast("int64", threshold):
            # The slot is bound once: used inline as an index, TileLang's bounds check repeats the
            # atomic (three increments per key).
            slot = T.atomic_add(shared[ABOVE], 1, return_prev=True)
            Indices[b, s, g, slot] = pos
        elif T.Cast("int64", key) == T.Cast("int64", threshold):
            tie = T.atomic_add(shared[TIES], 1, return_prev=True)
            if tie < need:
                Indices[b, s, g, taken - need + tie] = pos

    @T.macro
    def reserve_slots(shared, counter, count, reserved):
        """Every thread of the block wants ``count`` consecutive slots of shared[counter]; each warp
        takes its threads' together with one atomic (a shuffle scan of the counts gives each
        thread its place), and reserved[0] becomes the thread's first slot. Called by every
        thread alike (the shuffles need the whole warp); reserved[1], [2]: scratch."""
        lane = T.get_thread_binding() % 32
        reserved[0] = count  # then: the sum of the counts of this lane and those below it
        for d in (1, 2, 4, 8, 16):
            reserved[2] = T.shfl_up(reserved[0], d)
            if lane >= d:
                reserved[0] = reserved[0] + reserved[2]
        reserved[1] = 0
        if lane == 31:
            reserved[1] = T.atomic_add(shared[counter], reserved[0], return_prev=True)
        reserved[0] = T.shfl_sync(reserved[1], 31) + reserved[0] - count

    @T.macro
    def clear(shared, first, count):
        for i in T.Parallel(count):
            shared[first + i] = 0
        T.sync_threads()

    @T.prim_func
    def main(Scores: T.Tensor((batch, seq_len, seq_len_kv, kv_group), "float32"),
             Starts: T.Tensor((batch, seq_len), "int32"), Ends: T.Tensor((batch, seq_len), "int32"),
             Indices: T.Tensor((batch, seq_len, kv_group, topk), "int32")):
        with T.Kernel(blocks, threads=threads) as block:
            if blocks_per_sm:  # the register budget (0: the compiler's)
                T.annotate_min_blocks_per_sm(blocks_per_sm)
            shared = T.alloc_shared((COUNT + 1,), "int32")
            vals = T.alloc_fragment((STEP,), "float32")  # one step's scores
            # The sample apart: sharing a fragment with its scattered loads kept the steps' loads scalar.
            sampled = T.alloc_fragment((STEP,), "float32")
            floor = T.alloc_var("uint32")  # keys at or above it are listed
            if warp_append:
                tx = T.get_thread_binding()
                own = T.alloc_local((vector,), "float32")  # this thread's scores of a step
                marked = T.alloc_local((1,), "int32")  # see mark_listed (``marks``)
                floor_score = T.alloc_local((1,), "float32")  # the floor's score (``marks``)
                kept_own = T.alloc_var("int32")
                reserved = T.alloc_local((3,), "int32")  # see reserve_slots
            listed = T.alloc_var("int32")
            threshold = T.alloc_var("uint32")  # the digits of the k-th largest key found so far
            need = T.alloc_var("int32")  # keys still to take among those matching them
            finished = T.alloc_var("int32")  # 1: the threshold is final before the last round
            # The previous row's floor (0: none to reuse), listed keys and length (``grid``)
            reused_floor = T.alloc_var("uint32")
            reused_listed = T.alloc_var("int32")
            reused_length = T.alloc_var("int32")
            reused_floor = 0
            reused_listed = 0
            reused_length = 0
            for row_of_block in T.serial(T.ceildiv(rows - block, blocks) if grid else 1):
                r = block + row_of_block * blocks
                if grid:
                    T.sync_threads()  # the previous row's readers are done with the shared areas
                b, s, g = row_coordinates(r)
                start = Starts[b, s]
                end = Ends[b, s]
                length = T.max(end - start, 0)
                taken = T.min(length, topk)
                clear(shared, ABOVE, 3)
                floor = 0
                if lead and (not grid or row_of_block == 0):  # in flight while the sample is counted
                    load_first_step(own, Scores, Starts, Ends, r, tx)
                if bool(grid) and length > candidates and floor_still_fits(reused_floor, reused_listed, reused_length, length, taken):
                    floor = reused_floor
                elif length > candidates:
                    shift, bits = SAMPLE_DIGIT
                    clear(shared, SAMPLE_HIST, scan_span(bits, threads))
                    for i in T.Parallel(STEP):
                        sampled[i] = Scores[b, s, sample_position(start, length, i, STEP), g]
                    for i in T.Parallel(STEP):
                        T.atomic_add(shared[SAMPLE_HIST + digit(key_of(sampled[i]), shift, bits)], 1)
                    choose_digit(shared, SAMPLE_HIST, sample_quota(taken, length, STEP), bits)
                    floor = T.Cast("uint32", shared[CHOSEN]) << shift
                if marks:
                    if floor >= T.uint32(0x80000000):
                        floor_score[0] = T.reinterpret(floor & T.uint32(0x7FFFFFFF), "float32")
                    elif floor > T.uint32(0):
                        floor_score[0] = T.reinterpret(~floor, "float32")
                    else:  # no sample: every score is listed
                        floor_score[0] = -T.infinity("float32")
                if warp_append:
                    for step in row_steps(start, end):
                        if not lead or step > start // STEP:
                            load_own(own, Scores, b, s, g, step, tx)
                        if marks:
                            if (step * STEP >= start) & ((step + 1) * STEP <= end):
                                mark_listed(marked, own, step, tx, start, end, floor_score, False)
                            else:
                                mark_listed(marked, own, step, tx, start, end, floor_score, True)
                            kept_own = T.call_extern("int32", "__popc", marked[0])
                        else:
                            kept_own = 0
                            for e in T.unroll(vector):
                                if listable(own_position(step, tx, e), own[e], start, end, floor):
                                    kept_own = kept_own + 1
                        reserve_slots(shared, COUNT, kept_own, reserved)
                        for e in T.unroll(vector):
                            pos = own_position(step, tx, e)
                            if listed_here(marked, e, pos, own[e], start, end, floor):
                                if reserved[0] < candidates:
                                    shared[CAND + reserved[0]] = pos
                                    shared[CAND_KEY + reserved[0]] = T.reinterpret(own[e], "int32")
                                reserved[0] = reserved[0] + 1
                else:
                    for step in row_steps(start, end):
                        load_step(vals, Scores, b, s, g, step)
                        for i in T.Parallel(STEP):
                            pos = step * STEP + i
                            if listable(pos, vals[i], start, end, floor):
                                slot = T.atomic_add(shared[COUNT], 1, return_prev=True)
                                if slot < candidates:
                                    shared[CAND + slot] = pos
                                    shared[CAND_KEY + slot] = T.reinterpret(vals[i], "int32")  # the score's bits
                T.sync_threads()
                if lead and grid and r + blocks < rows:  # the next row's, in flight during the rounds
                    load_first_step(own, Scores, Starts, Ends, r + blocks, tx)
                listed = shared[COUNT]
                kept = listed >= taken and listed <= candidates  # else the exact fallback re-reads the row
                threshold = 0
                need = taken
                finished = 0
                for shift, bits in rounds:
                    if finished == 0:
                        T.sync_threads()  # the last round's readers are done with the histogram
                        clear(shared, HIST, scan_span(bits, threads))
                        if kept:
                            count_candidates(shared, listed, threshold, shift, bits)
                        else:
                            count_row(shared, vals, Scores, b, s, g, start, end, threshold, shift, bits)
                        choose_digit(shared, HIST, need, bits)
                        threshold = threshold | (T.Cast("uint32", shared[CHOSEN]) << shift)
                        # Every key with the digits found so far is taken (usually so after the third
                        # round): the threshold becomes the key just below them, no rounds more.
                        if shift > 0 and need == shared[HIST + shared[CHOSEN]] and threshold > T.uint32(0):
                            threshold = threshold - T.uint32(1)
                            need = 0
                            finished = 1
                        else:
                            need = need - above_chosen(shared, bits)
                if warp_append and kept:
                    for step in T.serial(T.ceildiv(listed, threads)):
                        c = T.min(step * threads + tx, candidates - 1)
                        above = (step * threads + tx < listed) & (candidate_key(shared, c) > threshold)
                        reserve_slots(shared, ABOVE, T.Cast("int32", above), reserved)
                        if above:
                            Indices[b, s, g, reserved[0]] = shared[CAND + c]
                        elif step * threads + tx < listed:  # ties (few): one atomic each
                            pick(shared, Indices, b, s, g, shared[CAND + c], candidate_key(shared, c), threshold, need, taken)
                elif kept:
                    for step in T.serial(T.ceildiv(listed, threads)):
                        for i in T.Parallel(threads):
                            c = T.min(step * threads + i, candidates - 1)
                            if step * threads + i < listed:
                                pick(shared, Indices, b, s, g, shared[CAND + c], candidate_key(shared, c), threshold, need, taken)
                else:
                    for step in row_steps(start, end):
                        load_step(vals, Scores, b, s, g, step)
                        for i in T.Parallel(STEP):
                            pos = step * STEP + i
                            if pos >= start and pos < end:
                                pick(shared, Indices, b, s, g, pos, key_of(vals[i]), threshold, need, taken)
                for i in T.Parallel(topk):
                    if i >= taken:
                        Indices[b, s, g, i] = -1
                if grid:  # a floor that listed the top-k and fitted is tried on the next row
                    reused_floor = T.if_then_else(kept, floor, T.uint32(0))
                    reused_listed = listed
                    reused_length = length

    out_shape = (batch, seq_len, kv_group, topk)
    return KernelSpec(
        main,
        (("index_score", (batch, seq_len, seq_len_kv, kv_group)), ("starts", (batch, seq_len)),
         ("ends", (batch, seq_len)), ("indices", out_shape)),
        {"indices": torch.int32},
        (("indices", out_shape),),
        {"threads": threads, "vector": vector, "blocks_per_sm": blocks_per_sm, "warp_append": warp_append,
         "warp_scan": warp_scan, "digit_bits": list(digit_bits), "marks": marks, "lead": lead, "grid": grid,
         "sample_digit_bits": SAMPLE_DIGIT[1], "candidates": candidates},
        # The barriers are placed by hand: TileLang's own pass put one before every shared-memory
        # write of the row's read (8 per step), which kept warps from running ahead to the next
        # step's loads.
        {"tl.disable_thread_storage_sync": True},
    )
