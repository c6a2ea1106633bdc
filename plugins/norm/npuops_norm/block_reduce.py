"""Block-wide sums and maxima of a row held in registers, with one barrier.

TileLang's ``T.reduce_sum`` over a block lowers to an all-reduce that exchanges through shared
memory at every power-of-two stride from threads/2 down to 32, two barriers each (eight with 512
threads); on a latency-bound row those barriers are most of the reduction. Here each thread first
combines its own elements, the warps reduce by shuffles, and the warps' results meet once in shared
memory: one barrier. That needs each thread's elements known, so the row is laid out thread-major
(:func:`thread_major`), as TileLang lays out a row it loads in 16-byte vectors.

TileLang is imported when a kernel is built.
"""

import math

from npuops.kernels import VECTOR_BYTES, interleaved_vectors, thread_owned

F32 = "float32"
WARP = 32


def vector_elements(length: int, threads: int, itemsize: int) -> int:
    """Elements per vector of a row of ``length`` split over ``threads``: a 16-byte vector, or
    less where each thread's share is shorter."""
    return math.gcd(VECTOR_BYTES // itemsize, length // threads)


def thread_major(length: int, threads: int, itemsize: int):
    """Layout of a (1, length) row fragment whose vectors (:func:`vector_elements`) are interleaved
    over all ``threads`` (``npuops.kernels.interleaved_vectors``)."""
    return interleaved_vectors(1, length, threads, vector_elements(length, threads, itemsize))


def exchange_slots(slots: int, threads: int):
    """Shared memory for ``slots`` reductions of one kernel: each reduction a slot of its own, since
    reusing one would need a barrier before the next reduction's writes."""
    import tilelang.language as T

    return T.alloc_shared((slots, threads // WARP), F32)


def block_reducer(threads: int, length: int, itemsize: int):
    """A macro ``reduce(term, out, kind, exchange, slot)``: ``out[0]`` = the sum (``kind`` "sum") or
    max ("max", of non-negative terms) of ``term(j)`` over the ``length`` elements of a row laid out
    by :func:`thread_major`; the warps' results meet in ``exchange[slot, :]`` (:func:`exchange_slots`).
    Every thread gets the result."""
    import tilelang.language as T

    combine = {"sum": lambda a, b: a + b, "max": T.max}
    warp_reduce = {"sum": T.warp_reduce_sum, "max": T.warp_reduce_max}
    vec = vector_elements(length, threads, itemsize)
    vectors_per_thread = length // (threads * vec)

    @T.macro
    def reduce(term, out, kind, exchange, slot):
        part = T.alloc_fragment((threads,), F32)
        T.annotate_layout({part: thread_owned((threads,), 0)})
        for t in T.Parallel(threads):
            part[t] = 0.0
            for k in T.unroll(vectors_per_thread):  # unrolled: the row stays in registers
                for v in T.unroll(vec):
                    part[t] = combine[kind](part[t], term((k * threads + t) * vec + v))
            part[t] = warp_reduce[kind](part[t])
            if t % WARP == 0:
                exchange[slot, t // WARP] = part[t]
        T.sync_threads()
        for g in T.Parallel(1):
            out[g] = 0.0
            for w in T.unroll(threads // WARP):
                out[g] = combine[kind](out[g], exchange[slot, w])

    return reduce
