"""One build per kernel, not per shape (issue 42): the sizes-at-launch kernel takes the planes and
the spatial sizes when it is launched, so a sweep of image sizes, batches and channels maps to a
few kernel keys, one build serves every workload of its key, and no thread divides by a size."""

from __future__ import annotations

import math
import re
import subprocess
import sys

import pytest
import torch

from npuops.check import check
from npuops.devices import CPUDevice
from npuops.kernels import CPU_TARGET, compile_kernel
from npuops.registry import load_registry

pytest.importorskip("tilelang")

from test_pool import make_workload  # noqa: E402

REGISTRY = load_registry(strict=True)
# 20 image sides from 7 to 300, odd and even, rows of whole 16-byte vectors and not.
SIDES = (7, 8, 9, 14, 15, 16, 23, 28, 31, 32, 55, 56, 64, 99, 112, 127, 150, 224, 256, 300)
# (N, C) per side, cycled: a single image of three channels (fewer planes than a block takes) to
# a batch of 32 x 64.
BATCHES = ((1, 3), (2, 16), (8, 64), (32, 64), (1, 512), (4, 24))
STEM = dict(kernel_size=3, stride=2, padding=1)

# Per op, the window params of a sweep over SIDES (3-d: a depth of side // 8, at least 3).
SWEEPS = [
    ("MaxPool2dFwd", STEM),
    ("MaxPool2dFwd", dict(kernel_size=3, stride=2, ceil_mode=True)),
    ("MaxPool2dFwd", dict(kernel_size=2, stride=2)),
    ("MaxPool2dFwd", dict(kernel_size=3, stride=1, padding=1, dilation=[2, 1])),
    ("AvgPool2dFwd", STEM),
    ("AvgPool2dFwd", dict(kernel_size=[3, 5], stride=2, padding=[1, 2], ceil_mode=True, count_include_pad=False,
                          divisor_override=16)),
    ("MaxPool1dFwd", dict(kernel_size=5, stride=2, padding=2, dilation=2, ceil_mode=True)),
    ("AvgPool1dFwd", dict(kernel_size=4, stride=2, padding=1, ceil_mode=True, count_include_pad=False)),
    ("MaxPool3dFwd", dict(kernel_size=3, stride=2, padding=1)),
    ("AvgPool3dFwd", dict(kernel_size=[2, 3, 3], stride=2, padding=1, ceil_mode=True)),
]


def dims_of(op_name: str) -> int:
    return int(op_name[-5])  # "MaxPool2dFwd" -> 2


def sweep(op_name, params, dtype="bf16", sides=SIDES):
    """The workloads of ``op_name`` over ``sides``, batches and channels varying."""
    dims = dims_of(op_name)
    for i, side in enumerate(sides):
        spatial = {1: (side * 7,), 2: (side, side), 3: (max(3, side // 8), side, side)}[dims]
        yield make_workload(op_name, (*BATCHES[i % len(BATCHES)], *spatial), dtype, **params)


def build_key(op_name, w):
    """The key the functions for model code build ``w``'s kernel under (one build per key)."""
    return REGISTRY.implementation(op_name, "tilelang").build_key(REGISTRY.op(op_name), w)


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
def test_max_pool2d_over_20_image_sizes_takes_at_most_4_builds(dtype):
    """The issue's bar: one window, 20 image sizes (7 to 300), batches and channels varying."""
    keys = {build_key("MaxPool2dFwd", w) for w in sweep("MaxPool2dFwd", STEM, dtype)}
    assert len(keys) <= 4, keys
    assert not any(side in str(key) for key in keys for side in ("112", "300"))  # no size in a key


@pytest.mark.parametrize("op_name,params", SWEEPS)
def test_every_sliding_window_sweep_takes_at_most_4_builds(op_name, params):
    keys = {build_key(op_name, w) for w in sweep(op_name, params)}
    assert len(keys) <= 4, keys
    # Those keys' builds are the sizes-at-launch kernel's: none is per shape.
    op = REGISTRY.op(op_name)
    assert all(op.tilelang_variants(w)[0]["kernel"] == "sizes_at_launch" for w in sweep(op_name, params))


def test_a_fresh_process_counts_its_builds_through_the_functions_build_cache():
    """What ``npuops_pool.max_pool2d`` builds in a fresh process, on a machine without a GPU: the
    functions' build cache (``npuops.functional._kernel``) over the 20 sizes' workloads, with each
    build counted instead of compiled."""
    script = f"""
import sys, torch
sys.path.insert(0, {str(__file__.rsplit('/', 1)[0])!r})
import npuops.functional as functional
from npuops.registry import load_registry
from test_pool_sizes_at_launch import sweep, STEM
registry = load_registry(strict=True)
op = registry.op("MaxPool2dFwd")
impl = next(i for i in registry.impls_for("MaxPool2dFwd") if i.tier == "ours")
built = []
class Counted:
    def build(self, op, w, device):
        built.append(w.shapes["input"])
        return object()
    def __getattr__(self, name):
        return getattr(impl, name)
for w in sweep("MaxPool2dFwd", STEM):
    kernel, why, _ = functional._kernel(Counted(), op, w, torch.device("cuda"), "max_pool2d", behind=False)
    assert kernel is not None, why
print(len(built), functional.built_kernels())
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    builds, kernels = map(int, result.stdout.split()[-2:])
    assert builds <= 4 and kernels == builds, result.stdout


def test_equal_keys_build_the_same_code():
    """The key holds everything the kernel's code depends on: equal keys, equal TIR."""
    from npuops_pool.pool_kernel import pool_kernel

    for op_name, params in SWEEPS[:2] + SWEEPS[5:7] + SWEEPS[8:9]:
        op = REGISTRY.op(op_name)
        code = {}
        for w in sweep(op_name, params, sides=SIDES[::3]):
            script = pool_kernel(op.pooling(w), w.shapes["input"], w.dtype_of("input")).prim_func.script()
            assert code.setdefault(op.kernel_key(w), script) == script, (op_name, w.shapes)
        assert len(code) >= 2  # both row classes (whole vectors and not) were built


# Per spatial rank: input sizes whose rows are whole f32 vectors (4) and not, two of each, odd
# sizes among them; (N, C): fewer planes than a block takes, and more.
SPATIAL = {1: [(35,), (37,), (48,), (64,)], 2: [(7, 9), (10, 11), (8, 12), (13, 16)],
           3: [(3, 7, 9), (4, 5, 7), (3, 7, 8), (5, 9, 12)]}
PLANES = [(1, 3), (2, 20)]
# Per op, window params: odd windows, ceil mode, padding, dilation, each way of dividing a sum.
SHARED_BUILDS = [
    ("MaxPool2dFwd", STEM),
    ("MaxPool2dFwd", dict(kernel_size=3, stride=2, ceil_mode=True)),
    ("MaxPool2dFwd", dict(kernel_size=[2, 3], stride=[1, 2], padding=1, dilation=[3, 1])),
    ("AvgPool2dFwd", dict(kernel_size=[3, 5], stride=2, padding=[1, 2], ceil_mode=True, count_include_pad=False)),
    ("AvgPool2dFwd", dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    ("AvgPool2dFwd", dict(kernel_size=3, stride=[2, 1], padding=1, divisor_override=5)),
    ("MaxPool1dFwd", dict(kernel_size=5, stride=2, padding=2, dilation=2, ceil_mode=True)),
    ("AvgPool1dFwd", dict(kernel_size=4, stride=3, padding=1, ceil_mode=True, count_include_pad=False)),
    ("MaxPool3dFwd", dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    ("AvgPool3dFwd", dict(kernel_size=[2, 3, 3], stride=2, padding=1, ceil_mode=True, count_include_pad=False)),
]


@pytest.mark.parametrize("flat", [None, False], ids=["default", "row-tiles"])
@pytest.mark.parametrize("op_name,params", SHARED_BUILDS)
def test_one_build_serves_every_size_of_its_key_on_the_cpu_target(op_name, params, flat):
    """Each key's build, compiled once for the CPU target, computes every workload of that key:
    by default threads counted flat, a key per row class (whole vectors or not); row tiles, two
    row classes x two plane classes."""
    from npuops_pool.pool_kernel import kernel_key, pool_kernel

    op = REGISTRY.op(op_name)
    built, served = {}, {}
    shapes = [(*planes, *spatial) for planes in PLANES for spatial in SPATIAL[dims_of(op_name)]]
    for seed, shape in enumerate(shapes):
        w = make_workload(op_name, shape, "f32", **params)
        spec_of_w = (op.pooling(w), w.shapes["input"], torch.float32)
        config = {"kernel": "sizes_at_launch", "flat": flat}
        key = kernel_key(*spec_of_w, **config)
        if key not in built:
            spec = pool_kernel(*spec_of_w, **config)
            assert spec.config["flat"] == (flat is None)
            built[key] = spec.bind(compile_kernel(spec.prim_func, pass_configs=spec.pass_configs, target=CPU_TARGET), torch.device("cpu"))
        result = check(op, w, built[key], CPUDevice(), seed=seed)
        assert result.ok, (shape, result.detail)
        served[key] = served.get(key, 0) + 1
    if flat is None:
        assert op.kernel_key(w) in built  # the default launch's key is among them
        assert sorted(served.values()) == [4, 4]
    else:
        assert len(built) == 4 and set(served.values()) == {2}


@pytest.mark.parametrize("op_name,params", SHARED_BUILDS)
def test_four_outputs_a_thread_counted_flat_on_the_cpu_target(op_name, params):
    """The flat order with several outputs a thread (a tuning variant): rows of whole vectors and
    rows loaded a tap at a time, every size of a key from one build."""
    from npuops_pool.pool_kernel import kernel_key, pool_kernel

    op = REGISTRY.op(op_name)
    built = {}
    config = {"kernel": "sizes_at_launch", "flat": True, "outputs": 4}
    for seed, spatial in enumerate(SPATIAL[dims_of(op_name)]):
        w = make_workload(op_name, (*PLANES[1], *spatial), "f32", **params)
        spec_of_w = (op.pooling(w), w.shapes["input"], torch.float32)
        key = kernel_key(*spec_of_w, **config)
        if key not in built:
            spec = pool_kernel(*spec_of_w, **config)
            assert spec.config["flat"] and spec.config["outputs"] == 4
            built[key] = spec.bind(compile_kernel(spec.prim_func, pass_configs=spec.pass_configs, target=CPU_TARGET), torch.device("cpu"))
        result = check(op, w, built[key], CPUDevice(), seed=seed)
        assert result.ok, (spatial, result.detail)
    assert len(built) == 2  # rows of whole vectors and not


@pytest.mark.parametrize("op_name,params", [("MaxPool2dFwd", STEM), ("MaxPool3dFwd", dict(kernel_size=2, stride=1))])
def test_nan_reaches_exactly_its_windows_on_the_cpu_target(op_name, params):
    from npuops_pool.pool_kernel import pool_kernel

    op = REGISTRY.op(op_name)
    for shape in ([(2, 3, 9, 16), (1, 2, 11, 11)] if dims_of(op_name) == 2 else [(1, 2, 3, 6, 8), (2, 2, 4, 5, 7)]):
        w = make_workload(op_name, shape, "f32", **params)
        spec = pool_kernel(op.pooling(w), w.shapes["input"], torch.float32)
        fn = spec.bind(compile_kernel(spec.prim_func, pass_configs=spec.pass_configs, target=CPU_TARGET), torch.device("cpu"))
        x = torch.randn(shape)
        planes = x.view(-1, math.prod(shape[2:]))
        planes[0, 0] = planes[-1, -1] = float("nan")
        expected = op.reference({"input": x}, w)
        out = fn(input=x)
        assert torch.equal(torch.isnan(out), torch.isnan(expected)) and op.compare(out, expected, w).ok, shape


def test_launch_classes_and_variants():
    """Threads counted flat: rows of whole vectors load them, four outputs a thread; other rows
    (and odd strides over 16-bit rows) a tap a load, two outputs a thread. The row tiles (16
    along a row that loads a tap at a time, 32 with few planes) and one output a thread are
    variants, the per-shape kernels after them."""
    from npuops_pool.pool_kernel import kernel_key, sized_launch

    op = REGISTRY.op("MaxPool2dFwd")

    def launch(shape, dtype="bf16", **params):
        w = make_workload("MaxPool2dFwd", shape, dtype, **(params or STEM))
        return sized_launch(op.pooling(w), w.shapes["input"], w.dtype_of("input"))

    classes = ("vector", "groups", "outputs", "flat")
    assert {k: launch((32, 64, 112, 112))[k] for k in classes} == {"vector": 8, "groups": None, "outputs": 4, "flat": True}
    assert launch((1, 3, 112, 112)) == launch((32, 64, 112, 112))  # the planes make no class
    assert {k: launch((32, 64, 111, 111))[k] for k in classes} == {"vector": 1, "groups": None, "outputs": 2, "flat": True}
    assert launch((32, 64, 112, 112), "f32")["vector"] == 4
    assert launch((32, 64, 112, 112), kernel_size=3, stride=3)["vector"] == 1  # 8 outputs a thread: a tap a load
    assert launch((32, 64, 112, 112), "f32", kernel_size=3, stride=3)["vector"] == 4
    w = make_workload("MaxPool2dFwd", (1, 3, 111, 111), "bf16", **STEM)
    variants = op.tilelang_variants(w)
    assert variants[0] == {"kernel": "sizes_at_launch", "threads": 128, "flat": True}
    assert {"kernel": "sizes_at_launch", "threads": 256, "flat": True, "outputs": 1} in variants
    assert {"kernel": "sizes_at_launch", "threads": 128, "groups": 32} in variants  # few planes: a row a block
    w = make_workload("MaxPool2dFwd", (32, 64, 112, 112), "bf16", **STEM)
    variants = op.tilelang_variants(w)
    kernels = [v["kernel"] for v in variants]
    assert kernels[:4] == ["sizes_at_launch"] * 4 and "vectors" in kernels and "window" in kernels
    assert {"kernel": "sizes_at_launch", "threads": 128, "groups": 4} in variants
    # The per-shape kernels keep their own keys: the shape is in them.
    vectors = next(v for v in variants if v["kernel"] == "vectors")
    assert (32, 64, 112, 112) in kernel_key(op.pooling(w), w.shapes["input"], w.dtype_of("input"), **vectors).shared


def test_grids_past_cudas_limits_long_windows_and_global_windows_keep_the_per_shape_kernels():
    op = REGISTRY.op("MaxPool1dFwd")
    # Blocks are numbered in one grid dim (2**31 - 1 of them): a row of 2**22 outputs is no limit.
    long = make_workload("MaxPool1dFwd", (1, 2, 4 * 65536 * 16 + 64), "bf16", kernel_size=2, stride=2)
    assert op.tilelang_variants(long)[0]["kernel"] == "sizes_at_launch"
    op = REGISTRY.op("MaxPool2dFwd")
    whole = make_workload("MaxPool2dFwd", (2, 3, 9, 9), "bf16", kernel_size=9)
    assert op.tilelang_variants(whole)[0]["kernel"] in ("planes", "lanes")
    # More taps than a thread holds in registers (TAPS_PER_THREAD); a 7 x 7 window, stride 1, still fits.
    long = make_workload("MaxPool2dFwd", (2, 64, 112, 112), "bf16", kernel_size=17, stride=1, padding=8)
    assert op.tilelang_variants(long)[0]["kernel"] != "sizes_at_launch"
    seven = make_workload("MaxPool2dFwd", (2, 64, 112, 112), "bf16", kernel_size=7, stride=1, padding=3)
    assert op.tilelang_variants(seven)[0]["kernel"] == "sizes_at_launch"


def test_launches_past_cudas_grid_are_no_variants():
    """A row tile of few planes a block (FEW_PLANES_GROUPS) over 2**33 planes would take 2**31
    blocks: not offered, where the default (counted flat) takes the workload in 2**27."""
    from npuops_pool.pool_kernel import GRID_X_LIMIT, sized_blocks, sized_launch

    op = REGISTRY.op("MaxPool2dFwd")
    few_planes = {"kernel": "sizes_at_launch", "threads": 128, "groups": 32}
    small, huge = (make_workload("MaxPool2dFwd", shape, "bf16", kernel_size=2, stride=2)
                   for shape in ((2, 64, 2, 16), (2**17, 2**16, 2, 16)))
    assert few_planes in op.tilelang_variants(small) and few_planes not in op.tilelang_variants(huge)
    launch = sized_launch(op.pooling(huge), huge.shapes["input"], torch.bfloat16)
    assert launch["wide"] and sized_blocks(op.pooling(huge), huge.shapes["input"], launch) == 2**27 < GRID_X_LIMIT
    assert op.tilelang_variants(huge)[0] == {"kernel": "sizes_at_launch", "threads": 128, "flat": True}


# A division or remainder by a size given at launch (their names in the kernel's parameters).
SIZE_DIVISION = re.compile(r"[/%]\s*\(*(\(int64_t\))?\(*(planes|D|H|W|oD|oH|oW)\b")


def test_catalog_workloads_compile_for_sm90a_with_no_division_by_a_size():
    """Every catalog workload's default build (one per key), as the GPU builds it, and each op's
    row tiles: threads counted flat divide their number by the output sizes, in 32 bits (64 only
    to address); the row tiles divide only their block's number (the same in every thread)."""
    from npuops_pool.pool_kernel import kernel_key, pool_kernel

    seen, orders = set(), set()
    for op_name in sorted(name for name, op in REGISTRY.ops.items() if op.family == "pool"):
        op = REGISTRY.op(op_name)
        for n, w in enumerate(op.workloads):
            sized = op.tilelang_variants(w)[0]["kernel"] == "sizes_at_launch"
            configs = [{}] + ([{"kernel": "sizes_at_launch", "flat": False}] if sized and n == 0 else [])
            for config in configs:
                key = kernel_key(op.pooling(w), w.shapes["input"], w.dtype_of("input"), **config)
                if key in seen:
                    continue
                seen.add(key)
                spec = pool_kernel(op.pooling(w), w.shapes["input"], w.dtype_of("input"), **config)
                source = compile_kernel(spec.prim_func, arch="sm_90a", pass_configs=spec.pass_configs).get_kernel_source()
                assert "__global__" in source, (op_name, w.id)
                if spec.config["kernel"] != "sizes_at_launch":
                    continue
                body = source[source.index("__launch_bounds__"):]
                divides = [line for line in body.splitlines() if SIZE_DIVISION.search(line)]
                widened = set(re.findall(r"\(int64_t\)\w+", body)) - {"(int64_t)offset", "(int64_t)4", "(int64_t)8"}
                assert divides and not widened, (op_name, w.id, widened)
                if not spec.config["flat"]:
                    assert all("blockIdx.x) /" in line or "blockIdx.x) %" in line for line in divides), (op_name, w.id, divides)
                orders.add(spec.config["flat"])
    assert orders == {True, False}


def test_rows_of_whole_vectors_load_16_bytes_at_once_on_sm90a():
    from npuops_pool.pool_kernel import pool_kernel

    op = REGISTRY.op("MaxPool2dFwd")
    for side in (112, 111):
        w = make_workload("MaxPool2dFwd", (32, 64, side, side), "bf16", **STEM)
        spec = pool_kernel(op.pooling(w), w.shapes["input"], torch.bfloat16)
        source = compile_kernel(spec.prim_func, arch="sm_90a", pass_configs=spec.pass_configs).get_kernel_source()
        assert bool(re.search(r"\*\(uint4\*\)\(X \+", source)) == (side == 112), side
        # Offsets are computed and clamped in 32 bits, sign-extended only to address vectors.
        assert "int offset" in source and set(re.findall(r"\(int64_t\)\w+", source)) <= {"(int64_t)offset", "(int64_t)8"}, side


def test_sizes_past_int32_indices_get_a_64_bit_build():
    from npuops_pool.pool_kernel import pool_kernel

    op = REGISTRY.op("MaxPool2dFwd")
    small = make_workload("MaxPool2dFwd", (32, 64, 112, 112), "bf16", **STEM)
    huge = make_workload("MaxPool2dFwd", (2048, 128, 112, 112), "bf16", **STEM)
    assert op.kernel_key(small) != op.kernel_key(huge)
    spec = pool_kernel(op.pooling(huge), huge.shapes["input"], torch.bfloat16)
    source = compile_kernel(spec.prim_func, arch="sm_90a", pass_configs=spec.pass_configs).get_kernel_source()
    assert "int64_t planes" in source


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_max_pool2d_over_20_image_sizes_builds_at_most_4_kernels_on_the_gpu(dtype):
    """The bar itself, through the function: each call matches F.max_pool2d and runs our kernel;
    builds counted once every build has ended (earlier tests' builds behind theirs too)."""
    import npuops_pool as P
    import torch.nn.functional as F
    from npuops.functional import built_kernels, coverage, finish_builds, reset_coverage

    finish_builds()
    before = built_kernels()
    reset_coverage()
    for w in sweep("MaxPool2dFwd", STEM):
        x = torch.randn(w.shapes["input"], device="cuda", dtype=dtype)
        assert torch.equal(P.max_pool2d(x, 3, 2, 1), F.max_pool2d(x, 3, 2, 1)), w.shapes["input"]
    assert coverage()["max_pool2d"]["ours"] == len(SIDES), coverage()
    finish_builds()
    assert built_kernels() - before <= 4, built_kernels() - before
