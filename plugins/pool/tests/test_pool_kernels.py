"""Our TileLang pooling kernels: compile for sm_90 anywhere (CPU CI); on a GPU (marker ``gpu``)
every catalog workload and the edge cases pass the correctness gate, and NaN propagates."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch

from npuops.check import check
from npuops.devices import CPUDevice
from npuops.kernels import compile_kernel
from npuops.registry import load_registry

pytest.importorskip("tilelang")

from test_pool import AVG_CASES, MAX_CASES, make_workload  # noqa: E402  (the reference tests' cases)

REGISTRY = load_registry(strict=True)
POOL_OPS = sorted(name for name, op in REGISTRY.ops.items() if op.family == "pool")
EDGE_CASES = AVG_CASES + MAX_CASES + [
    ("MaxPool1dFwd", (1, 2, 3), dict(kernel_size=5, stride=1, padding=2)),  # window wider than the input
    ("AvgPool1dFwd", (1, 2, 3), dict(kernel_size=5, stride=1, padding=2)),
    ("AvgPool2dFwd", (1, 3, 6, 6), dict(kernel_size=6)),  # output size 1
    ("AvgPool2dFwd", (1, 2, 5, 5), dict(kernel_size=2, stride=2, padding=1, ceil_mode=True)),  # last window in padding
    ("AdaptiveAvgPool2dFwd", (1, 3, 5, 7), dict(output_size=[3, 4])),
    ("AdaptiveMaxPool2dFwd", (2, 2, 9, 4), dict(output_size=[4, 4])),
    # Whole-input windows (global pooling), planes spilling past one block of the staged kernel:
    ("AdaptiveAvgPool2dFwd", (3, 50, 7, 7), dict(output_size=[1, 1])),
    ("MaxPool1dFwd", (2, 70, 33), dict(kernel_size=33)),
    ("AvgPool3dFwd", (1, 130, 2, 3, 3), dict(kernel_size=[2, 3, 3], divisor_override=5)),
]

# Marching vectors variants: several output depths a thread, the last group partial, ceil-mode
# windows past the input, padding counted or not, windows past the input in height too.
MARCHING_CASES = [
    ("MaxPool3dFwd", (1, 2, 11, 6, 16), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    ("AvgPool3dFwd", (1, 2, 11, 5, 8), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)),
    ("AvgPool3dFwd", (1, 2, 13, 19, 8), dict(kernel_size=[5, 5, 3], stride=[1, 2, 2], padding=[2, 2, 1], ceil_mode=True)),
]


def test_every_pool_op_has_a_kernel():
    assert len(POOL_OPS) == 8
    assert all(any(i.name == "tilelang" for i in REGISTRY.impls_for(name)) for name in POOL_OPS)


@pytest.mark.parametrize("op_name", POOL_OPS)
def test_every_launch_variant_compiles_for_sm90(op_name):
    from npuops_pool.pool_kernel import pool_kernel

    op = REGISTRY.op(op_name)
    w = op.workloads[0]
    for config in op.tilelang_variants(w):
        spec = pool_kernel(op.pooling(w), w.shapes["input"], w.dtype_of("input"), **config)
        source = compile_kernel(spec.prim_func, arch="sm_90a", pass_configs=spec.pass_configs).get_kernel_source()
        assert "__global__" in source, config
        assert returned_shape(spec, w.shapes["input"]) == op.outputs(w)[0][0]  # the kernel's output is the op's
        assert {k: spec.config[k] for k in config} == config  # the config records the launch


def returned_shape(spec, input_shape):
    """The shape ``spec``'s kernel returns for an input of ``input_shape``, sizes given at launch bound."""
    from npuops.kernels import bind_sizes, resolved

    shape = spec.returns[0][1]
    if shape[:1] != (...,):
        return tuple(shape)
    sizes = {}
    bind_sizes("input", tuple(input_shape), dict(spec.params)["input"], sizes)
    sizes.update(spec.derived(sizes) if spec.derived else {})
    return (*input_shape[:2], *resolved(shape[1:], sizes))


@pytest.mark.parametrize("kernel", ["rows", "window", "sizes_at_launch"])
def test_half_taps_are_converted_to_float_once(kernel):
    """CUDA's half-to-float conversion is inline asm the compiler does not merge: a NaN-propagating
    max that named a tap three times converted it three times (f16 40% slower than bf16). An
    average converts each tap once; a max of half taps converts none (max.NaN.f16 in their type)."""
    from npuops_pool.pool_kernel import pool_kernel

    for op_name, conversions in (("AvgPool2dFwd", 1), ("MaxPool2dFwd", 0)):
        op = REGISTRY.op(op_name)
        w = make_workload(op_name, (2, 8, 112, 112), "f16", kernel_size=3, stride=2, padding=1)
        spec = pool_kernel(op.pooling(w), w.shapes["input"], torch.float16, kernel=kernel)
        source = compile_kernel(spec.prim_func, arch="sm_90", pass_configs=spec.pass_configs).get_kernel_source()
        # A tap's conversion (not a window's count: an int the sizes-at-launch kernel counts at run time).
        assert len(re.findall(r"\(\(float\)(X|staged|taps)\[", source)) == conversions, (op_name, source)


def cpu_kernel(op, w, config=None):
    """Our pooling kernel built for TileLang's CPU target: the same code, checkable without a GPU."""
    from npuops.kernels import CPU_TARGET
    from npuops_pool.pool_kernel import pool_kernel

    spec = pool_kernel(op.pooling(w), w.shapes["input"], w.dtype_of("input"), **(config or {}))
    return spec.bind(compile_kernel(spec.prim_func, pass_configs=spec.pass_configs, target=CPU_TARGET), torch.device("cpu"))


def shrunk(w):
    """A catalog workload with N=1, C=2 (same spatial geometry), small enough for the CPU."""
    shape = [1, 2, *w.shapes["input"][2:]]
    return dataclasses.replace(w, shapes={"input": shape}, params={**w.params, "N": 1, "C": 2})


CATALOG = [(name, w.id) for name in POOL_OPS for w in REGISTRY.op(name).workloads]


@pytest.mark.parametrize("op_name,workload_id", CATALOG)
def test_kernel_logic_matches_the_reference_on_the_cpu_target(op_name, workload_id):
    op = REGISTRY.op(op_name)
    w = dataclasses.replace(shrunk(op.workload(workload_id)), dtype="f32")
    result = check(op, w, cpu_kernel(op, w), CPUDevice(), seed=6)
    assert result.ok, result.detail


NAN_CASES = [("MaxPool2dFwd", dict(kernel_size=3, stride=2, padding=1)), ("AdaptiveMaxPool2dFwd", dict(output_size=[3, 3])),
             ("AdaptiveMaxPool2dFwd", dict(output_size=[1, 1])), ("MaxPool2dFwd", dict(kernel_size=9))]


def test_each_window_kind_takes_its_kernel():
    from npuops_pool.pool_kernel import pool_kernel, shape_variants

    def kernel_of(op_name, shape, **params):
        op = REGISTRY.op(op_name)
        w = make_workload(op_name, shape, "f32", **params)
        return pool_kernel(op.pooling(w), w.shapes["input"], torch.float32).config

    # Whole-input windows: staged planes where their blocks fill the SMs, else lanes of elements.
    for op_name, params in NAN_CASES[2:]:
        assert kernel_of(op_name, (64, 512, 9, 9), **params)["kernel"] == "planes"
        assert kernel_of(op_name, (1, 512, 9, 9), **params)["kernel"] == "lanes"
    # Planes too large to stage in shared memory take the window kernel, as adaptive windows do:
    # a thread per output, or where those leave most SMs idle, lanes of one (the split kernel).
    assert kernel_of("AdaptiveAvgPool2dFwd", (64, 512, 56, 56), output_size=[1, 1])["kernel"] == "window"
    adaptive = kernel_of("AdaptiveMaxPool2dFwd", (8, 512, 56, 56), output_size=[7, 7])
    assert adaptive["kernel"] == "window" and adaptive["predicated"]  # windows of varying length: masked loads
    assert kernel_of("AdaptiveAvgPool2dFwd", (1, 2, 56, 56), output_size=[1, 1])["kernel"] == "split"
    assert kernel_of("AdaptiveMaxPool2dFwd", (1, 2, 56, 56), output_size=[7, 7])["kernel"] == "split"
    # Other sliding windows take the sizes-at-launch kernel (one build for many sizes); of the
    # kernels built per shape, the vectors kernel first; after it, 1-d and non-overlapping windows
    # the rows kernel, overlapping 2-d/3-d ones a thread per output, with the rows kernel as
    # variants: its tiles hold whole short output rows, and long ones split into tiles of whole
    # 16-byte vectors.
    def shape_kernels(op_name, shape, **params):
        op = REGISTRY.op(op_name)
        return [v["kernel"] for v in shape_variants(op.pooling(make_workload(op_name, shape, "f32", **params)), torch.float32)]

    stem_shape, stem_params = (1, 2, 112, 112), dict(kernel_size=3, stride=2, padding=1)
    assert kernel_of("MaxPool2dFwd", stem_shape, **stem_params)["kernel"] == "sizes_at_launch"
    assert shape_kernels("MaxPool2dFwd", stem_shape, **stem_params)[:2] == ["vectors", "window"]
    assert shape_kernels("MaxPool2dFwd", stem_shape, kernel_size=2, stride=2)[1] == "rows"
    assert shape_kernels("MaxPool3dFwd", (1, 2, 8, 16, 16), kernel_size=[1, 2, 2], stride=[1, 2, 2])[1] == "rows"
    assert shape_kernels("AdaptiveMaxPool2dFwd", (1, 2, 56, 56), output_size=[7, 7])[0] == "window"  # planes unknown
    op = REGISTRY.op("MaxPool2dFwd")
    w = make_workload("MaxPool2dFwd", stem_shape, "f32", **stem_params)
    tile = next(v for v in op.tilelang_variants(w) if v["kernel"] == "rows")
    stem = pool_kernel(op.pooling(w), w.shapes["input"], torch.float32, **tile).config
    assert (stem["cols"], stem["rows"], stem["vector"]) == (56, 14, 4)
    op = REGISTRY.op("AvgPool1dFwd")
    w = make_workload("AvgPool1dFwd", (1, 2, 32000), "f32", kernel_size=5, stride=4, padding=2)
    tile = next(v for v in op.tilelang_variants(w) if v["kernel"] == "rows")
    long = pool_kernel(op.pooling(w), w.shapes["input"], torch.float32, **tile).config
    assert (long["rows"], long["cols"], long["vector"]) == (1, 1000, 4)


def test_strips_are_offered_for_windows_that_tile_the_input_only():
    from npuops_pool.pool_kernel import strip_width

    def width(shape, dtype="bf16", **params):
        op = REGISTRY.op("MaxPool2dFwd")
        w = make_workload("MaxPool2dFwd", shape, dtype, **params)
        return strip_width(op.pooling(w), w.dtype_of("input"))

    assert width((1, 2, 56, 56), kernel_size=2, stride=2) == 4  # 2 x 4 bf16 taps: one 16-byte vector
    assert width((1, 2, 56, 56), "f32", kernel_size=2, stride=2) == 2
    assert width((1, 2, 56, 56), kernel_size=3, stride=2) is None  # overlapping
    assert width((1, 2, 56, 56), kernel_size=2, stride=2, padding=1) is None
    assert width((1, 2, 55, 55), kernel_size=2, stride=2, ceil_mode=True) is None  # a window past the input
    assert width((1, 2, 56, 52), kernel_size=2, stride=2) is None  # 26 outputs: no whole strips of 4


# Tiles smaller than the output, in bands and column tiles the last of which is partial.
SMALL_TILES = [{"kernel": "rows", "threads": 32, "rows": 2, "cols": 3}, {"kernel": "rows", "threads": 64, "rows": 1, "cols": 4}]


@pytest.mark.parametrize("op_name,shape,params", [
    *EDGE_CASES,
    ("MaxPool2dFwd", (1, 3, 9, 9), dict(kernel_size=3, stride=2, padding=1)),
    ("MaxPool2dFwd", (1, 2, 6, 40), dict(kernel_size=3, stride=2, padding=1, dilation=[1, 2])),  # vectors of 4
    # Dilated rows: a tap above the input is not the window's edge tap, so it must stay masked.
    ("MaxPool2dFwd", (1, 2, 7, 40), dict(kernel_size=3, stride=2, padding=1, dilation=[2, 1])),
    ("AvgPool1dFwd", (1, 2, 64), dict(kernel_size=5, stride=4, padding=2)),
    ("AdaptiveAvgPool2dFwd", (2, 70, 7, 7), dict(output_size=[1, 1])),
    # Global pooling over planes of whole vectors (lanes variants), the last block partial.
    ("MaxPool1dFwd", (2, 70, 64), dict(kernel_size=64)),
    ("AdaptiveAvgPool2dFwd", (1, 37, 8, 8), dict(output_size=[1, 1])),
    # ... and of single elements (lanes variants), the planes' last elements past every lane's
    ("AdaptiveAvgPool2dFwd", (1, 37, 13, 13), dict(output_size=[1, 1])),
    ("MaxPool2dFwd", (2, 9, 3, 5), dict(kernel_size=[3, 5])),
    # Few outputs of long adaptive windows (split variants lead): lanes past the longest window.
    ("AdaptiveMaxPool2dFwd", (1, 3, 11, 13), dict(output_size=[3, 4])),
    ("AdaptiveAvgPool2dFwd", (2, 3, 9, 10), dict(output_size=[2, 3])),
    # Windows that tile the input (strips variants): a last input row no window covers, 3-d.
    ("MaxPool2dFwd", (1, 3, 9, 16), dict(kernel_size=2, stride=2)),
    ("AvgPool3dFwd", (1, 2, 4, 6, 8), dict(kernel_size=2, stride=2, divisor_override=3)),
    *MARCHING_CASES,
])
def test_every_launch_variant_matches_the_reference_on_the_cpu_target(op_name, shape, params):
    from npuops.kernels import CPU_TARGET
    from npuops_pool.pool_kernel import pool_kernel

    op = REGISTRY.op(op_name)
    w = make_workload(op_name, shape, "f32", **params)
    variants = op.tilelang_variants(w)
    assert len(variants) >= 2 and len({tuple(v.items()) for v in variants}) == len(variants)
    if any(v["kernel"] == "rows" for v in variants):
        variants += SMALL_TILES
    for config in variants:
        spec = pool_kernel(op.pooling(w), w.shapes["input"], torch.float32, **config)
        fn = spec.bind(compile_kernel(spec.prim_func, pass_configs=spec.pass_configs, target=CPU_TARGET), torch.device("cpu"))
        result = check(op, w, fn, CPUDevice(), seed=3)
        assert result.ok and {k: spec.config[k] for k in config} == config, (config, result.detail)


@pytest.mark.parametrize("op_name,params", NAN_CASES)
def test_kernel_propagates_nan_on_the_cpu_target(op_name, params):
    op = REGISTRY.op(op_name)
    w = make_workload(op_name, (1, 2, 9, 9), "f32", **params)
    x = torch.randn(1, 2, 9, 9)
    x[0, 0, 4, 4] = float("nan")
    for config in op.tilelang_variants(w):
        out = cpu_kernel(op, w, config)(input=x)
        assert op.compare(out, op.reference({"input": x}, w), w).ok, config
        assert torch.isnan(out[0, 0]).any() and not torch.isnan(out[0, 1]).any(), config


@pytest.mark.parametrize("op_name,shape,params", [("MaxPool1dFwd", (2, 20, 64), dict(kernel_size=64)),
                                                  ("AdaptiveMaxPool2dFwd", (1, 20, 4, 8), dict(output_size=[1, 1])),
                                                  ("AdaptiveMaxPool2dFwd", (1, 20, 5, 7), dict(output_size=[1, 1]))])
def test_lanes_kernel_propagates_nan_from_any_lane_on_the_cpu_target(op_name, shape, params):
    """A NaN in any lane's vectors, or a plane of NaN only, comes out NaN, and no other plane does."""
    op = REGISTRY.op(op_name)
    w = make_workload(op_name, shape, "f32", **params)
    x = torch.randn(shape)
    planes = x.view(-1, math.prod(shape[2:]))
    planes[3, -3] = float("nan")  # in the last lane's vectors
    planes[5] = float("nan")
    planes[6] = -float("inf")
    config = next(v for v in op.tilelang_variants(w) if v["kernel"] == "lanes")
    out = cpu_kernel(op, w, config)(input=x)
    assert op.compare(out, op.reference({"input": x}, w), w).ok
    assert torch.isnan(out.view(-1)).nonzero().view(-1).tolist() == [3, 5]


def test_indices_take_the_torch_path_with_the_reason():
    op = REGISTRY.op("MaxPool2dFwd")
    w = make_workload("MaxPool2dFwd", (1, 2, 8, 8), kernel_size=2, return_indices=True)
    assert "values only" in op.kernel_unsupported(w)


@pytest.mark.gpu
@pytest.mark.parametrize("op_name", POOL_OPS)
def test_kernel_passes_the_gate_on_every_catalog_workload(op_name):
    device = REGISTRY.device("cuda")
    op, impl = REGISTRY.op(op_name), REGISTRY.implementation(op_name, "tilelang")
    for w in op.workloads:
        result = check(op, w, impl.build(op, w, device.torch_device()), device, seed=4)
        assert result.ok, f"{w.key}: {result.detail}"


@pytest.mark.gpu
@pytest.mark.parametrize("op_name,shape,params", EDGE_CASES)
@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_kernel_passes_the_gate_on_edge_cases(op_name, shape, params, dtype):
    device = REGISTRY.device("cuda")
    op, impl = REGISTRY.op(op_name), REGISTRY.implementation(op_name, "tilelang")
    w = make_workload(op_name, shape, dtype, **params)
    result = check(op, w, impl.build(op, w, device.torch_device()), device, seed=9)
    assert result.ok, result.detail


@pytest.mark.gpu
@pytest.mark.parametrize("op_name,params", [*NAN_CASES, ("AvgPool2dFwd", dict(kernel_size=3, stride=2, padding=1))])
def test_nan_propagates_as_in_pytorch(op_name, params):
    device = REGISTRY.device("cuda")
    op, impl = REGISTRY.op(op_name), REGISTRY.implementation(op_name, "tilelang")
    w = make_workload(op_name, (1, 2, 9, 9), "f32", **params)
    x = torch.randn(1, 2, 9, 9, device="cuda")
    x[0, 0, 4, 4] = float("nan")
    out = impl.build(op, w, device.torch_device())(input=x)
    assert op.compare(out, op.reference({"input": x}, w), w).ok
    assert torch.isnan(out[0, 0]).any() and not torch.isnan(out[0, 1]).any()


def test_marching_cases_take_marching_variants():
    for op_name, shape, params in MARCHING_CASES:
        w = make_workload(op_name, shape, "bf16", **params)
        assert any(v.get("march", 1) > 1 for v in REGISTRY.op(op_name).tilelang_variants(w)), (op_name, shape)


@pytest.mark.gpu
@pytest.mark.parametrize("op_name,shape,params", MARCHING_CASES)
def test_every_marching_variant_passes_the_gate_on_the_gpu(op_name, shape, params):
    device = REGISTRY.device("cuda")
    op, impl = REGISTRY.op(op_name), REGISTRY.implementation(op_name, "tilelang")
    w = make_workload(op_name, shape, "bf16", **params)
    for config in (v for v in op.tilelang_variants(w) if v.get("march", 1) > 1):
        result = check(op, w, impl.build(op, w, device.torch_device(), config=config), device, seed=8)
        assert result.ok, (config, result.detail)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("op_name,shape,params", [
    ("MaxPool2dFwd", (1, 2, 9, 16), dict(kernel_size=3, stride=2, padding=1)),  # window, rows, vectors
    ("MaxPool2dFwd", (1, 2, 8, 16), dict(kernel_size=2, stride=2)),  # strips
    ("MaxPool3dFwd", (1, 2, 11, 6, 16), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),  # marching
    ("MaxPool1dFwd", (2, 70, 64), dict(kernel_size=64)),  # lanes, planes
])
def test_nan_propagates_through_every_16_bit_max_variant(op_name, shape, params, dtype):
    """A max of 16-bit taps is taken in their own type (max.NaN.bf16 / .f16) by every kernel: a
    NaN reaches exactly the windows that hold it, in every launch variant."""
    device = REGISTRY.device("cuda")
    op, impl = REGISTRY.op(op_name), REGISTRY.implementation(op_name, "tilelang")
    w = make_workload(op_name, shape, dtype, **params)
    x = torch.randn(shape, device="cuda").to(w.dtype_of("input"))
    planes = x.view(-1, math.prod(shape[2:]))
    planes[0, planes.shape[1] // 2] = float("nan")
    planes[-1, -1] = float("nan")  # in the last plane's last vector
    expected = op.reference({"input": x}, w)
    for config in op.tilelang_variants(w):
        out = impl.build(op, w, device.torch_device(), config=config)(input=x)
        assert torch.equal(torch.isnan(out), torch.isnan(expected)) and torch.isnan(out).any(), config
        assert op.compare(out, expected, w).ok, config


@pytest.mark.gpu
@pytest.mark.parametrize("op_name,shape,dtype,params,kernel", [
    ("MaxPool1dFwd", (3, 70, 64), "bf16", dict(kernel_size=64), "lanes"),  # lanes of vectors
    ("AdaptiveAvgPool2dFwd", (3, 70, 13, 13), "f16", dict(output_size=[1, 1]), "lanes"),  # of elements
    ("AdaptiveMaxPool2dFwd", (2, 64, 31, 31), "bf16", dict(output_size=[4, 4]), "split"),  # lanes of windows
    ("AdaptiveAvgPool2dFwd", (2, 64, 55, 57), "f16", dict(output_size=[7, 7]), "split"),
])
def test_every_lanes_variant_passes_the_gate_on_the_gpu(op_name, shape, dtype, params, kernel):
    """Every variant of workloads whose default has lanes per plane or per window, the last block partial."""
    device = REGISTRY.device("cuda")
    op, impl = REGISTRY.op(op_name), REGISTRY.implementation(op_name, "tilelang")
    w = make_workload(op_name, shape, dtype, **params)
    variants = op.tilelang_variants(w)
    assert variants[0]["kernel"] == kernel
    for config in variants:
        result = check(op, w, impl.build(op, w, device.torch_device(), config=config), device, seed=5)
        assert result.ok, (config, result.detail)


def test_side_by_side_1d_windows_take_two_outputs_a_thread_first():
    """sincnet's 3-wide, stride-3 windows: the window kernel with two outputs a thread leads;
    overlapping 1-d windows keep the vectors and then the rows kernel first and try the paired
    kernel last."""
    from npuops_pool.pool_kernel import shape_variants

    op = REGISTRY.op("MaxPool1dFwd")

    def per_shape(w):  # the kernels built per shape (after the sizes-at-launch kernel's launches)
        return shape_variants(op.pooling(w), w.dtype_of("input"))

    side_by_side, overlapping = per_shape(op.workload("W2")), per_shape(op.workload("W1"))
    assert side_by_side[0] == {"kernel": "window", "threads": 256, "predicated": True, "outputs": 2}
    assert [v["kernel"] for v in overlapping[:2]] == ["vectors", "rows"] and overlapping[-1].get("outputs") == 2
    two_d = REGISTRY.op("MaxPool2dFwd")
    assert not any(v.get("outputs") == 2 and v["kernel"] == "window" for w in two_d.workloads
                   for v in two_d.tilelang_variants(w))
