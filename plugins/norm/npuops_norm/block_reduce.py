"""Block-wide sums and maxima of a row held in registers, with one barrier.

TileLang's ``T.reduce_sum`` over a block lowers to an all-reduce that exchanges through shared
memory at every power-of-two stride from threads/2 down to 32, two barriers each (eight with 512
threads); on a latency-bound row those barriers are most of the reduction. Here each thread first
combines its own elements, the warps reduce by shuffles, and the warps' results meet once in shared
memory: one barrier. That needs each thread's elements known, so the row is laid out thread-major
(:func:`thread_major`), as TileLang lays out a row it loads in 16-byte vectors.

A row may also be split over a thread-block cluster (sm_90): each block of the cluster holds a
slice, reduces it as above, then stores its result into every block's shared memory (distributed
shared memory) and meets the others at one cluster barrier. A decode row's loads and stores then
spread over several SMs instead of queueing on one (:func:`cluster_split`). With
``exchange_barriers`` the blocks send their results with ``st.async``, each completing bytes of the
receiver's mbarrier for that reduction, and each block waits for its own barrier alone, not for
every block to arrive (QuACK's cluster reduction).

TileLang is imported when a kernel is built.
"""

import math

from npuops import VECTOR_BYTES, interleaved_vectors, thread_owned

F32 = "float32"
WARP = 32


def vector_elements(length: int, threads: int, itemsize: int) -> int:
    """Elements per vector of a row of ``length`` split over ``threads``: a 16-byte vector, or
    less where each thread's share is shorter."""
    return math.gcd(VECTOR_BYTES // itemsize, length // threads)


def thread_major(length: int, threads: int, itemsize: int):
    """Layout of a (1, length) row fragment whose vectors (:func:`vector_elements`) are interleaved
    over all ``threads`` (``npuops.kernels.interleaved_vectors``)."""
    return group_major(1, length, threads, itemsize)


def group_major(groups: int, length: int, threads: int, itemsize: int):
    """Layout of a (groups, length) row fragment: group g on the threads // groups threads from
    g * threads // groups, its vectors interleaved over them as :func:`thread_major` does a row's."""
    lanes = threads // groups
    return interleaved_vectors(groups, length, lanes, vector_elements(length, lanes, itemsize))


def group_values(groups: int, threads: int):
    """Layout of a (groups,) fragment of per-group results: each thread of group g (see
    :func:`group_major`) holds value g."""
    from tilelang.layout import Fragment

    lanes = threads // groups
    return Fragment((groups,), forward_thread_fn=lambda g, rep: g * lanes + rep, replicate=lanes,
                    forward_index_fn=lambda g: 0)


def reduces_groups(groups: int, threads: int, length: int) -> bool:
    """Whether :func:`block_reducer` takes ``groups`` groups of ``length`` over ``threads``: whole
    warps per group, whole vectors per thread."""
    lanes = threads // groups
    return threads % groups == 0 and lanes % WARP == 0 and length % lanes == 0


# A wide decode row is split over a cluster: a slice of CLUSTER_SLICE elements per block,
# CLUSTER_ELEMENTS_PER_THREAD per thread, at most MAX_CLUSTER blocks (the portable cluster size).
# Single-row RMSNorm, 16384 wide: 4.32 µs in 8 blocks of 128 threads, 4.51 in 4, 5.15 in one block;
# 8192 wide: 4.32 in 4 blocks against 4.54; 4096 wide: 4.32 in 2-8 blocks against 4.13 in one
# (H200), hence at least MIN_CLUSTER blocks.
CLUSTER_SLICE = 2048
CLUSTER_ELEMENTS_PER_THREAD = 16
MIN_CLUSTER, MAX_CLUSTER = 4, 8


def cluster_split(length: int) -> tuple[int, int] | None:
    """(blocks, threads per block) splitting a decode row of ``length`` over a cluster, each
    thread's share CLUSTER_ELEMENTS_PER_THREAD elements (whole 16-byte vectors of any element
    size); None where the row is too short or does not split so."""
    blocks = min(MAX_CLUSTER, length // CLUSTER_SLICE)
    if blocks < MIN_CLUSTER or length % (blocks * CLUSTER_ELEMENTS_PER_THREAD):
        return None
    threads = length // blocks // CLUSTER_ELEMENTS_PER_THREAD
    if threads % WARP or threads & (threads - 1):
        return None
    return blocks, threads


# The kernel prelude of cluster-split rows (``T.ClusterKernel(prelude=...)``): a store into the
# shared memory of another block of the cluster, which TileLang's copy_cluster would make from every
# thread of the block.
STORE_TO_CLUSTER_RANK = r"""
__device__ __forceinline__ void npuops_store_to_cluster_rank(float* local, int rank, float value) {
  unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(local)), remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(address), "r"(rank));
  asm volatile("st.shared::cluster.f32 [%0], %1;" :: "r"(remote), "f"(value) : "memory");
}
"""


# With exchange_barriers: the mbarrier of each reduction (init by thread 0, then a fence that
# releases the init to the cluster, before the cluster's start barrier), the bytes it expects, a
# result sent into another block's shared memory completing bytes of that block's barrier, and the
# wait for a barrier's first phase (each reduction's barrier is used once).
EXCHANGE_BARRIERS = r"""
__device__ __forceinline__ unsigned npuops_shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void npuops_init_exchange_barrier(void* barrier) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(npuops_shared_address(barrier)) : "memory");
}
__device__ __forceinline__ void npuops_fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void npuops_expect_exchange_bytes(void* barrier, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
               :: "r"(npuops_shared_address(barrier)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void npuops_send_to_cluster_rank(float* local, void* barrier, int rank, float value) {
  unsigned remote, remote_barrier;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(npuops_shared_address(local)), "r"(rank));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
               : "=r"(remote_barrier) : "r"(npuops_shared_address(barrier)), "r"(rank));
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.f32 [%0], %1, [%2];"
               :: "r"(remote), "f"(value), "r"(remote_barrier) : "memory");
}
__device__ __forceinline__ void npuops_wait_exchange(void* barrier) {
  asm volatile("{\n.reg .pred done;\nWAIT:\nmbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;\n"
               "@!done bra WAIT;\n}" :: "r"(npuops_shared_address(barrier)) : "memory");
}
"""


def warp_slot(slot: int, w, cluster: int) -> tuple:
    """Where warp w's result of reduction ``slot`` goes in the exchange (:func:`exchange_slots`)."""
    return (slot, 0, w) if cluster > 1 else (slot, w)


def exchange_slots(slots: int, threads: int, cluster: int = 1, barriers: bool = False):
    """Shared memory for ``slots`` reductions of one kernel: each reduction a slot of its own, since
    reusing one would need a barrier before the next reduction's writes. In a cluster, each slot
    also holds the cluster's block results, in the same buffer: separate buffers could share an
    address (TileLang's planner does not see the other blocks' writes); with ``barriers``, and its
    mbarrier (8 bytes at ``[slot, 2, 0]``, which the row's even width keeps aligned)."""
    import tilelang.language as T

    if cluster == 1:
        return T.alloc_shared((slots, threads // WARP), F32)
    width = max(threads // WARP, cluster)
    assert not barriers or width % 2 == 0, "an mbarrier needs 8-byte alignment"
    return T.alloc_shared((slots, 3 if barriers else 2, width), F32)


def exchange_barrier_initializer(slots: tuple[int, ...]):
    """A macro ``init(exchange)``: thread 0 initializes the mbarrier of each of ``slots`` (those
    whose reductions exchange through it: :func:`exchange_slots` with ``barriers``) and releases the
    inits to the cluster; the cluster's start barrier
    (``T.cluster_arrive_relaxed`` after this, ``T.cluster_wait`` before the first reduction) then
    makes them visible to every block before it sends."""
    import tilelang.language as T

    @T.macro
    def init(exchange):
        if T.get_thread_binding() == 0:
            for slot in slots:  # a tuple, which TileLang's builder unrolls
                T.call_extern("handle", "npuops_init_exchange_barrier", T.address_of(exchange[slot, 2, 0]))
            T.call_extern("handle", "npuops_fence_barrier_init")

    return init


def cluster_kernel(blocks: int, cluster: int, threads: int, *more_blocks: int, prelude: str = "",
                   barriers: bool = False):
    """The launch frame ``T.Kernel(blocks, *more_blocks)``, or with ``cluster`` > 1 a launch in
    clusters of that many consecutive blocks along x. A cluster kernel calls
    ``T.cluster_arrive_relaxed()`` first (after initializing its exchange barriers, if any:
    :func:`exchange_barrier_initializer`) and ``T.cluster_wait()`` once before its first cluster
    reduction (:func:`block_reducer`): every block of the cluster has then started, and its shared
    memory may be written. (A frame, not a context manager of ours: TileLang's builder must see
    the ``with`` itself.) ``prelude``: device code the kernel's source starts with; ``barriers``:
    with the helpers of exchanges through mbarriers (``EXCHANGE_BARRIERS``)."""
    import tilelang.language as T

    if cluster == 1:
        return T.Kernel(blocks, *more_blocks, threads=threads, prelude=prelude or None)
    return T.ClusterKernel(blocks, *more_blocks, threads=threads, cluster_dims=(cluster, 1, 1),
                           prelude=STORE_TO_CLUSTER_RANK + (EXCHANGE_BARRIERS if barriers else "") + prelude)


def cluster_sharer(threads: int, cluster: int, barriers: bool = False):
    """A macro ``share(exchange, results)``: each ``(slot, value)`` of ``results`` (this block's,
    held by every thread) stored into ``exchange[slot, 1, rank]`` of every block of the cluster
    (rank: this block's), then the cluster's barrier, after which each block holds all of them.
    With ``barriers``, sent with ``st.async`` instead, completing the bytes the first result's slot
    barrier expects in each block, and each block waits for its own barrier."""
    import tilelang.language as T

    @T.macro
    def share_through_barriers(exchange, results):
        rank = T.block_rank_in_cluster()
        barrier = T.address_of(exchange[results[0][0], 2, 0])
        for t in T.Parallel(threads):
            if t == 0:
                T.call_extern("handle", "npuops_expect_exchange_bytes", barrier, 4 * cluster * len(results))
            if t < cluster:  # thread t sends to block t
                for slot, value in results:
                    T.call_extern("handle", "npuops_send_to_cluster_rank", T.address_of(exchange[slot, 1, rank]),
                                  barrier, t, value)
        T.call_extern("handle", "npuops_wait_exchange", barrier)

    if barriers:
        return share_through_barriers

    @T.macro
    def share(exchange, results):
        rank = T.block_rank_in_cluster()
        for t in T.Parallel(threads):
            if t < cluster:  # thread t sends to block t
                for slot, value in results:
                    T.call_extern("handle", "npuops_store_to_cluster_rank", T.address_of(exchange[slot, 1, rank]), t,
                                  value)
        T.cluster_sync()

    return share


def block_reducer(threads: int, length: int, itemsize: int, cluster: int = 1, groups: int = 1, together: bool = False,
                  exchange_barriers: bool = False):
    """A macro ``reduce(term, out, kind, exchange, slot)``: ``out[g]`` = the sum (``kind`` "sum") or
    max ("max", of non-negative terms) of ``term(g, j)`` over the ``length`` elements of each of
    ``groups`` groups of a row laid out by :func:`group_major` (one group: :func:`thread_major`);
    the warps' results meet in ``exchange[slot, :]`` (:func:`exchange_slots`). Every thread gets
    the result (of several groups, its own group's: ``out`` laid out by :func:`group_values`). With
    ``cluster`` > 1 the row (one group) is split over the blocks of a cluster
    (:func:`cluster_kernel`), ``length`` elements each, and the result is the whole row's. With
    ``together``, the macro ``reduce(reductions, exchange)`` instead: several ``(term, out, kind,
    slot)`` at once, behind one barrier (and one cluster barrier). ``exchange_barriers``: the
    cluster's results meet through mbarriers (:func:`cluster_sharer`)."""
    import tilelang.language as T

    assert groups == 1 or (cluster == 1 and reduces_groups(groups, threads, length))
    combine = {"sum": lambda a, b: a + b, "max": T.max}
    warp_reduce = {"sum": T.warp_reduce_sum, "max": T.warp_reduce_max}
    lanes = threads // groups
    vec = vector_elements(length, lanes, itemsize)
    vectors_per_thread = length // (lanes * vec)
    warps = max(lanes // WARP, 1)  # of a group

    share = cluster_sharer(threads, cluster, exchange_barriers)

    @T.macro
    def reduce_together(reductions, exchange):
        # Each reduction's out is named through the tuple, never bound to a name of its own: a buffer
        # bound to a new name would be renamed in the kernel.
        for reduction in reductions:
            term, kind, slot = reduction[0], reduction[2], reduction[3]
            part = T.alloc_fragment((threads,), F32)
            T.annotate_layout({part: thread_owned((threads,), 0)})
            for t in T.Parallel(threads):
                part[t] = 0.0
                for k in T.unroll(vectors_per_thread):  # unrolled: the row stays in registers
                    for v in T.unroll(vec):
                        part[t] = combine[kind](part[t], term(t // lanes, (k * lanes + t % lanes) * vec + v))
                part[t] = warp_reduce[kind](part[t])
                if t % WARP == 0:
                    exchange[warp_slot(slot, t // WARP, cluster)] = part[t]
        T.sync_threads()
        for reduction in reductions:
            kind, slot = reduction[2], reduction[3]
            for g in T.Parallel(groups):
                reduction[1][g] = 0.0
                for w in T.unroll(warps):
                    reduction[1][g] = combine[kind](reduction[1][g], exchange[warp_slot(slot, g * warps + w, cluster)])
        if cluster > 1:
            share(exchange, tuple((reduction[3], reduction[1][0]) for reduction in reductions))
            for reduction in reductions:
                kind, slot = reduction[2], reduction[3]
                for g in T.Parallel(1):
                    reduction[1][g] = exchange[slot, 1, 0]
                    for b in T.unroll(1, cluster):
                        reduction[1][g] = combine[kind](reduction[1][g], exchange[slot, 1, b])

    @T.macro
    def reduce(term, out, kind, exchange, slot):
        reduce_together(((term, out, kind, slot),), exchange)

    return reduce_together if together else reduce


def moments_reducer(threads: int, length: int, itemsize: int, cluster: int = 1, exchange_barriers: bool = False):
    """A macro ``reduce(value, mean, m2, exchange)``: ``mean[0]`` and ``m2[0]`` = the mean and the
    sum of squared deviations of ``value(j)`` over a row laid out as for :func:`block_reducer`
    (the whole row's, with ``cluster``), in one barrier (and one cluster barrier) where a mean
    then a centered sum would take two. Each thread takes its elements' moments exactly (two
    passes over its registers); equal-sized parts then merge pairwise by Chan et al.'s update
    (mean += delta/2, m2 += m2' + delta² n/2), as stable as the two-pass form. Uses the
    exchange's slots 0 and 1. Every element must count: no masked tail. ``exchange_barriers``: as
    :func:`block_reducer`'s."""
    import tilelang.language as T

    vec = vector_elements(length, threads, itemsize)
    vectors_per_thread = length // (threads * vec)
    per_thread = vec * vectors_per_thread

    # Python sequences, not ranges (which TileLang's builder turns into loops): each step's
    # element counts must be constants.
    shuffles = tuple((WARP >> (level + 1), per_thread << level) for level in range(5))  # lanes 16..1 apart
    other_warps, other_blocks = tuple(range(1, threads // WARP)), tuple(range(1, cluster))

    def merge(mean, m2, delta, i, count, other_mean, other_m2, other_count):
        """(mean[i], m2[i]) of ``count`` elements merged with another part's moments."""
        total = count + other_count
        return update(mean, m2, delta, i, other_mean, other_m2, T.float32(other_count / total),
                      T.float32(count * other_count / total))

    @T.macro
    def update(mean, m2, delta, i, other_mean, other_m2, mean_weight, square_weight):
        # Through delta[i]: a store to mean[i] would change what an expression naming it reads after.
        delta[i] = other_mean - mean[i]
        mean[i] = mean[i] + delta[i] * mean_weight
        m2[i] = m2[i] + other_m2 + delta[i] * delta[i] * square_weight

    share = cluster_sharer(threads, cluster, exchange_barriers)

    @T.macro
    def reduce(value, mean, m2, exchange):
        part_mean = T.alloc_fragment((threads,), F32)
        part_m2 = T.alloc_fragment((threads,), F32)
        other_mean = T.alloc_fragment((threads,), F32)
        other_m2 = T.alloc_fragment((threads,), F32)
        part_delta = T.alloc_fragment((threads,), F32)
        T.annotate_layout({b: thread_owned((threads,), 0) for b in (part_mean, part_m2, other_mean, other_m2, part_delta)})
        delta = T.alloc_fragment((1,), F32)
        for t in T.Parallel(threads):
            part_mean[t] = 0.0
            for k in T.unroll(vectors_per_thread):
                for v in T.unroll(vec):
                    part_mean[t] += value((k * threads + t) * vec + v)
            part_mean[t] = part_mean[t] * (1.0 / per_thread)
        for t in T.Parallel(threads):  # a loop of its own: TileLang wants one index form per buffer and loop
            part_m2[t] = 0.0
            for k in T.unroll(vectors_per_thread):
                for v in T.unroll(vec):
                    part_delta[t] = value((k * threads + t) * vec + v) - part_mean[t]
                    part_m2[t] += part_delta[t] * part_delta[t]
        for t in T.Parallel(threads):
            for lanes_apart, count in shuffles:  # every lane ends with its warp's moments
                other_mean[t] = T.shfl_xor(part_mean[t], lanes_apart)
                other_m2[t] = T.shfl_xor(part_m2[t], lanes_apart)
                merge(part_mean, part_m2, part_delta, t, count, other_mean[t], other_m2[t], count)
            if t % WARP == 0:
                exchange[warp_slot(0, t // WARP, cluster)] = part_mean[t]
                exchange[warp_slot(1, t // WARP, cluster)] = part_m2[t]
        T.sync_threads()
        for g in T.Parallel(1):
            mean[g] = exchange[warp_slot(0, 0, cluster)]
            m2[g] = exchange[warp_slot(1, 0, cluster)]
            for w in other_warps:
                merge(mean, m2, delta, g, w * WARP * per_thread, exchange[warp_slot(0, w, cluster)],
                      exchange[warp_slot(1, w, cluster)], WARP * per_thread)
        if cluster > 1:
            share(exchange, ((0, mean[0]), (1, m2[0])))
            for g in T.Parallel(1):
                mean[g] = exchange[0, 1, 0]
                m2[g] = exchange[1, 1, 0]
                for b in other_blocks:
                    merge(mean, m2, delta, g, b * length, exchange[0, 1, b], exchange[1, 1, b], length)

    return reduce


def tree_reducer(threads: int, slots: int = 1):
    """A macro ``reduce(red, at)``: with ``red`` a shared f32 buffer of shape (stages, slots,
    threads) in which every thread t has stored its partial sums ``red[at, s, t]``, leaves the
    block's sum of each slot s in ``red[at, s, 0]`` (read it after the macro: TileLang puts the
    barrier before the read). A pairwise tree in shared memory, log2(threads) barriers, in one
    fixed order (the same bits run to run); tile-level only, so a kernel using it also builds and
    runs on TileLang's CPU target (the warp shuffles of :func:`block_reducer` do not). ``at``
    picks one of the buffer's stages: a kernel reducing in a loop alternates two, so that no
    thread overwrites a stage others still read (the tree's barriers separate the uses of one).
    ``threads``: a power of two."""
    import tilelang.language as T

    assert threads & (threads - 1) == 0, "the tree takes a power-of-two thread count"
    strides = tuple(threads >> (level + 1) for level in range(threads.bit_length() - 1))

    @T.macro
    def reduce(red, at):
        for stride in strides:  # a tuple: unrolled by TileLang's builder, a barrier between steps
            for t in T.Parallel(threads):  # the whole block (TileLang keeps the barrier before it)
                if t < stride:
                    for s in T.unroll(slots):
                        red[at, s, t] = red[at, s, t] + red[at, s, t + stride]

    return reduce
