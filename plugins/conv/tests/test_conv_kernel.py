"""Our TileLang forward-convolution kernels (npuops_conv.conv_kernel): the launch rules pick the
kernel each kind of convolution should take; representative kernels compile for sm_90a anywhere
(CPU CI); on a GPU (marker ``gpu``) every kernel matches an fp32 torch reference on fresh random
inputs, its output pre-filled with NaN so that unwritten elements fail."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from npuops import nan_filled_allocations
from npuops.kernels import compile_kernel
from npuops_conv.conv_kernel import (
    ConvLaunch,
    Problem,
    conv_kernel,
    default_launch,
    halo_fits,
    halo_launches,
    launch_variants,
    unsupported,
)
from npuops_conv.layouts import CHANNELS_FIRST, CHANNELS_LAST
from npuops_conv.ops._geometry import ConvGeometry

F16, BF16, F32, FP8 = torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn
LAYOUTS = pytest.mark.parametrize("output_layout", [CHANNELS_LAST, CHANNELS_FIRST])


def geo(batch, c_in, c_out, size, kernel, stride=1, pad=0, dilation=1, groups=1, bias=False, pad_after=None):
    """A ConvGeometry; ints stand for every spatial dim."""
    rank = len(size)

    def dims(v):
        return (v,) * rank if isinstance(v, int) else tuple(v)

    return ConvGeometry(batch, c_in, c_out, tuple(size), dims(kernel), dims(stride), dims(pad),
                        dims(pad if pad_after is None else pad_after), dims(dilation), groups, bias)


# Every feature of the template: (id, geometry, dtype, relu).
GEOMETRIES = [
    ("3x3-bias-f16", geo(2, 64, 64, (14, 15), 3, pad=1, bias=True), F16, False),
    ("3x3-bf16-partial-tiles", geo(1, 32, 40, (9, 11), 3, pad=1, bias=True), BF16, False),
    ("pointwise-stride2", geo(2, 128, 96, (13, 13), 1, stride=2), F16, False),
    ("strided-dilated-relu", geo(1, 64, 128, (23, 20), 3, stride=2, pad=2, dilation=2, bias=True), F16, True),
    ("asymmetric-pad", geo(1, 32, 64, (10, 12), (3, 2), pad=(2, 0), pad_after=(0, 1)), F16, False),
    ("grouped-gemm", geo(1, 128, 256, (12, 12), 3, pad=1, groups=4, bias=True), F16, False),
    ("grouped-thin-direct", geo(1, 128, 256, (12, 12), 3, pad=1, groups=32), F16, False),
    ("depthwise-bias", geo(2, 32, 32, (17, 16), 3, pad=1, groups=32, bias=True), F16, False),
    ("depthwise-multiplier-stride", geo(1, 16, 32, (15, 15), 5, stride=2, pad=2, groups=16), BF16, False),
    ("flat-cin3-stride2", geo(1, 3, 64, (30, 31), 3, stride=2, pad=1, bias=True), F16, True),
    ("conv1d-causal-cin80", geo(1, 80, 128, (301,), 3, pad=2, pad_after=0, bias=True), BF16, False),
    ("conv1d-causal-cin1", geo(1, 1, 32, (500,), 7, pad=6, pad_after=0), F16, False),
    ("conv1d-stride5", geo(2, 1, 64, (400,), 10, stride=5), BF16, False),
    ("conv1d-grouped-dilated", geo(1, 4, 8, (17,), 3, pad=2, dilation=2, groups=2), F16, False),
    ("conv3d-stride2", geo(1, 64, 128, (6, 14, 14), 3, stride=2, pad=1, bias=True), F16, False),
    ("pointwise-64ch", geo(2, 64, 256, (56, 55), 1), F16, False),
    ("conv3d-dilated", geo(1, 32, 64, (8, 9, 9), 3, pad=2, dilation=2), BF16, False),
    ("conv3d-grouped-thin", geo(1, 64, 128, (4, 7, 7), 3, pad=1, groups=32), F16, False),
    ("split-k-deep", geo(1, 1024, 128, (8, 8), 3, pad=2, dilation=2, bias=True), F16, True),
    ("split-k-tail", geo(1, 704, 64, (7, 7), 3, pad=1), BF16, False),
    # ASPP-like: 4-row tiles whose windows lie in the padding at some taps (skipped), split-K
    ("aspp-skips-padding", geo(1, 256, 64, (16, 16), 3, pad=6, dilation=6), F16, False),
    ("f32-direct", geo(1, 2, 3, (5, 6), 3, pad=1), F32, False),
    ("f32-gemm-tf32", geo(1, 32, 64, (9, 10), 3, pad=1, bias=True), F32, False),
    ("fp8-3x3", geo(2, 64, 64, (12, 12), 3, pad=1), FP8, False),
    ("fp8-pointwise", geo(1, 128, 256, (7, 7), 1), FP8, False),
]
BY_ID = {name: (g, dtype, relu) for name, g, dtype, relu in GEOMETRIES}


# -- launch rules (no compiler) ------------------------------------------------------------------

def test_each_kind_of_convolution_takes_its_kernel():
    kind = {name: default_launch(Problem(g, dtype, relu)).kernel for name, g, dtype, relu in GEOMETRIES}
    for name in ("depthwise-bias", "depthwise-multiplier-stride", "grouped-thin-direct", "conv1d-causal-cin1",
                 "conv1d-stride5", "conv1d-grouped-dilated", "conv3d-grouped-thin", "f32-direct"):
        assert kind[name] == "direct", name
    for name in ("split-k-deep", "split-k-tail"):
        assert kind[name] == "split_k", name
    for name in ("3x3-bias-f16", "pointwise-stride2", "grouped-gemm", "flat-cin3-stride2", "conv3d-stride2",
                 "fp8-3x3", "fp8-pointwise", "f32-gemm-tf32"):
        assert kind[name] == "gemm", name
    # The catalog's deep dilated conv (ASPP: C_in 2048, 3x3, K = 18432, 32x32 outputs) splits K.
    aspp = default_launch(Problem(geo(1, 2048, 256, (32, 32), 3, pad=12, dilation=12), F16))
    assert aspp.kernel == "split_k" and aspp.splits > 1


def test_split_k_leaves_no_split_empty():
    for name in ("split-k-deep", "split-k-tail"):
        g, dtype, relu = BY_ID[name]
        launch = default_launch(Problem(g, dtype, relu))
        k_tiles = -(-Problem(g, dtype).k // launch.block_K)
        per_split = -(-k_tiles // launch.splits)
        assert (launch.splits - 1) * per_split < k_tiles


def test_k_tiles_lie_in_one_tap_where_the_channels_allow():
    assert default_launch(Problem(BY_ID["conv1d-causal-cin80"][0], BF16)).block_K == 16  # 80 = 5 x 16
    assert default_launch(Problem(BY_ID["3x3-bias-f16"][0], F16)).block_K == 64
    assert default_launch(Problem(BY_ID["fp8-pointwise"][0], FP8)).block_K == 128


@pytest.mark.parametrize("name", list(BY_ID))
def test_launch_variants_are_valid_configs_default_first(name):
    g, dtype, relu = BY_ID[name]
    variants = launch_variants(Problem(g, dtype, relu))
    assert variants[0] == default_launch(Problem(g, dtype, relu)).as_dict()
    assert len(variants) == len({tuple(sorted(v.items())) for v in variants})
    for v in variants:
        launch = ConvLaunch(**v)
        assert launch.kernel in ("gemm", "split_k", "direct", "window", "halo")
        assert not (dtype == FP8 and launch.kernel in ("direct", "window", "halo"))
        if launch.kernel in ("gemm", "split_k", "halo"):
            assert launch.num_stages >= 1 and launch.block_K % 8 == 0
        if launch.kernel == "halo":  # whole taps a K step, the box's input within the budget
            assert launch.block_K % g.in_channels == 0 and halo_fits(Problem(g, dtype, relu), launch.box)


def test_kernel_spec_describes_channels_last_tensors():
    g = geo(2, 64, 32, (10, 12), 3, stride=2, pad=1, bias=True)
    spec = conv_kernel(g, F16, kernel="split_k", block_M=64, block_N=32, block_K=64, num_stages=2, threads=128,
                       splits=3)
    # The row counts (the batch's) come at launch: one build serves every batch size.
    assert dict(spec.params) == {"input": ("rows_in", 64), "weight": (32, 9 * 64), "bias": (32,),
                                 "output": ("rows", 32), "workspace": (3, "rows", 32)}
    assert spec.derived({"rows_in": 5 * 120}) == {"batch": 5, "rows": 5 * math.prod(g.out_size)}
    assert spec.outputs == {"output": F16, "workspace": F32}
    assert spec.returns == (("output", ("batch", *g.out_size, 32)),)
    fp8 = conv_kernel(BY_ID["fp8-3x3"][0], FP8)
    assert [name for name, _ in fp8.params] == ["input", "weight", "x_scale", "w_scale", "output"]
    assert fp8.outputs == {"output": BF16}


def test_a_channels_first_output_is_declared_and_returned_nchw():
    g = geo(2, 64, 32, (10, 12), 3, stride=2, pad=1, bias=True)
    positions = math.prod(g.out_size)
    spec = conv_kernel(g, F16, kernel="split_k", block_M=64, block_N=32, block_K=64, num_stages=2, threads=128,
                       splits=3, output_layout=CHANNELS_FIRST)
    # the batch comes at launch, the rows (the split-K workspace's) are batch x positions
    assert dict(spec.params) == {"input": ("rows_in", 64), "weight": (32, 9 * 64), "bias": (32,),
                                 "output": ("batch", 32, positions), "workspace": (3, "rows", 32)}
    assert spec.derived({"rows_in": 5 * 120}) == {"batch": 5, "rows": 5 * positions}
    assert spec.returns == (("output", ("batch", 32, *g.out_size)),)
    assert spec.config["output_layout"] == CHANNELS_FIRST


def test_unsupported_dtypes_and_sizes_are_named():
    assert "float64" in unsupported(geo(1, 4, 4, (5, 5), 3), torch.float64)
    assert "2^31" in unsupported(geo(1, 1024, 8, (2048, 2048), 1), F16)
    assert unsupported(geo(1, 4, 4, (5, 5), 3), F16) is None


# -- compiles for sm_90a (no GPU needed) ----------------------------------------------------------

COMPILED = [
    ("3x3-bias-f16", {}),
    ("pointwise-stride2", {}),
    ("strided-dilated-relu", {"kernel": "gemm", "block_M": 64, "block_N": 128, "block_K": 64, "num_stages": 3,
                              "threads": 256}),
    ("grouped-gemm", {}),
    ("conv1d-causal-cin80", {}),
    ("conv3d-stride2", {}),
    ("split-k-tail", {}),
    ("aspp-skips-padding", {}),
    ("depthwise-bias", {}),
    ("fp8-3x3", {}),
    ("flat-cin3-stride2", {"kernel": "window", "block_M": 128, "block_N": 16, "block_K": 0, "num_stages": 0,
                           "threads": 128}),
    ("pointwise-64ch", {"kernel": "gemm", "block_M": 64, "block_N": 64, "block_K": 64, "num_stages": 2,
                           "threads": 128, "tiles": 2}),
]


@pytest.mark.parametrize("name,launch", COMPILED, ids=[c[0] for c in COMPILED])
def test_kernel_compiles_for_sm90(name, launch):
    pytest.importorskip("tilelang")
    g, dtype, relu = BY_ID[name]
    spec = conv_kernel(g, dtype, relu, **launch)
    source = compile_kernel(spec.prim_func, arch="sm_90a").get_kernel_source()
    assert "__global__" in source
    if spec.config["kernel"] == "split_k":
        assert source.count("__global__ void __launch_bounds__") == 2  # partials, then the ordered sum
        assert "atomic" not in source.lower()
    if spec.config["kernel"] == "window":  # the window in registers
        assert "half_t window[27];" in source
    elif spec.config.get("tiles", 1) > 1:  # the input tiles double-buffered by TMA under the walked tiles' products
        assert "wgmma" in source and source.count("tma_load(") == 2 and "for (int t = 0; t < 2; ++t)" in source
    elif spec.config["kernel"] != "direct":
        assert "wgmma" in source
        if spec.config["aligned"]:  # whole-vector predicated async copies for the gathered input
            assert "cp_async_gs_conditional<" in source
    assert spec.config.get("skips_padding", False) == (name == "aspp-skips-padding")


# A channels-first output (the functions', for NC[D]HW-contiguous tensors), written by the GEMM's
# epilogue, the split-K sum's and the direct kernel's: the batch, not the row count, comes at launch.
@pytest.mark.parametrize("name", ["3x3-bias-f16", "split-k-tail", "depthwise-bias"])
def test_channels_first_kernel_compiles_for_sm90(name):
    pytest.importorskip("tilelang")
    g, dtype, relu = BY_ID[name]
    spec = conv_kernel(g, dtype, relu, output_layout=CHANNELS_FIRST)
    source = compile_kernel(spec.prim_func, arch="sm_90a").get_kernel_source()
    assert "int batch" in source and "int rows," not in source
    if spec.config["kernel"] == "split_k":
        assert source.count("__global__ void __launch_bounds__") == 2 and "atomic" not in source.lower()


# -- the index arithmetic, run on TileLang's CPU target ----------------------------------------------

# The direct kernel gathers through the same window arithmetic as the GEMM's input tile
# (conv_kernel._source: position decode, stride, padding before/after, dilation, groups), and it
# builds for the CPU target (the GEMM's T.gemm does not): fp32, channels shrunk, same windows.
CPU_CASES = ["strided-dilated-relu", "asymmetric-pad", "depthwise-multiplier-stride", "conv1d-causal-cin1",
             "conv3d-dilated", "grouped-thin-direct"]


@LAYOUTS
@pytest.mark.parametrize("name", CPU_CASES)
def test_window_arithmetic_matches_torch_on_the_cpu_target(name, output_layout):
    pytest.importorskip("tilelang")
    import dataclasses

    from npuops_conv.conv_kernel import direct_launch

    g, _, _ = BY_ID[name]
    per_group_in = 1 if g.groups == g.in_channels else min(g.in_channels // g.groups, 4)
    per_group_out = min(g.out_channels // g.groups, 3)
    groups = min(g.groups, 4)
    g = dataclasses.replace(g, in_channels=per_group_in * groups, out_channels=per_group_out * groups, groups=groups)
    # no ReLU: the CPU target cannot vectorize its max
    assert_matches_torch_on_the_cpu_target(g, direct_launch(Problem(g, F32)).as_dict(), output_layout, seed=3,
                                           batches=(g.batch, g.batch + 2))


def assert_matches_torch_on_the_cpu_target(g: ConvGeometry, launch: dict, output_layout: str, seed: int,
                                           batches: tuple[int, ...], portable: bool = False) -> None:
    """The fp32 kernel of ``launch`` for ``g`` (no ReLU), built once for TileLang's CPU target, against
    torch at each of ``batches`` (the batch comes at launch), outputs pre-filled with NaN."""
    import dataclasses

    from npuops.kernels import CPU_TARGET

    spec = conv_kernel(g, F32, False, portable=portable, output_layout=output_layout, **launch)
    kernel = spec.bind(compile_kernel(spec.prim_func, target=CPU_TARGET), torch.device("cpu"))
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(g.out_channels, *g.kernel, g.in_channels // g.groups, generator=gen)
    bias = torch.randn(g.out_channels, generator=gen) if g.bias else None
    for batch in batches:
        x = torch.randn(batch, *g.in_size, g.in_channels, generator=gen)
        with nan_filled_allocations():  # outputs (and a split-K workspace) start as NaN
            got = kernel(input=x, weight=w, **({"bias": bias} if g.bias else {}))
        expected = reference(dataclasses.replace(g, batch=batch), x, w, bias, False)
        torch.testing.assert_close(got, laid_out(expected, output_layout), atol=1e-4, rtol=1e-4, check_stride=True)



# The window kernel (a small K on CUDA cores, a thread a position): the same window arithmetic,
# the window read into a thread's registers, fp32 on the CPU target.
WINDOW_CASES = ["flat-cin3-stride2", "asymmetric-pad", "conv1d-causal-cin1", "conv1d-stride5", "conv3d-stride2"]


@LAYOUTS
@pytest.mark.parametrize("name", WINDOW_CASES)
def test_window_kernel_matches_torch_on_the_cpu_target(name, output_layout):
    pytest.importorskip("tilelang")
    import dataclasses

    from npuops_conv.conv_kernel import window_fits, window_launch

    g, _, _ = BY_ID[name]
    taps = math.prod(g.kernel)  # f32: as many channels as keep the window within 64 elements
    g = dataclasses.replace(g, in_channels=max(1, min(g.in_channels, 3, 64 // taps)), out_channels=min(g.out_channels, 12))
    p = Problem(g, F32)
    assert window_fits(p)
    launch = dataclasses.replace(window_launch(p, 8), block_M=16, threads=16).as_dict()  # partial channel tiles
    assert_matches_torch_on_the_cpu_target(g, launch, output_layout, seed=5, batches=(g.batch, g.batch + 1))


def test_window_kernel_is_a_variant_where_a_thread_holds_the_window():
    """Offered (not the default) for ungrouped, non-fp8 convolutions whose K fits 256 bytes a
    thread: a stem's 27, a 1-d conv over one channel; not a 3x3 over 64 channels, groups, fp8."""
    from npuops_conv.conv_kernel import window_fits

    def offered(name):
        g, dtype, relu = BY_ID[name]
        return [v for v in launch_variants(Problem(g, dtype, relu)) if v["kernel"] == "window"]

    assert [(v["block_N"], v["threads"]) for v in offered("flat-cin3-stride2")] == [(16, 128), (8, 128)]
    assert offered("conv1d-causal-cin1") and not offered("3x3-bias-f16") and not offered("grouped-thin-direct")
    assert not window_fits(Problem(BY_ID["fp8-3x3"][0], FP8))
    assert default_launch(Problem(*BY_ID["flat-cin3-stride2"][:2])).kernel == "gemm"
    with pytest.raises(ValueError, match="window kernel"):
        conv_kernel(BY_ID["3x3-bias-f16"][0], F16, kernel="window", block_M=128, block_N=16, block_K=0,
                    num_stages=0, threads=128)

def test_blocks_walk_row_tiles_where_k_is_one_tile_and_they_still_fill_the_gpu():
    """A GEMM whose K is one tile (resnet's 1x1 over 64 channels) offers blocks that walk two row
    tiles, each tile's load under the product and store of the one before, where the walking
    blocks still number at least one an SM; deeper K or too few tiles: not offered, and refused."""
    def walked(name):
        g, dtype, relu = BY_ID[name]
        return [(v["block_M"], v["block_N"], v["tiles"]) for v in launch_variants(Problem(g, dtype, relu))
                if v.get("tiles", 1) > 1]

    assert walked("pointwise-64ch") == [(64, 64, 2)]  # 388 tiles of 64 x 64: 194 blocks
    assert walked("3x3-bias-f16") == [] and walked("flat-cin3-stride2") == []  # deep K; 16 tiles
    with pytest.raises(ValueError, match="K is one tile"):
        conv_kernel(BY_ID["3x3-bias-f16"][0], F16, kernel="gemm", block_M=64, block_N=64, block_K=64,
                    num_stages=2, threads=128, tiles=2)

# The GEMM kernels with the tile product as loops (``portable``): every other part of them (the
# input gather through the window, aligned and flat K tiles, groups, the split-K ranges and their
# fixed-order sum, the epilogue, the masked writes) runs on the CPU target, batch sizes at launch.
GEMM_CPU_CASES = [
    ("aligned-3x3-pad-bias", geo(2, 16, 24, (6, 7), 3, pad=1, bias=True),
     dict(kernel="gemm", block_M=16, block_N=16, block_K=8, num_stages=2, threads=128)),
    ("flat-cin3-stride2", geo(1, 3, 8, (9, 9), 3, stride=2, pad=1),
     dict(kernel="gemm", block_M=16, block_N=8, block_K=8, num_stages=2, threads=128)),
    ("grouped", geo(2, 8, 16, (5, 5), 3, pad=1, groups=2),
     dict(kernel="gemm", block_M=16, block_N=8, block_K=4, num_stages=2, threads=128)),
    ("split-k-tail-bias", geo(1, 16, 8, (4, 4), 3, pad=1, bias=True),
     dict(kernel="split_k", block_M=16, block_N=8, block_K=8, num_stages=1, threads=128, splits=4)),
    ("causal-1d-dilated", geo(2, 8, 8, (11,), 3, dilation=2, pad=(4,), pad_after=(0,)),
     dict(kernel="gemm", block_M=8, block_N=8, block_K=8, num_stages=1, threads=128)),
    ("3d-strided", geo(1, 8, 8, (4, 5, 6), 3, stride=2, pad=1),
     dict(kernel="gemm", block_M=16, block_N=8, block_K=8, num_stages=1, threads=128)),
    # A copied whole, rows and channels past the input's edge (12 channels, 8-wide K tiles; 35 rows)
    ("pointwise-copied-a-bias", geo(1, 12, 8, (5, 7), 1, bias=True),
     dict(kernel="gemm", block_M=16, block_N=8, block_K=8, num_stages=2, threads=128)),
    # Blocks walking row tiles (K one tile), the last tile partial or past the rows altogether
    ("walked-copied-a", geo(2, 12, 8, (5, 7), 1, bias=True),
     dict(kernel="gemm", block_M=16, block_N=8, block_K=16, num_stages=2, threads=128, tiles=3)),
    ("walked-flat-cin3", geo(1, 3, 8, (9, 9), 3, stride=2, pad=1),
     dict(kernel="gemm", block_M=16, block_N=8, block_K=32, num_stages=2, threads=128, tiles=2)),
    # Row tiles that skip the taps whose windows lie in the padding (the counts and first taps per
    # dim at run time, tiles across images taking every tap); two K tiles a tap
    ("skips-padding-2d", geo(1, 16, 8, (8, 8), 3, pad=4, dilation=4),
     dict(kernel="gemm", block_M=16, block_N=8, block_K=8, num_stages=2, threads=128)),
    ("skips-padding-3d", geo(1, 8, 8, (3, 4, 4), 3, pad=2, dilation=2),
     dict(kernel="gemm", block_M=8, block_N=8, block_K=8, num_stages=2, threads=128)),
    # ... where a tile's every window lies in the padding at every tap (no K tile: zeros)
    ("skips-padding-empty-windows", geo(1, 8, 8, (3, 6), 2, pad=3, dilation=5, bias=True),
     dict(kernel="gemm", block_M=8, block_N=8, block_K=8, num_stages=1, threads=128)),
    # ... each split its share of the tile's live K tiles
    ("skips-padding-split-k", geo(1, 16, 8, (6, 6), 3, pad=3, dilation=3, bias=True),
     dict(kernel="split_k", block_M=8, block_N=8, block_K=8, num_stages=1, threads=128, splits=3)),
    # The halo kernel: boxes of output positions (partial at the map's edges, across batches), their
    # input loaded once, K steps of one tap or of a row of taps, column tiles past C_out
    ("halo-2d-pad-bias", geo(2, 8, 12, (6, 7), 3, pad=1, bias=True),
     dict(kernel="halo", block_M=8, block_N=8, block_K=8, num_stages=2, threads=128, box_h=2, box_w=4)),
    ("halo-2d-strided-dilated-asymmetric", geo(1, 8, 8, (11, 10), 3, stride=2, pad=(2, 1), pad_after=(1, 2),
                                                dilation=2),
     dict(kernel="halo", block_M=8, block_N=8, block_K=24, num_stages=2, threads=128, box_h=4, box_w=2)),
    ("halo-3d", geo(1, 8, 8, (4, 5, 6), 3, pad=1),
     dict(kernel="halo", block_M=8, block_N=8, block_K=24, num_stages=2, threads=128, box_h=2, box_w=2)),
    ("halo-1d-causal-dilated", geo(2, 8, 8, (19,), 3, dilation=2, pad=(4,), pad_after=(0,), bias=True),
     dict(kernel="halo", block_M=8, block_N=8, block_K=8, num_stages=1, threads=128, box_h=1, box_w=8)),
]


@LAYOUTS
@pytest.mark.parametrize("name,g,launch", GEMM_CPU_CASES, ids=[c[0] for c in GEMM_CPU_CASES])
def test_gemm_logic_matches_torch_on_the_cpu_target(name, g, launch, output_layout):
    pytest.importorskip("tilelang")
    assert_matches_torch_on_the_cpu_target(g, launch, output_layout, seed=1, batches=(g.batch, g.batch + 1),
                                           portable=True)


def test_row_tiles_skip_the_taps_whose_windows_lie_in_the_padding():
    """Where whole row tiles read only padding at some taps (a large dilation on a small map), the
    GEMM walks only the K tiles of the others: the ASPP rows' 4-row tiles a quarter fewer (one of
    three kernel rows dead in half of them), the 3-d ASPP's more than half; a 3x3 with padding 1
    on a large map, a 1x1, none (its kernel as before)."""
    pytest.importorskip("tilelang")
    from npuops_conv.conv_kernel import LIVE_TAPS_AT_MOST, live_tap_share

    aspp = Problem(geo(1, 2048, 256, (32, 32), 3, pad=12, dilation=12), F16)
    assert live_tap_share(aspp, 128) == 0.75 and live_tap_share(aspp, 64) == 0.75
    assert live_tap_share(Problem(geo(1, 256, 256, (8, 16, 16), 3, pad=6, dilation=6), F16), 64) < 0.45
    assert live_tap_share(Problem(geo(1, 64, 64, (56, 56), 3, pad=1), F16), 128) == 1.0
    assert live_tap_share(Problem(BY_ID["pointwise-64ch"][0], F16), 64) == 1.0
    for name, g, launch in GEMM_CPU_CASES:
        if launch["kernel"] == "halo":  # reads every tap's input from its box's halo, none from memory
            continue
        skips = conv_kernel(g, F32, portable=True, **launch).config.get("skips_padding", False)
        assert skips == (live_tap_share(Problem(g, F32), launch["block_M"]) <= LIVE_TAPS_AT_MOST), name
        assert skips or not name.startswith("skips-padding"), name
    assert "skips_padding" not in conv_kernel(BY_ID["3x3-bias-f16"][0], F16).config


@pytest.mark.parametrize("itemsize", [2, 4])
@pytest.mark.parametrize("columns", [32, 64, 128, 256])
def test_staged_rows_take_the_fewest_bank_passes(itemsize, columns):
    """A warp's write of its wgmma accumulator fragment into the row-major staging tile (8 rows,
    4 threads a row, 2 consecutive elements a thread) touches no bank at more words than the
    write's size forces: 1 for 16-bit outputs, 2 for fp32 partials (4 to 8 without the padding)."""
    from npuops_conv.conv_kernel import staging_columns

    def passes(row_bytes):
        words = {(row * row_bytes + quad * 2 * itemsize) // 4 + w
                 for row in range(8) for quad in range(4) for w in range(2 * itemsize // 4)}
        return max(sum(1 for word in words if word % 32 == bank) for bank in range(32))

    assert passes(staging_columns(columns) * itemsize) == 2 * itemsize // 4
    assert passes(columns * itemsize) >= 4


def laid_out(channels_last: torch.Tensor, output_layout: str) -> torch.Tensor:
    """A result [N, *spatial, C] as a kernel of ``output_layout`` returns it, contiguous:
    [N, *spatial, C] or [N, C, *spatial]."""
    return (channels_last if output_layout == CHANNELS_LAST else channels_last.movedim(-1, 1)).contiguous()

# -- on the GPU ------------------------------------------------------------------------------------

TOLERANCE = {F16: 4e-3, BF16: 2e-2, F32: 2e-3, FP8: 2e-2}  # fp8: the bf16 output's rounding


def reference(g: ConvGeometry, x, w, bias, relu, x_scale=None, w_scale=None):
    """The fp32 torch convolution of channels-last ``x`` [N, *in, C_in] and ``w``
    [C_out, *kernel, Cg], returned channels-last."""
    rank = len(g.in_size)
    x32 = x.float().movedim(-1, 1)
    w32 = w.float().movedim(-1, 1)
    if x_scale is not None:
        x32, w32 = x32 * x_scale, w32 * w_scale
    pads = [p for before, after in zip(reversed(g.pad_before), reversed(g.pad_after), strict=True) for p in (before, after)]
    conv = (F.conv1d, F.conv2d, F.conv3d)[rank - 1]
    y = conv(F.pad(x32, pads), w32, None if bias is None else bias.float(), g.stride, 0, g.dilation, g.groups)
    if relu:
        y = F.relu(y)
    return y.movedim(1, -1)


def run_and_check(g: ConvGeometry, dtype, relu, launch: dict, seed: int = 0, output_layout: str = CHANNELS_LAST):
    from npuops.kernels import launcher

    device = torch.device("cuda")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    spec = conv_kernel(g, dtype, relu, output_layout=output_layout, **launch)
    kernel = compile_kernel(spec.prim_func)
    raw = torch.float16 if dtype == FP8 else dtype
    x = torch.randn(g.batch, *g.in_size, g.in_channels, device=device, generator=gen).to(raw)
    w = (torch.randn(g.out_channels, *g.kernel, g.in_channels // g.groups, device=device, generator=gen)
         / math.sqrt(g.fan_in)).to(raw)
    tensors = {"input": x, "weight": w}
    scales = (None, None)
    if dtype == FP8:
        x, w = x.to(FP8), (w * math.sqrt(g.fan_in)).to(FP8)
        scales = (torch.tensor(1.3, device=device), torch.tensor(0.7 / math.sqrt(g.fan_in), device=device))
        tensors = {"input": x, "weight": w, "x_scale": scales[0], "w_scale": scales[1]}
    bias = None
    if g.bias and dtype != FP8:
        bias = (0.1 * torch.randn(g.out_channels, device=device, generator=gen)).to(dtype)
        tensors["bias"] = bias
    out_dtype = spec.outputs["output"]
    out_shape = (g.batch, *g.out_size, g.out_channels) if output_layout == CHANNELS_LAST else (
        g.batch, g.out_channels, *g.out_size)
    tensors["output"] = torch.full(out_shape, float("nan"), device=device, dtype=out_dtype)
    sizes = spec.derived({"rows_in": g.batch * math.prod(g.in_size)})
    if "workspace" in spec.outputs:
        splits = dict(spec.params)["workspace"][0]
        tensors["workspace"] = torch.full((splits, sizes["rows"], g.out_channels), float("nan"), device=device)
    args = [tensors[name] for name, _ in spec.params]
    launch_fn = launcher(kernel, device, [shape for _, shape in spec.params])
    launch_fn.run(args, launch_fn.sizes({"rows_in": g.batch * math.prod(g.in_size), **sizes}))
    torch.cuda.synchronize()
    out = tensors["output"]
    ref = laid_out(reference(g, x, w, bias, relu, *scales), output_layout)
    assert not out.isnan().any(), f"{spec.config}: {int(out.isnan().sum())} outputs unwritten or NaN"
    err = (out.float() - ref).abs()
    allowed = TOLERANCE[dtype] * (ref.square().mean().sqrt() + ref.abs())
    assert (err <= allowed).all(), f"{spec.config}: max error {err.max().item():.3g}, rms(ref) {ref.square().mean().sqrt():.3g}"
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(BY_ID))
def test_default_kernel_matches_torch(name):
    g, dtype, relu = BY_ID[name]
    run_and_check(g, dtype, relu, {})


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("name", ["3x3-bias-f16", "3x3-bf16-partial-tiles", "split-k-deep", "depthwise-bias",
                                  "grouped-thin-direct", "conv1d-causal-cin80", "fp8-3x3", "flat-cin3-stride2",
                                  "pointwise-64ch", "aspp-skips-padding"])
def test_every_launch_variant_matches_torch(name):
    g, dtype, relu = BY_ID[name]
    for config in launch_variants(Problem(g, dtype, relu)):
        run_and_check(g, dtype, relu, config, seed=1)


@pytest.mark.gpu
@LAYOUTS
@pytest.mark.parametrize("name", ["3x3-bias-f16", "3x3-bf16-partial-tiles", "strided-dilated-relu", "conv3d-dilated",
                                  "f32-gemm-tf32"])
def test_halo_kernel_matches_torch(name, output_layout):
    """Every halo launch of a geometry (boxes partial at the map's edges, strides, dilations, 3-d,
    TF32) in both output layouts."""
    g, dtype, relu = BY_ID[name]
    launches = halo_launches(Problem(g, dtype, relu))
    assert launches, name
    for launch in launches:
        run_and_check(g, dtype, relu, launch.as_dict(), seed=2, output_layout=output_layout)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(BY_ID))
def test_channels_first_output_matches_torch(name):
    g, dtype, relu = BY_ID[name]
    run_and_check(g, dtype, relu, {}, output_layout=CHANNELS_FIRST)


@pytest.mark.gpu
def test_split_k_is_deterministic():
    g, dtype, relu = BY_ID["split-k-deep"]
    first = run_and_check(g, dtype, relu, {}, seed=2)
    second = run_and_check(g, dtype, relu, {}, seed=2)
    assert torch.equal(first, second)


HELD_OUT = Path(__file__).parents[3] / "benchmarks" / "held-out-conv.toml"


def held_out():
    """The held-out forward convolutions (odd channels and sizes, batch 1, f32) as the registry
    resolves a user's ``--workloads`` file: (op, workload) pairs."""
    from npuops import load_registry, load_workload_file

    registry = load_registry()
    registry.add_workloads(load_workload_file(HELD_OUT))
    return [(op, w) for op in registry.ops.values() if op.family == "conv" for w in op.workloads if w.id.startswith("H")]


def test_held_out_workloads_take_our_kernel_or_say_why():
    pairs = held_out()
    assert len(pairs) == 12
    for op, w in pairs:
        reason = op.kernel_unsupported(w)
        if reason is not None:
            assert isinstance(reason, str) and reason, (op.name, w.id)
            continue
        spec = conv_kernel(op.geometry(w), w.dtype_of("input"), op.name == "Conv2dBiasRelu")
        assert spec.prim_func is not None and spec.config["kernel"] in ("gemm", "split_k", "direct"), (op.name, w.id)


@pytest.mark.gpu
def test_held_out_workloads_match_torch():
    for op, w in held_out():
        if op.kernel_unsupported(w) is None:
            run_and_check(op.geometry(w), w.dtype_of("input"), op.name == "Conv2dBiasRelu", {})


@pytest.mark.gpu
def test_every_catalog_forward_workload_matches_torch():
    """The default kernel of every forward workload of the catalog (channels-last inputs)."""
    from npuops_conv.plugin import npuops_ops

    forward = {"Conv2dFwd", "PointwiseConv2d", "DepthwiseConv2d", "GroupedConv2d", "DilatedConv2d", "Conv2dBiasRelu",
               "Conv1dFwd", "Conv1dCausal", "Conv3dFwd", "Conv2dFp8Fwd"}
    for op in npuops_ops():
        if op.name in forward:
            for w in op.workloads:
                run_and_check(op.geometry(w), w.dtype_of("input"), op.name == "Conv2dBiasRelu", {})


def test_one_build_serves_every_batch_size_of_a_geometry():
    from npuops_conv.conv_kernel import kernel_key

    small, large = (kernel_key(geo(n, 64, 64, (14, 14), 3, pad=1), F16) for n in (1, 256))
    assert small.shared == large.shared  # the same code: either computes the other's batch
    assert small.launch != large.launch  # tiles chosen for each batch's number of output tiles
    assert kernel_key(geo(1, 64, 64, (14, 14), 3, pad=1), BF16).shared != small.shared
    assert kernel_key(geo(1, 64, 64, (14, 14), 3, pad=1), F16, output_layout=CHANNELS_FIRST).shared != small.shared
