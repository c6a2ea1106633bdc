"""The core's TileLang support that needs no GPU."""

from npuops.kernels import cuda_target


def test_cuda_target_takes_the_arch_from_the_environment_without_a_gpu(monkeypatch):
    """How scripts/warm-kernel-cache.py compiles, on a CPU machine, the kernels a GPU run builds."""
    monkeypatch.setenv("NPUOPS_CUDA_ARCH", "sm_90")
    assert cuda_target() == {"kind": "cuda", "arch": "sm_90"}
    assert cuda_target("sm_80") == {"kind": "cuda", "arch": "sm_80"}  # an explicit arch wins
