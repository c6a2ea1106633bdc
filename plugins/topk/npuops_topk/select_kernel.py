"""TileLang top-k selection (TopkSelectorFwd): an exact radix select, one thread block per
(query row, kv group).

Scores become order-preserving 32-bit keys (negative floats bit-flipped, others with the sign bit
set). Four rounds, one per key byte from the top, each count the valid keys that match the bytes
found so far into a 256-bin shared histogram, turn it into counts from the top with a parallel
scan, and pick the byte of the k-th largest key; after them
the threshold key T is known. A final pass writes every key above T to the next free slot and as
many keys equal to T as are still needed (ties: any of them), then fills the slots a short row
leaves with -1. Exact for every range length (including 0) and any score distribution, with no
candidate buffer that could overflow; the price is five reads of each row (a first-byte pass that
keeps a bounded candidate list, as TileLang's DeepSeek-V3.2 example does, is the next step).

Written with tile-level operators only (no thread indices), so it also builds for TileLang's CPU
target, where the tests check it against the reference without a GPU. TileLang is imported when a
kernel is built. (No ``from __future__ import annotations``: TileLang evaluates the tensor
annotations, which must see the shapes.)
"""

import torch
from npuops.kernels import KernelSpec

THREADS = 1024  # keys visited per step of a row
RADIX = 256


def select_kernel(batch: int, seq_len: int, seq_len_kv: int, kv_group: int, topk: int) -> KernelSpec:
    import tilelang.language as T

    rows = batch * seq_len * kv_group

    def key_of(score):
        bits = T.reinterpret(score, "uint32")
        return T.if_then_else(score < 0, ~bits, bits | T.uint32(0x80000000))

    @T.prim_func
    def main(Scores: T.Tensor((batch, seq_len, seq_len_kv, kv_group), "float32"),
             Starts: T.Tensor((batch, seq_len), "int32"), Ends: T.Tensor((batch, seq_len), "int32"),
             Indices: T.Tensor((batch, seq_len, kv_group, topk), "int32")):
        with T.Kernel(rows, threads=THREADS) as r:
            # One shared buffer (TileLang's CPU target allows a single one): [0, 256) the byte
            # histogram, turned in place into counts from the top; [256, 512) the scan's scratch;
            # [512] the chosen byte; [513] slots taken above the threshold; [514] ties seen.
            shared = T.alloc_shared((2 * RADIX + 3,), "int32")
            BYTE, ABOVE, TIES = 2 * RADIX, 2 * RADIX + 1, 2 * RADIX + 2
            threshold = T.alloc_var("uint32")
            need = T.alloc_var("int32")  # keys still to take among those matching the threshold so far
            b = r // (seq_len * kv_group)
            s = (r // kv_group) % seq_len
            g = r % kv_group
            start = Starts[b, s]
            end = Ends[b, s]
            taken = T.min(T.max(end - start, 0), topk)
            threshold = 0
            need = taken
            for rnd in T.serial(4):
                shift = 24 - 8 * rnd
                for i in T.Parallel(RADIX):
                    shared[i] = 0
                for step in T.serial(T.ceildiv(seq_len_kv, THREADS)):
                    for i in T.Parallel(THREADS):
                        pos = step * THREADS + i
                        if pos >= start and pos < end:
                            key = key_of(Scores[b, s, pos, g])
                            if rnd == 0 or (key >> (shift + 8)) == (threshold >> (shift + 8)):
                                T.atomic_add(shared[T.Cast("int32", (key >> shift) & T.uint32(RADIX - 1))], 1)
                # Every thread's atomics must land before the scan reads the histogram (TileLang's
                # own sync here covers only the scan's 256 threads).
                T.sync_threads()
                # Counts from the top (shared[d] = keys with byte >= d), in log2(256) parallel steps.
                for level in T.serial(8):
                    for i in T.Parallel(RADIX):
                        shared[RADIX + i] = shared[i] + T.if_then_else(i + (1 << level) < RADIX,
                                                                       shared[T.min(i + (1 << level), RADIX - 1)], 0)
                    for i in T.Parallel(RADIX):
                        shared[i] = shared[RADIX + i]
                # The byte of the need-th largest matching key: where the count from the top
                # reaches `need` (need > 0 whenever any key is valid).
                shared[BYTE] = 0
                for i in T.Parallel(RADIX):
                    if shared[i] >= need and (i == RADIX - 1 or shared[T.min(i + 1, RADIX - 1)] < need):
                        shared[BYTE] = i
                threshold = threshold | (T.Cast("uint32", shared[BYTE]) << shift)
                need = need - T.if_then_else(shared[BYTE] < RADIX - 1, shared[T.min(shared[BYTE] + 1, RADIX - 1)], 0)
            for i in T.Parallel(2):
                shared[ABOVE + i] = 0
            for step in T.serial(T.ceildiv(seq_len_kv, THREADS)):
                for i in T.Parallel(THREADS):
                    pos = step * THREADS + i
                    if pos >= start and pos < end:
                        key = key_of(Scores[b, s, pos, g])
                        if key > threshold:
                            Indices[b, s, g, T.atomic_add(shared[ABOVE], 1, return_prev=True)] = pos
                        elif key == threshold:
                            tie = T.atomic_add(shared[TIES], 1, return_prev=True)
                            if tie < need:
                                Indices[b, s, g, taken - need + tie] = pos
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
        {"threads": THREADS, "radix_rounds": 4, "row_passes": 5},
    )
