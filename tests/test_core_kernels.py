"""The core's TileLang support that needs no GPU."""

import pytest
import torch
from npuops.kernels import CPU_TARGET, compile_kernel, cuda_target, thread_owned


def test_cuda_target_takes_the_arch_from_the_environment_without_a_gpu(monkeypatch):
    """How scripts/warm-kernel-cache.py compiles, on a CPU machine, the kernels a GPU run builds."""
    monkeypatch.setenv("NPUOPS_CUDA_ARCH", "sm_90")
    assert cuda_target() == {"kind": "cuda", "arch": "sm_90"}
    assert cuda_target("sm_80") == {"kind": "cuda", "arch": "sm_80"}  # an explicit arch wins


@pytest.mark.parametrize("capability,arch", [((8, 0), "sm_80"), ((9, 0), "sm_90a"), ((10, 0), "sm_100a")])
def test_a_gpu_s_target_has_its_architecture_specific_features(monkeypatch, capability, arch):
    """wgmma (tensor-core GEMMs on Hopper) exists only in sm_90a: built for sm_90 it traps."""
    monkeypatch.delenv("NPUOPS_CUDA_ARCH", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *device: capability)
    assert cuda_target() == {"kind": "cuda", "arch": arch}


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


def test_evict_last_loads_fill_an_interleaved_fragment_a_vector_at_a_time():
    """load_vectors_evict_last issues one hinted 16-byte load per vector a thread holds under the
    interleaved_vectors layout, at that vector's column, into that vector's registers."""
    pytest.importorskip("tilelang")
    import tilelang.language as T
    from npuops.kernels import EVICT_LAST_LOAD, interleaved_vectors, load_vectors_evict_last

    threads, length, vector = 128, 2048, 8  # 2 vectors a thread, 1024 elements apart

    @T.prim_func
    def copy(X: T.Tensor((4, length), "bfloat16"), Y: T.Tensor((4, length), "bfloat16")):
        with T.Kernel(4, threads=threads, prelude=EVICT_LAST_LOAD) as row:
            held = T.alloc_fragment((1, length), "bfloat16")
            T.annotate_layout({held: interleaved_vectors(1, length, threads, vector)})
            load_vectors_evict_last(held, lambda p, k: X[row, k], length, threads, vector)
            for p, k in T.Parallel(1, length):
                Y[row, k] = held[p, k]

    source = compile_kernel(copy, arch="sm_90").get_kernel_source()
    body = source[source.index("__launch_bounds__"):]
    assert body.count("npuops_load_evict_last(") == 2
    assert "(&(held[0])), (&(X[((((int)blockIdx.x) * 2048) + (((int)threadIdx.x) * 8))]))" in body
    assert "(&(held[8])), (&(X[(((((int)blockIdx.x) * 2048) + (((int)threadIdx.x) * 8)) + 1024)]))" in body
    assert "createpolicy.fractional.L2::evict_last" in source and "L2::cache_hint.v4.u32" in source
