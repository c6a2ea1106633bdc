"""The core's TileLang support that needs no GPU."""

import pytest
import torch
from npuops.kernels import CPU_TARGET, compile_kernel, cuda_target, thread_owned


def test_cuda_target_takes_the_arch_from_the_environment_without_a_gpu(monkeypatch):
    """How scripts/warm-kernel-cache.py compiles, on a CPU machine, the kernels a GPU run builds."""
    monkeypatch.setenv("NPUOPS_CUDA_ARCH", "sm_90")
    assert cuda_target() == {"kind": "cuda", "arch": "sm_90"}
    assert cuda_target("sm_80") == {"kind": "cuda", "arch": "sm_80"}  # an explicit arch wins


def test_the_cpu_target_runs_a_kernel_whose_fragments_have_thread_layouts():
    """A layout giving each GPU thread its own row (so it loads whole vectors) is replaced for the
    CPU target, which runs a block's threads one after another (kept, it gives wrong results there):
    the kernel's logic still checks."""
    pytest.importorskip("tilelang")
    import tilelang.language as T

    threads, width = 32, 4

    @T.prim_func
    def double(X: T.Tensor((threads, width), "float32"), Y: T.Tensor((threads, width), "float32")):
        with T.Kernel(1, threads=threads) as _:
            rows = T.alloc_fragment((threads, width), "float32")
            T.annotate_layout({rows: thread_owned((threads, width), 0)})
            for t, c in T.Parallel(threads, width):
                rows[t, c] = X[t, c] * 2.0
            for t, c in T.Parallel(threads, width):
                Y[t, c] = rows[t, c]

    x, y = torch.randn(threads, width), torch.full((threads, width), float("nan"))
    compile_kernel(double, target=CPU_TARGET)(x, y)
    assert torch.equal(y, x * 2)
