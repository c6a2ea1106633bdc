"""TileLang top-k selection (TopkSelectorFwd): an exact radix select, one thread block per
(query row, kv group), that reads the row once.

Scores become order-preserving 32-bit keys (negative floats bit-flipped, others with the sign bit
set). Three phases:

1. A sample of the row (``SAMPLE_CHUNKS`` contiguous chunks spread over its range, one step of
   keys) is counted by its top 12 bits (sign, exponent, 3 mantissa bits); the digit where the
   sample's count from the top reaches its share of ``topk``, with a margin, becomes a floor.
2. One read of the row keeps every key at or above the floor, position and key, in shared memory
   (a few thousand on typical scores; ``CANDIDATES`` fit).
3. If the list holds at least ``topk`` keys (so the k-th largest is among them) and did not
   overflow, the selection is finished there: four 8-bit digit rounds, each counting the keys that
   agree with the digits found so far into a shared histogram, turning it into counts from the
   top with a parallel scan and picking the digit of the k-th largest key, give the threshold key
   T; keys above T take the next slots, keys equal to T fill the remaining ones (ties: any of them).

Rows of at most ``CANDIDATES`` keys skip the sample (every key is listed). A sample that misjudged
the row (too few keys listed, or more than the list holds, say thousands of equal scores) sends
the row to the exact fallback: the same rounds and the pick re-read the row. The slots a short row
leaves get -1. Exact for every range length (including 0) and every score distribution; only the
speed depends on the sample.

Written with tile-level operators only (no thread indices), so it also builds for TileLang's CPU
target, where the tests check it against the reference without a GPU. TileLang is imported when a
kernel is built. (No ``from __future__ import annotations``: TileLang evaluates the tensor
annotations, which must see the shapes.)
"""

import torch
from npuops.kernels import KernelSpec

THREADS = 1024
VECTOR = 8  # keys each thread loads per step: 32 KB of a row in flight per block, not 4 KB
# Digit rounds over the 32-bit key, top first: (shift, bits).
ROUNDS = ((24, 8), (16, 8), (8, 8), (0, 8))
SAMPLE_DIGIT = (20, 12)  # fine enough that the floor's bin adds few keys beyond the margin
BINS = 1 << SAMPLE_DIGIT[1]
CANDIDATES = 8192  # listed keys (position and key: 64 KB of shared memory, two blocks per SM)
SAMPLE_CHUNKS = 32  # the sample: a step's keys in this many chunks spread over the row
WARP = 32  # threads per warp: each warp lists into its own part of the list
STEP_OF_DEFAULT = THREADS * VECTOR  # keys per step (and sampled) at the default launch


def launch_variants() -> list[dict[str, int]]:
    """(threads, keys per thread and step) ``npuops run --tune`` chooses among, the default first."""
    return [{"threads": t, "vector": v} for t, v in ((THREADS, VECTOR), (THREADS // 2, VECTOR * 2),
                                                      (THREADS // 2, VECTOR), (THREADS, VECTOR * 2))]


def sample_position(start, length, i, sample: int):
    """Position of the sample's i-th key in a row [start, start + length) longer than a chunk (on
    Python ints for the tests, on TileLang expressions in the kernel)."""
    chunk = sample // SAMPLE_CHUNKS
    return start + (i // chunk) * ((length - chunk) // (SAMPLE_CHUNKS - 1)) + i % chunk


def sample_quota(taken, length, sample: int):
    """Sampled keys the floor must leave above it: the sample's share of the ``taken`` keys, 25 %
    more and 16 more, so that (sampling noise aside) the listed keys reach ``taken``."""
    return taken * sample * 5 // (4 * length) + 16


def select_kernel(batch: int, seq_len: int, seq_len_kv: int, kv_group: int, topk: int, threads: int = THREADS,
                  vector: int = VECTOR) -> KernelSpec:
    import tilelang.language as T

    STEP = threads * vector  # keys a block loads per step; also the sample's size
    WARPS = threads // WARP
    PER_WARP = CANDIDATES // WARPS  # each warp lists into its own part of the list

    rows = batch * seq_len * kv_group
    # One shared int32 buffer (TileLang's CPU target allows a single one): histograms (a round's in
    # BINS >> bits copies), scan scratch, the list (positions and keys, so the rounds never re-read
    # them), each warp's listed count, and a few scalars.
    HIST, SCRATCH, CAND, CAND_KEY = 0, BINS, 2 * BINS, 2 * BINS + CANDIDATES
    WARP_LISTED = 2 * BINS + 2 * CANDIDATES
    CHOSEN, ABOVE, TIES, LISTED, OVERFLOW = (WARP_LISTED + WARPS + i for i in range(5))
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

    def copy_of(i, bits):
        """The histogram copy the thread running parallel index i counts into: copies split the
        atomics that would otherwise pile onto the few digits most keys share (a parallel loop's
        index i runs on thread i % threads)."""
        return (i % (BINS >> bits)) << bits

    @T.macro
    def load_step(vals, Scores, b, s, g, step):
        """The row's keys at positions step * STEP + i, all loads issued before any is used."""
        for i in T.Parallel(STEP):
            pos = step * STEP + i
            vals[i] = key_of(Scores[b, s, pos if whole_steps else T.min(pos, seq_len_kv - 1), g])

    def row_steps(start, end):
        """The steps covering [start, end)."""
        return T.serial(start // STEP, T.ceildiv(end, STEP))

    @T.macro
    def count_row(shared, vals, Scores, b, s, g, start, end, threshold, shift, bits):
        for step in row_steps(start, end):
            load_step(vals, Scores, b, s, g, step)
            for i in T.Parallel(STEP):
                pos = step * STEP + i
                if pos >= start and pos < end and matches(vals[i], threshold, shift, bits):
                    T.atomic_add(shared[HIST + copy_of(i, bits) + digit(vals[i], shift, bits)], 1)

    def is_listed(shared, c):
        return c % PER_WARP < T.min(shared[WARP_LISTED + c // PER_WARP], PER_WARP)

    def candidate_key(shared, c):
        return T.reinterpret(shared[CAND_KEY + c], "uint32")

    def list_steps():
        """The list's slots, a block's worth (one per thread) at a time: c = step * threads + i."""
        return T.serial(CANDIDATES // threads)

    @T.macro
    def count_candidates(shared, threshold, shift, bits):
        for step in list_steps():
            for i in T.Parallel(threads):
                c = step * threads + i
                if is_listed(shared, c) and matches(candidate_key(shared, c), threshold, shift, bits):
                    T.atomic_add(shared[HIST + copy_of(i, bits) + digit(candidate_key(shared, c), shift, bits)], 1)

    def scan_span(bits):
        """Histogram entries a round scans: at least one per thread, since a parallel loop shorter
        than the block runs on some threads only, and TileLang then drops the barriers between the
        scan's steps (measured: wrong digits, then writes past the row)."""
        return max(1 << bits, threads)

    @T.macro
    def suffix_sums(shared, span, levels):
        """shared[HIST + i] becomes the sum of entries i.. of the first 1 << levels (later ones zero)."""
        for level in T.serial(levels):
            for i in T.Parallel(span):
                shared[SCRATCH + i] = shared[HIST + i] + T.if_then_else(
                    i + (1 << level) < span, shared[HIST + T.min(i + (1 << level), span - 1)], 0)
            T.sync_threads()
            for i in T.Parallel(span):
                shared[HIST + i] = shared[SCRATCH + i]
            T.sync_threads()

    @T.macro
    def choose_digit(shared, need, bits):
        """Counts from the top (shared[HIST + d] = counted keys with digit >= d, the copies summed),
        by a parallel scan; then the digit where that count reaches ``need`` (0 if none does) goes
        to shared[CHOSEN], written by exactly one thread, and every thread may read it."""
        T.sync_threads()  # every thread's atomics have landed
        n, copies, span = 1 << bits, BINS >> bits, scan_span(bits)
        if copies > 1:
            for i in T.Parallel(span):
                shared[SCRATCH + i] = T.if_then_else(
                    i < n, sum(shared[HIST + (c << bits) + T.min(i, n - 1)] for c in range(copies)), 0)
            T.sync_threads()
            for i in T.Parallel(span):
                shared[HIST + i] = shared[SCRATCH + i]
            T.sync_threads()
        suffix_sums(shared, span, bits)
        for i in T.Parallel(n):  # the counts only fall with the digit: one digit qualifies
            if (i == 0 or shared[HIST + i] >= need) and (i == n - 1 or shared[HIST + T.min(i + 1, n - 1)] < need):
                shared[CHOSEN] = i
        T.sync_threads()

    def above_chosen(shared, bits):
        """Counted keys whose digit is above the chosen one."""
        n = 1 << bits
        return T.if_then_else(shared[CHOSEN] < n - 1, shared[HIST + T.min(shared[CHOSEN] + 1, n - 1)], 0)

    @T.macro
    def take_tie(shared, Indices, b, s, g, pos, need, taken):
        """Keys equal to the threshold fill the last ``need`` slots."""
        # The slot is bound once: used inline as an index, TileLang's bounds check repeats the
        # atomic (three increments per key).
        tie = T.atomic_add(shared[TIES], 1, return_prev=True)
        if tie < need:
            Indices[b, s, g, taken - need + tie] = pos

    @T.macro
    def clear(shared, first, count):
        for i in T.Parallel(count):
            shared[first + i] = 0
        T.sync_threads()

    @T.prim_func
    def main(Scores: T.Tensor((batch, seq_len, seq_len_kv, kv_group), "float32"),
             Starts: T.Tensor((batch, seq_len), "int32"), Ends: T.Tensor((batch, seq_len), "int32"),
             Indices: T.Tensor((batch, seq_len, kv_group, topk), "int32")):
        with T.Kernel(rows, threads=threads) as r:
            shared = T.alloc_shared((WARP_LISTED + WARPS + 5,), "int32")
            vals = T.alloc_fragment((STEP,), "uint32")  # one step's keys (or the sample)
            slots = T.alloc_fragment((threads,), "int32")  # each thread's next output slot
            floor = T.alloc_var("uint32")  # keys at or above it are listed
            threshold = T.alloc_var("uint32")  # the digits of the k-th largest key found so far
            need = T.alloc_var("int32")  # keys still to take among those matching them
            b = r // (seq_len * kv_group)
            s = (r // kv_group) % seq_len
            g = r % kv_group
            start = Starts[b, s]
            end = Ends[b, s]
            length = T.max(end - start, 0)
            taken = T.min(length, topk)
            clear(shared, WARP_LISTED, WARPS + 5)
            floor = 0
            if length > CANDIDATES:
                shift, bits = SAMPLE_DIGIT
                clear(shared, HIST, BINS)
                for i in T.Parallel(STEP):
                    vals[i] = key_of(Scores[b, s, sample_position(start, length, i, STEP), g])
                for i in T.Parallel(STEP):
                    T.atomic_add(shared[HIST + digit(vals[i], shift, bits)], 1)
                choose_digit(shared, sample_quota(taken, length, STEP), bits)
                floor = T.Cast("uint32", shared[CHOSEN]) << shift
            for step in row_steps(start, end):
                load_step(vals, Scores, b, s, g, step)
                for i in T.Parallel(STEP):
                    pos = step * STEP + i
                    if pos >= start and pos < end and vals[i] >= floor:
                        warp = (i % threads) // WARP
                        slot = T.atomic_add(shared[WARP_LISTED + warp], 1, return_prev=True)
                        if slot < PER_WARP:
                            shared[CAND + warp * PER_WARP + slot] = pos
                            shared[CAND_KEY + warp * PER_WARP + slot] = T.reinterpret(vals[i], "int32")
            T.sync_threads()
            for w in T.Parallel(WARPS):
                T.atomic_add(shared[LISTED], T.min(shared[WARP_LISTED + w], PER_WARP))
                if shared[WARP_LISTED + w] > PER_WARP:
                    shared[OVERFLOW] = 1
            T.sync_threads()
            # A list without overflow holding at least ``taken`` keys holds the k-th largest and all
            # above it; else the exact fallback re-reads the row.
            kept = shared[OVERFLOW] == 0 and shared[LISTED] >= taken
            threshold = 0
            need = taken
            for shift, bits in ROUNDS:
                T.sync_threads()  # the last round's readers are done with the histogram
                clear(shared, HIST, BINS)
                if kept:
                    count_candidates(shared, threshold, shift, bits)
                else:
                    count_row(shared, vals, Scores, b, s, g, start, end, threshold, shift, bits)
                choose_digit(shared, need, bits)
                threshold = threshold | (T.Cast("uint32", shared[CHOSEN]) << shift)
                need = need - above_chosen(shared, bits)
            T.sync_threads()
            if kept:
                # Keys above the threshold take slots numbered per thread (a scan of the threads'
                # counts), not from one shared counter most of the list would contend for.
                for i in T.Parallel(threads):
                    slots[i] = 0
                for step in list_steps():
                    for i in T.Parallel(threads):
                        c = step * threads + i
                        if is_listed(shared, c) and candidate_key(shared, c) > threshold:
                            slots[i] = slots[i] + 1
                for i in T.Parallel(threads):
                    shared[HIST + i] = slots[i]
                T.sync_threads()
                suffix_sums(shared, threads, (threads - 1).bit_length())
                for i in T.Parallel(threads):
                    slots[i] = shared[HIST + i] - slots[i]  # keys above it on later threads
                for step in list_steps():
                    for i in T.Parallel(threads):
                        c = step * threads + i
                        if is_listed(shared, c):
                            if candidate_key(shared, c) > threshold:
                                Indices[b, s, g, slots[i]] = shared[CAND + c]
                                slots[i] = slots[i] + 1
                            elif candidate_key(shared, c) == threshold:
                                take_tie(shared, Indices, b, s, g, shared[CAND + c], need, taken)
            else:
                for step in row_steps(start, end):
                    load_step(vals, Scores, b, s, g, step)
                    for i in T.Parallel(STEP):
                        pos = step * STEP + i
                        if pos >= start and pos < end:
                            if vals[i] > threshold:
                                slot = T.atomic_add(shared[ABOVE], 1, return_prev=True)
                                Indices[b, s, g, slot] = pos
                            elif vals[i] == threshold:
                                take_tie(shared, Indices, b, s, g, pos, need, taken)
            for i in T.Parallel(topk):
                if i >= taken:
                    Indices[b, s, g, i] = -1

    out_shape = (batch, seq_len, kv_group, topk)
    return KernelSpec(
        main,
        (("index_score", (batch, seq_len, seq_len_kv, kv_group)), ("starts", (batch, seq_len)),
         ("ends", (batch, seq_len)), ("indices", out_shape)),
        {"indices": torch.int32},
        (("indices", out_shape),),
        {"threads": threads, "vector": vector, "digit_bits": [bits for _, bits in ROUNDS],
         "sample_digit_bits": SAMPLE_DIGIT[1], "candidates": CANDIDATES},
        # The barriers are placed by hand: TileLang's own pass put one before every shared-memory
        # write of the row's read (8 per step), which kept warps from running ahead to the next
        # step's loads.
        {"tl.disable_thread_storage_sync": True},
    )
