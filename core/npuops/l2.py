"""A pass over the L2 flush buffer with the ``evict_last`` hint (CUDA, through Triton).

Lines loaded with an L2 ``evict_last`` hint keep their place against ordinary stores. torch.compile's
Triton kernels put that hint on non-coalesced and broadcast loads, and after a plain overwrite of
twice the L2, part of such a kernel's input was still in L2 (docs/timing.md, "Known flaw"). Reading
the flush buffer with the same hint first makes those lines the oldest of their kind, so they are
the ones displaced.
"""

import torch
import triton
import triton.language as tl

BLOCK = 4096


@triton.jit
def _read_evict_last(buf, partial, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(buf + offs, mask=offs < n, other=0, eviction_policy="evict_last")
    tl.store(partial + pid, tl.sum(x, axis=0))  # a result, so the loads stay


def evict_last_pass(buf: torch.Tensor):
    """A callable that reads all of ``buf`` (a flush buffer) with the ``evict_last`` hint."""
    words = buf.view(torch.int32)
    grid = triton.cdiv(words.numel(), BLOCK)
    partial = torch.empty(grid, dtype=torch.int32, device=buf.device)
    return lambda: _read_evict_last[(grid,)](words, partial, words.numel(), BLOCK=BLOCK)
