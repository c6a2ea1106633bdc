"""The core's TileLang support that needs no GPU."""

from types import SimpleNamespace

import pytest
import torch

import npuops
from npuops import kernels
from npuops.kernels import CPU_TARGET, DEFAULT_TARGET_MULTIPROCESSORS, compile_kernel, cuda_target, thread_owned


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


@pytest.fixture
def gpus(monkeypatch):
    """``gpus(sms, ...)``: CUDA as if there were GPUs of those SMs (index 0 current); the SM counts
    looked up each time. Returns the indices whose properties were read."""
    counts: list[int] = []
    read: list[int] = []

    def properties(index):
        read.append(index)
        return SimpleNamespace(multi_processor_count=counts[index])

    def pretend(*sms):
        counts[:] = sms
        kernels._device_multiprocessors.cache_clear()
        return read

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    yield pretend
    kernels._device_multiprocessors.cache_clear()  # no pretended count outlives the test


def test_without_a_gpu_kernels_are_for_the_sms_of_the_build_target(monkeypatch):
    """CI compiles the kernels on a CPU machine for sm_90a: their launch rules take the SMs of its
    H100 and H200, so the kernels are the ones those GPUs build."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert DEFAULT_TARGET_MULTIPROCESSORS == 132
    assert npuops.multiprocessors() == npuops.multiprocessors("cuda:1") == DEFAULT_TARGET_MULTIPROCESSORS


def test_the_sms_are_the_device_s_looked_up_once(gpus):
    read = gpus(66, 148)
    assert npuops.multiprocessors() == npuops.multiprocessors("cuda") == npuops.multiprocessors(0) == 66
    assert npuops.multiprocessors(torch.device("cuda", 1)) == npuops.multiprocessors("cuda:1") == 148
    assert npuops.multiprocessors("cpu") == DEFAULT_TARGET_MULTIPROCESSORS  # no GPU's kernel
    assert read == [0, 1]


def test_a_launch_rule_follows_the_device_s_sms(gpus):
    """The row-wise norms' row classes (one row an SM, two) are the GPU's: on a GPU of half the
    H200's SMs 200 rows are past two waves; on one of twice as many, within one. A build key's
    launch class goes with them, its shared part (what the kernel computes) does not."""
    from npuops_norm.rowwise_kernel import RowNorm, class_row_counts, launch_key, row_class

    rms, shape = RowNorm("rms", 1e-6, weight="w"), (200, 4096)
    keys = {}
    for sms, rows_class, firsts in [(132, 2, (1, 9, 133, 265)), (66, 3, (1, 9, 67, 133)), (264, 1, (1, 9, 265, 529))]:
        gpus(sms)
        assert (row_class(200), class_row_counts()) == (rows_class, firsts), sms
        keys[sms] = launch_key(rms, shape, torch.bfloat16)
    assert len({key.shared for key in keys.values()}) == 1 and [key.launch for key in keys.values()] == [2, 3, 1]


def test_a_kernel_s_grid_follows_the_device_s_sms(gpus):
    """Pipelined rows: four blocks an SM, each taking every so many rows."""
    pytest.importorskip("tilelang")
    from npuops_norm.rowwise_kernel import RowNorm, rowwise_kernel

    layer_norm = RowNorm("meanvar", 1e-5, weight="w", bias=True)
    for sms in (66, 132):
        gpus(sms)
        spec = rowwise_kernel(layer_norm, (2048, 4096), torch.bfloat16, threads=128, min_blocks=4, pipelined=True)
        assert f"T.thread_binding(T.min(rows, {sms * 4}), thread=\"blockIdx.x\")" in spec.prim_func.script()


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


def test_launch_sizes_are_read_by_position_not_by_variable_name():
    """TileLang's map of the sizes a host entry point takes names TIR variables, which a macro can
    rename (a channels-first conv output's ``batch * 1`` passed as a macro's ``row_count``) or a
    cached kernel can name its own way: each size is the named dim of our shapes at its source."""
    from npuops.kernels import _launch_dims

    shapes = [("rows_in", 8), (4, 27), (4,), ("batch", 4, 1)]
    dynamic = {"rows_in": (0, 0, 0, 1), "row_count": (0, 3, 0, 1)}
    assert _launch_dims(dynamic, shapes) == ["rows_in", "batch"]
    with pytest.raises(ValueError, match="stride"):
        _launch_dims({"stride_var": (1, 3, 1, 1)}, shapes)


def test_a_dtype_with_no_kernel_is_declined_before_a_build():
    from npuops.kernels import _dtype_without_kernels
    from npuops.workload import Workload

    assert _dtype_without_kernels(Workload("RMSNormFwd", "X", "x", "bf16", {"x": (2, 64), "weight": (64,)})) is None
    assert _dtype_without_kernels(Workload("RMSNormFwd", "X", "x", "f64", {"x": (2, 64)})) == \
        "no TileLang kernel for float64 (x)"
    mixed = Workload("RMSNormFwd", "X", "x", "bf16", {"x": (2, 64), "weight": (64,)}, shape_dtypes={"weight": "f64"})
    assert _dtype_without_kernels(mixed) == "no TileLang kernel for float64 (weight)"
