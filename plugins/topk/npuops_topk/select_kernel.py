"""TileLang top-k selection (TopkSelectorFwd): an exact radix select, one thread block per
(query row, kv group).

Scores become order-preserving 32-bit keys (negative floats bit-flipped, others with the sign bit
set), selected digit by digit from the top (12, 8, 8 and 4 bits): each round counts the keys that
agree with the digits found so far into a shared histogram, turns it into counts from the top with
a parallel scan, and picks the digit of the k-th largest key, until the threshold key T is known.

One read of the row counts the first digit (each step loads ``vector`` keys per thread before
using any, and steps stop at the row's end); a second writes every key above T's first digit to
the next free slot and keeps the keys sharing it, positions and keys (a few hundred on typical
scores), in shared memory, where the later rounds and the final pick work. Keys above T take the
next slots, keys equal to T fill the remaining ones (ties: any of them), and the slots a short row
leaves get -1. A row with more keys sharing T's first digit than the list holds (say, thousands of
equal scores) takes the exact fallback: the later rounds and the pick re-read the row. Exact for
every range length (including 0) and every score distribution.

Written with tile-level operators only (no thread indices), so it also builds for TileLang's CPU
target, where the tests check it against the reference without a GPU. TileLang is imported when a
kernel is built. (No ``from __future__ import annotations``: TileLang evaluates the tensor
annotations, which must see the shapes.)
"""

import torch
from npuops.kernels import KernelSpec

THREADS = 1024
VECTOR = 8  # keys each thread loads per step: 32 KB of a row in flight per block, not 4 KB
# Digit rounds over the 32-bit key, top first: (shift, bits). The first, 12 bits wide (sign,
# exponent, 3 mantissa bits), leaves few keys beside the threshold for the later rounds.
ROUNDS = ((20, 12), (12, 8), (4, 8), (0, 4))
BINS = 1 << max(bits for _, bits in ROUNDS)
CANDIDATES = 3072  # keys of the threshold's first digit kept in shared memory (position and key)


def launch_variants() -> list[dict[str, int]]:
    """(threads, keys per thread and step) ``npuops run --tune`` chooses among, the default first."""
    return [{"threads": t, "vector": v} for t, v in ((THREADS, VECTOR), (THREADS, VECTOR // 2),
                                                      (THREADS, VECTOR * 2), (THREADS // 2, VECTOR * 2))]


def select_kernel(batch: int, seq_len: int, seq_len_kv: int, kv_group: int, topk: int, threads: int = THREADS,
                  vector: int = VECTOR) -> KernelSpec:
    import tilelang.language as T

    STEP = threads * vector  # keys a block loads per step

    rows = batch * seq_len * kv_group
    # One shared int32 buffer (TileLang's CPU target allows a single one): histogram / counts from
    # the top, scan scratch, candidate positions and their keys (so later rounds never re-read them).
    HIST, SCRATCH, CAND, CAND_KEY = 0, BINS, 2 * BINS, 2 * BINS + CANDIDATES
    CHOSEN, ABOVE, TIES, COUNT = (2 * BINS + 2 * CANDIDATES + i for i in range(4))
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

    @T.macro
    def load_step(vals, Scores, b, s, g, step):
        """The row's keys at positions step * STEP + i, all loads issued before any is used."""
        for i in T.Parallel(STEP):
            pos = step * STEP + i
            vals[i] = key_of(Scores[b, s, pos if whole_steps else T.min(pos, seq_len_kv - 1), g])

    @T.macro
    def count_row(shared, vals, Scores, b, s, g, start, end, threshold, shift, bits):
        for step in T.serial(T.ceildiv(end, STEP)):
            load_step(vals, Scores, b, s, g, step)
            for i in T.Parallel(STEP):
                pos = step * STEP + i
                if pos >= start and pos < end and matches(vals[i], threshold, shift, bits):
                    T.atomic_add(shared[HIST + digit(vals[i], shift, bits)], 1)

    def candidate_key(shared, c):
        return T.reinterpret(shared[CAND_KEY + c], "uint32")

    @T.macro
    def count_candidates(shared, threshold, shift, bits):
        for step in T.serial(T.ceildiv(CANDIDATES, threads)):
            for i in T.Parallel(threads):
                c = T.min(step * threads + i, CANDIDATES - 1)
                if step * threads + i < shared[COUNT] and matches(candidate_key(shared, c), threshold, shift, bits):
                    T.atomic_add(shared[HIST + digit(candidate_key(shared, c), shift, bits)], 1)

    def scan_span(bits):
        """Histogram entries a round clears and scans: at least one per thread, since a parallel
        loop shorter than the block runs on some threads only, and TileLang then drops the
        barriers between the scan's steps (measured: wrong digits, then writes past the row)."""
        return max(1 << bits, threads)

    @T.macro
    def choose_digit(shared, need, bits):
        """Counts from the top (shared[HIST + d] = counted keys with digit >= d), by a parallel
        scan; then the digit where that count reaches ``need`` goes to shared[CHOSEN]."""
        # Every thread's atomics must land first (TileLang's own sync here would cover only the
        # scan's threads).
        T.sync_threads()
        span = scan_span(bits)  # entries past the digit's range are zero
        for level in T.serial(bits):
            for i in T.Parallel(span):
                shared[SCRATCH + i] = shared[HIST + i] + T.if_then_else(
                    i + (1 << level) < span, shared[HIST + T.min(i + (1 << level), span - 1)], 0)
            for i in T.Parallel(span):
                shared[HIST + i] = shared[SCRATCH + i]
        n = 1 << bits
        shared[CHOSEN] = 0
        for i in T.Parallel(n):
            if shared[HIST + i] >= need and (i == n - 1 or shared[HIST + T.min(i + 1, n - 1)] < need):
                shared[CHOSEN] = i

    def above_chosen(shared, bits):
        """Counted keys whose digit is above the chosen one."""
        n = 1 << bits
        return T.if_then_else(shared[CHOSEN] < n - 1, shared[HIST + T.min(shared[CHOSEN] + 1, n - 1)], 0)

    @T.macro
    def pick(shared, Indices, b, s, g, pos, key, threshold, need, taken):
        """Keys above the threshold take the next slot; equal ones the last ``need`` slots."""
        if key > threshold:
            # The slot is bound once: used inline as an index, TileLang's bounds check repeats the
            # atomic (three increments per key).
            slot = T.atomic_add(shared[ABOVE], 1, return_prev=True)
            Indices[b, s, g, slot] = pos
        elif key == threshold:
            tie = T.atomic_add(shared[TIES], 1, return_prev=True)
            if tie < need:
                Indices[b, s, g, taken - need + tie] = pos

    @T.macro
    def clear(shared, first, count):
        for i in T.Parallel(count):
            shared[first + i] = 0

    @T.prim_func
    def main(Scores: T.Tensor((batch, seq_len, seq_len_kv, kv_group), "float32"),
             Starts: T.Tensor((batch, seq_len), "int32"), Ends: T.Tensor((batch, seq_len), "int32"),
             Indices: T.Tensor((batch, seq_len, kv_group, topk), "int32")):
        with T.Kernel(rows, threads=threads) as r:
            shared = T.alloc_shared((2 * BINS + 2 * CANDIDATES + 4,), "int32")
            vals = T.alloc_fragment((STEP,), "uint32")  # one step's keys
            threshold = T.alloc_var("uint32")  # the digits of the k-th largest key found so far
            need = T.alloc_var("int32")  # keys still to take among those matching them
            b = r // (seq_len * kv_group)
            s = (r // kv_group) % seq_len
            g = r % kv_group
            start = Starts[b, s]
            end = Ends[b, s]
            taken = T.min(T.max(end - start, 0), topk)
            threshold = 0
            need = taken
            shift0, bits0 = ROUNDS[0]
            clear(shared, HIST, scan_span(bits0))
            clear(shared, ABOVE, 3)
            count_row(shared, vals, Scores, b, s, g, start, end, threshold, shift0, bits0)
            choose_digit(shared, need, bits0)
            first = shared[CHOSEN]
            threshold = T.Cast("uint32", first) << shift0
            in_first = shared[HIST + first] - above_chosen(shared, bits0)  # keys sharing the first digit
            need = need - above_chosen(shared, bits0)
            kept = in_first <= CANDIDATES  # else too many keys share the first digit: re-read the row
            if kept:
                # Keys above the first digit are selected now; those sharing it become candidates.
                T.sync_threads()
                for step in T.serial(T.ceildiv(end, STEP)):
                    load_step(vals, Scores, b, s, g, step)
                    for i in T.Parallel(STEP):
                        pos = step * STEP + i
                        if pos >= start and pos < end:
                            top = digit(vals[i], shift0, bits0)
                            if top > first:
                                slot = T.atomic_add(shared[ABOVE], 1, return_prev=True)
                                Indices[b, s, g, slot] = pos
                            elif top == first:
                                slot = T.atomic_add(shared[COUNT], 1, return_prev=True)
                                shared[CAND + slot] = pos
                                shared[CAND_KEY + slot] = T.reinterpret(vals[i], "int32")
            for shift, bits in ROUNDS[1:]:
                T.sync_threads()  # the last round's readers are done with the histogram
                clear(shared, HIST, scan_span(bits))
                if kept:
                    count_candidates(shared, threshold, shift, bits)
                else:
                    count_row(shared, vals, Scores, b, s, g, start, end, threshold, shift, bits)
                choose_digit(shared, need, bits)
                threshold = threshold | (T.Cast("uint32", shared[CHOSEN]) << shift)
                need = need - above_chosen(shared, bits)
            T.sync_threads()
            if kept:
                for step in T.serial(T.ceildiv(CANDIDATES, threads)):
                    for i in T.Parallel(threads):
                        c = T.min(step * threads + i, CANDIDATES - 1)
                        if step * threads + i < shared[COUNT]:
                            pick(shared, Indices, b, s, g, shared[CAND + c], candidate_key(shared, c), threshold, need, taken)
            else:
                for step in T.serial(T.ceildiv(end, STEP)):
                    load_step(vals, Scores, b, s, g, step)
                    for i in T.Parallel(STEP):
                        pos = step * STEP + i
                        if pos >= start and pos < end:
                            pick(shared, Indices, b, s, g, pos, vals[i], threshold, need, taken)
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
        {"threads": threads, "vector": vector, "digit_bits": [bits for _, bits in ROUNDS], "candidates": CANDIDATES},
    )
