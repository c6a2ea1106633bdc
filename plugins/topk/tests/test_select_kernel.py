"""Our TileLang top-k selector: its logic checked on TileLang's CPU target (any machine), compiled
for sm_90, and on a GPU (marker ``gpu``) checked on the catalog workloads."""

from __future__ import annotations

import pytest
import torch

from npuops import InputRNG, Workload
from npuops.check import check
from npuops.devices import CPUDevice
from npuops.kernels import CPU_TARGET, compile_kernel
from npuops.registry import load_registry

pytest.importorskip("tilelang")

REGISTRY = load_registry(strict=True)
OP = REGISTRY.op("TopkSelectorFwd")


def workload(shape, topk, **params):
    b, s = shape[:2]
    return Workload("TopkSelectorFwd", "T", "test", "f32", {"index_score": list(shape), "starts": [b, s], "ends": [b, s]},
                    params={"topk": topk, **params}, shape_dtypes={"starts": "i32", "ends": "i32"})


def cpu_selector(w, **config):
    """The kernel (the default's logic unless ``config`` says otherwise) without its warp shuffles,
    which TileLang's CPU target cannot build: the same sample, list and rounds."""
    from npuops_topk.select_kernel import DEFAULT, select_kernel, tile_level

    spec = select_kernel(*w.shapes["index_score"], OP.config(w)["topk"], **tile_level({**DEFAULT, **config}))
    return spec.bind(compile_kernel(spec.prim_func, target=CPU_TARGET), torch.device("cpu"))


CASES = [
    ((1, 64, 256, 1), 16, {"prefix_len": 0}),  # early rows have fewer keys than topk
    ((1, 64, 256, 1), 32, {"prefix_len": 0, "padded_rows": 4}),  # and rows with no key at all
    ((2, 16, 300, 3), 16, {}),  # batches and kv groups
    ((1, 8, 5000, 1), 64, {}),  # rows longer than a block's step, the last step clamped
    ((1, 4, 16384, 1), 100, {}),  # rows of whole steps (as the catalog's), loaded unclamped
]


@pytest.mark.parametrize("shape,topk,params", CASES)
def test_selection_is_exact_on_the_cpu_target(shape, topk, params):
    w = workload(shape, topk, **params)
    OP.validate(w)
    result = check(OP, w, cpu_selector(w), CPUDevice(), seed=1)
    assert result.ok, result.detail


def test_every_launch_variants_logic_is_exact_on_the_cpu_target():
    w = workload((1, 6, 20000, 1), 50)
    variants = OP.tilelang_variants(w)
    assert len({tuple(v.items()) for v in variants}) == len(variants) > 1
    for config in variants:  # their tile-level twins; the per-thread code is compiled below, run on GPUs
        assert check(OP, w, cpu_selector(w, **config), CPUDevice(), seed=4).ok, config


def test_per_thread_launch_variants_compile_for_sm90():
    from npuops_topk.select_kernel import select_kernel

    w = OP.workloads[0]
    for config in OP.tilelang_variants(w):
        if config["warp_append"] or config["warp_scan"]:
            spec = select_kernel(*w.shapes["index_score"], OP.config(w)["topk"], **config)
            assert "__shfl_" in compile_kernel(spec.prim_func, "sm_90", spec.pass_configs).get_kernel_source()


def test_ties_pick_any_of_the_equal_scores():
    w = workload((1, 32, 400, 1), 40, prefix_len=50)
    inputs = OP.make_inputs(w, InputRNG("cpu", seed=2))
    inputs["index_score"] = (inputs["index_score"] * 2).round() / 2  # few distinct values: many ties
    out = cpu_selector(w)(**inputs)
    assert OP.compare(out, OP.reference({k: v.clone() for k, v in inputs.items()}, w), w).ok
    broken = out.clone()
    broken[0, 31, 0, 1] = broken[0, 31, 0, 0]  # a repeated index must be caught
    assert not OP.compare(broken, OP.reference({k: v.clone() for k, v in inputs.items()}, w), w).ok


def order_keys(scores: torch.Tensor) -> torch.Tensor:
    """The kernel's order-preserving 32-bit keys of f32 scores, as int64."""
    bits = scores.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    return torch.where(scores < 0, bits ^ 0xFFFFFFFF, bits | 0x80000000)


def listed_by_sample(row: torch.Tensor, taken: int, step: int) -> int:
    """How many keys of a whole row (start 0) the kernel lists: those at or above the floor its
    sample sets (the top 12 bits where the sample's count from the top reaches its quota)."""
    from npuops_topk.select_kernel import SAMPLE_DIGIT, sample_position, sample_quota

    shift, _ = SAMPLE_DIGIT
    length = row.numel()
    digits = order_keys(row) >> shift
    sampled = digits[[sample_position(0, length, i, step) for i in range(step)]]
    quota = sample_quota(taken, length, step)
    floor = max((d for d in sampled.unique().tolist() if int((sampled >= d).sum()) >= quota), default=0)
    return int((digits >= floor).sum())


def default_step() -> int:
    """Keys per step, and so the sample's size, at the default launch."""
    from npuops_topk.select_kernel import THREADS, VECTOR

    return THREADS * VECTOR


def one_row(length: int, topk: int):
    return workload((1, 1, length, 1), topk, prefix_len=length - 1)


def check_row(w, scores: torch.Tensor):
    inputs = OP.make_inputs(w, InputRNG("cpu", seed=3))
    inputs["index_score"] = scores.view(inputs["index_score"].shape)
    out = cpu_selector(w)(**inputs)
    return OP.compare(out, OP.reference({k: v.clone() for k, v in inputs.items()}, w), w)


def test_a_row_whose_sample_lists_more_keys_than_fit_takes_the_exact_fallback():
    """20000 keys sharing their top 12 bits (1.0 plus low mantissa bits): all are listed."""
    from npuops_topk.select_kernel import CANDIDATES

    w = one_row(20000, 100)
    noise = torch.randint(0, 1 << 12, (20000,), dtype=torch.int32)
    scores = (torch.ones(20000).view(torch.int32) | noise).view(torch.float32)
    assert listed_by_sample(scores, 100, default_step()) > CANDIDATES
    assert check_row(w, scores).ok


def test_a_row_whose_sample_lists_fewer_keys_than_topk_takes_the_exact_fallback():
    """Large scores only where the kernel samples: the floor its sample sets lists too few."""
    from npuops_topk.select_kernel import sample_position

    length, topk = 40000, 1000
    w = one_row(length, topk)
    scores = torch.randn(length) - 100
    sampled = torch.tensor([sample_position(0, length, i, default_step()) for i in range(default_step())])
    scores[sampled] = torch.exp2(torch.rand(sampled.numel()) * 20 + 10)  # spread over many digits
    assert listed_by_sample(scores, topk, default_step()) < topk
    assert check_row(w, scores).ok


def test_a_row_of_normal_scores_is_listed_without_fallback():
    """The case the sample is built for: the list holds the top-k and fits."""
    from npuops_topk.select_kernel import CANDIDATES

    w = one_row(49152, 2048)
    scores = torch.randn(49152)
    assert 2048 <= listed_by_sample(scores, 2048, default_step()) <= CANDIDATES
    assert check_row(w, scores).ok


def test_a_block_taking_many_rows_reuses_floors_only_where_exact():
    """``grid``: one block takes every row in turn and tries the previous row's floor. Rows whose
    scores shift (so that the floor lists too many or too few keys) and short rows between them
    must come out exact all the same."""
    w = workload((1, 12, 20000, 1), 60, prefix_len=19000)
    inputs = OP.make_inputs(w, InputRNG("cpu", seed=5))
    scale = torch.tensor([1, 1, 1, 0.01, 0.01, 100, 1, 1, -1, 1, 1, 1.0])
    inputs["index_score"] = inputs["index_score"] * scale[None, :, None, None] + torch.arange(12.0)[None, :, None, None] / 4
    inputs["ends"][0, 7] = 3000  # a row short enough to list every key, no floor to hand on
    out = cpu_selector(w, grid=1)(**inputs)
    assert OP.compare(out, OP.reference({k: v.clone() for k, v in inputs.items()}, w), w).ok


def test_compiles_for_sm90():
    from npuops_topk.select_kernel import select_kernel

    w = OP.workloads[0]
    spec = select_kernel(*w.shapes["index_score"], OP.config(w)["topk"])
    source = compile_kernel(spec.prim_func, "sm_90", spec.pass_configs).get_kernel_source()
    assert "__global__" in source
    # Two TileLang hazards the H200 caught, checked in the generated CUDA: an atomic whose result
    # the bounds check repeats (one slot must be one increment), and a scan whose steps run on part
    # of the block, where TileLang drops the barriers between them.
    assert all(statement.count("AtomicAddRet") <= 1 for statement in source.split(";"))
    assert not any("for (int level" in body for body in thread_subset_blocks(source))


def thread_subset_blocks(source: str):
    """The bodies of ``if (((int)threadIdx.x) < N) { ... }`` in generated CUDA."""
    head = "if (((int)threadIdx.x) < "
    at = source.find(head)
    while at >= 0:
        start = source.index("{", at) + 1
        depth, end = 1, start
        while depth:
            depth += {"{": 1, "}": -1}.get(source[end], 0)
            end += 1
        yield source[start:end - 1]
        at = source.find(head, end)


@pytest.mark.gpu
@pytest.mark.parametrize("shape,topk,params", CASES)
def test_selection_is_exact_on_the_gpu(shape, topk, params):
    device = REGISTRY.device("cuda")
    impl = REGISTRY.implementation("TopkSelectorFwd", "tilelang")
    w = workload(shape, topk, **params)
    assert check(OP, w, impl.build(OP, w, device.torch_device()), device, seed=1).ok


@pytest.mark.gpu
@pytest.mark.parametrize("shape,topk,params", CASES)
@pytest.mark.parametrize("variant", range(len(OP.tilelang_variants(OP.workloads[0]))))
def test_every_launch_variant_is_exact_on_the_gpu(variant, shape, topk, params):
    w = workload(shape, topk, **params)
    assert_exact_on_the_gpu(w, OP.tilelang_variants(w)[variant])


@pytest.mark.gpu
@pytest.mark.parametrize("workload_id", ["W1", "W2"])
def test_catalog_workloads_on_the_gpu(workload_id):
    device = REGISTRY.device("cuda")
    impl = REGISTRY.implementation("TopkSelectorFwd", "tilelang")
    w = OP.workload(workload_id)
    result = check(OP, w, impl.build(OP, w, device.torch_device()), device, seed=1)
    assert result.ok, result.detail


@pytest.mark.gpu
@pytest.mark.parametrize("shape,topk,params", CASES)
@pytest.mark.parametrize("lead", [True, False])
def test_blocks_taking_many_rows_are_exact_on_the_gpu(lead, shape, topk, params):
    """``grid`` on the small shapes, with few enough blocks that each takes several rows (the
    catalog's grid exceeds their rows): floors handed on, the next row's first step loaded early."""
    from npuops_topk.select_kernel import DEFAULT

    assert_exact_on_the_gpu(workload(shape, topk, **params), {**DEFAULT, "grid": 3, "lead": lead})


def assert_exact_on_the_gpu(w, config):
    """Our kernel, launched with ``config``, is exact on ``w``. One shape a test: each compiles its
    own kernel (tens of seconds), so pytest-xdist can spread them."""
    device = REGISTRY.device("cuda")
    impl = REGISTRY.implementation("TopkSelectorFwd", "tilelang")
    assert check(OP, w, impl.build(OP, w, device.torch_device(), config), device, seed=1).ok, (w.shapes, config)
