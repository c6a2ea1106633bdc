"""Pooling ops: references against independent formulations, baselines, workloads and costs."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from npuops import InputRNG, Workload, WorkloadError
from npuops.check import check
from npuops.devices import CPUDevice
from npuops.registry import load_registry

SPATIAL = {1: ("L_in",), 2: ("H_in", "W_in"), 3: ("D_in", "H_in", "W_in")}


@pytest.fixture(scope="module")
def ops():
    registry = load_registry()
    return {name: op for name, op in registry.ops.items() if op.family == "pool"}


def make_workload(op_name, shape, dtype="f32", **params):
    dims = len(shape) - 2
    stated = dict(zip(("N", "C", *SPATIAL[dims]), shape, strict=True))
    return Workload(op=op_name, id="T", label="test", dtype=dtype, shapes={"input": list(shape)}, params={**stated, **params})


def per_dim(value, dims):
    return (value,) * dims if isinstance(value, int) else tuple(value)


# -- independent formulation: pad, unfold every spatial dim, reduce over the window dims ----------

def window_count(size, kernel, stride, padding, dilation, ceil_mode):
    """Number of windows, by enumerating window starts (o*stride - padding)."""
    span = dilation * (kernel - 1) + 1
    if not ceil_mode:
        return sum(1 for o in range(size + 2 * padding) if o * stride + span <= size + 2 * padding)
    last_full_or_partial = -(-(size + 2 * padding - span) // stride)  # ceil
    return sum(1 for o in range(last_full_or_partial + 1) if o * stride - padding < size)


def unfolded(x, kernel, stride, padding, dilation, outs, pad_value, overhang_value):
    """[N, C, *spatial] -> [N, C, *outs, *kernel]: every window's taps; taps in the padding read
    ``pad_value``, taps past the padded input (ceil mode) read ``overhang_value``."""
    dims = x.dim() - 2
    for d in range(dims):
        span = dilation[d] * (kernel[d] - 1) + 1
        size = x.shape[2 + d]
        overhang = max(0, (outs[d] - 1) * stride[d] + span - (size + 2 * padding[d]))
        pads = [0, 0] * (dims - 1 - d)
        x = F.pad(x, pads + [padding[d], padding[d]], value=pad_value)
        x = F.pad(x, pads + [0, overhang], value=overhang_value)
    for d in range(dims):
        x = x.unfold(2 + d, dilation[d] * (kernel[d] - 1) + 1, stride[d])[..., :: dilation[d]]
        x = x.narrow(2 + d, 0, outs[d])
    return x


def window_pool_by_unfold(x, kind, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                          count_include_pad=True, divisor_override=None):
    dims = x.dim() - 2
    kernel = per_dim(kernel_size, dims)
    stride = kernel if stride is None else per_dim(stride, dims)
    padding, dilation = per_dim(padding, dims), per_dim(dilation, dims)
    outs = [window_count(x.shape[2 + d], kernel[d], stride[d], padding[d], dilation[d], ceil_mode) for d in range(dims)]
    window_dims = tuple(range(-dims, 0))
    geometry = (kernel, stride, padding, dilation, outs)
    if kind == "max":
        return unfolded(x, *geometry, -math.inf, -math.inf).amax(dim=window_dims)
    sums = unfolded(x, *geometry, 0.0, 0.0).sum(dim=window_dims)
    if divisor_override is not None:
        return sums / divisor_override
    ones = torch.ones_like(x[:1, :1])
    in_padded = 1.0 if count_include_pad else 0.0
    counts = unfolded(ones, *geometry, in_padded, 0.0).sum(dim=window_dims)
    return sums / counts


def adaptive_by_loops(x, output_size, reduce):
    (H, W), (Ho, Wo) = x.shape[2:], output_size
    out = torch.empty(*x.shape[:2], Ho, Wo, dtype=x.dtype)
    for i in range(Ho):
        h0, h1 = math.floor(i * H / Ho), math.ceil((i + 1) * H / Ho)
        for j in range(Wo):
            w0, w1 = math.floor(j * W / Wo), math.ceil((j + 1) * W / Wo)
            out[:, :, i, j] = reduce(x[:, :, h0:h1, w0:w1].flatten(2), dim=-1)
    return out


def amax(t, dim):
    return t.amax(dim=dim)


def reference_of(op, w, x):
    return op.reference({"input": x}, w)


# -- references -------------------------------------------------------------------------------

AVG_CASES = [
    ("AvgPool1dFwd", (2, 3, 17), dict(kernel_size=3, stride=2, padding=1)),
    ("AvgPool1dFwd", (2, 3, 16), dict(kernel_size=4, stride=2, padding=1, ceil_mode=True, count_include_pad=False)),
    ("AvgPool1dFwd", (1, 2, 19), dict(kernel_size=5, stride=3, padding=2, ceil_mode=True)),
    ("AvgPool1dFwd", (1, 2, 13), dict(kernel_size=4)),
    ("AvgPool2dFwd", (2, 3, 11, 13), dict(kernel_size=[3, 5], stride=[2, 2], padding=[1, 2], ceil_mode=True, count_include_pad=False)),
    ("AvgPool2dFwd", (2, 3, 11, 13), dict(kernel_size=[3, 5], stride=[2, 2], padding=[1, 2], ceil_mode=True, divisor_override=16)),
    ("AvgPool2dFwd", (1, 2, 9, 10), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    ("AvgPool2dFwd", (1, 2, 12, 12), dict(kernel_size=[5, 5], stride=[2, 2], padding=[2, 2])),
    ("AvgPool3dFwd", (1, 2, 5, 9, 11), dict(kernel_size=[2, 3, 3], stride=[2, 2, 2], padding=[1, 1, 1], ceil_mode=True, count_include_pad=False)),
    ("AvgPool3dFwd", (2, 2, 6, 7, 9), dict(kernel_size=[2, 2, 3], stride=2, padding=[0, 1, 1], divisor_override=16)),
    ("AvgPool3dFwd", (1, 2, 5, 7, 7), dict(kernel_size=3, stride=[1, 2, 3], padding=1, ceil_mode=True, divisor_override=-5)),
]

MAX_CASES = [
    ("MaxPool1dFwd", (2, 3, 21), dict(kernel_size=5, stride=2, padding=2, dilation=2, ceil_mode=True)),
    ("MaxPool1dFwd", (2, 3, 20), dict(kernel_size=3, stride=3)),
    ("MaxPool1dFwd", (2, 3, 16), dict(kernel_size=16, stride=1)),
    ("MaxPool1dFwd", (1, 2, 14), dict(kernel_size=4, stride=3, padding=2, dilation=3, ceil_mode=True)),
    ("MaxPool2dFwd", (2, 3, 11, 11), dict(kernel_size=[3, 3], stride=[2, 2], ceil_mode=True)),
    ("MaxPool2dFwd", (2, 3, 12, 13), dict(kernel_size=[3, 3], stride=[2, 2], padding=[1, 1])),
    ("MaxPool2dFwd", (1, 2, 13, 12), dict(kernel_size=[3, 2], stride=[2, 1], padding=[1, 1], dilation=[2, 3], ceil_mode=True)),
    ("MaxPool3dFwd", (1, 2, 5, 9, 9), dict(kernel_size=[3, 3, 3], stride=[2, 2, 2], padding=[1, 1, 1], ceil_mode=True)),
    ("MaxPool3dFwd", (2, 2, 4, 8, 8), dict(kernel_size=[1, 2, 2], stride=[1, 2, 2])),
    ("MaxPool3dFwd", (1, 2, 7, 7, 8), dict(kernel_size=2, stride=[2, 1, 3], dilation=[1, 2, 2], padding=1, ceil_mode=True)),
]


@pytest.mark.parametrize("op_name,shape,params", AVG_CASES + MAX_CASES)
def test_window_reference_matches_unfold(ops, op_name, shape, params):
    op = ops[op_name]
    w = make_workload(op_name, shape, **params)
    op.validate(w)
    x = InputRNG("cpu", 1).normal(shape, torch.float32)
    ref = reference_of(op, w, x)
    kind = "max" if op_name.startswith("Max") else "avg"
    expected = window_pool_by_unfold(x.double(), kind, **params)
    assert ref.dtype == torch.float64
    assert ref.shape == expected.shape == op.outputs(w)[0][0]
    torch.testing.assert_close(ref, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("output_size", [(7, 7), (1, 1), (6, 6), (4, 9), (13, 12)])
@pytest.mark.parametrize("op_name,reduce", [("AdaptiveAvgPool2dFwd", torch.mean), ("AdaptiveMaxPool2dFwd", amax)])
def test_adaptive_reference_matches_loops(ops, op_name, reduce, output_size):
    op = ops[op_name]
    shape = (2, 3, 11, 9)
    w = make_workload(op_name, shape, output_size=list(output_size))
    x = InputRNG("cpu", 2).normal(shape, torch.float32)
    ref = reference_of(op, w, x)
    expected = adaptive_by_loops(x.double(), output_size, reduce)
    assert ref.shape == expected.shape == op.outputs(w)[0][0]
    torch.testing.assert_close(ref, expected, rtol=1e-12, atol=1e-12)


def test_adaptive_null_output_size_keeps_the_input_size(ops):
    w = make_workload("AdaptiveAvgPool2dFwd", (1, 2, 5, 6), output_size=[None, 3])
    assert ops["AdaptiveAvgPool2dFwd"].outputs(w)[0][0] == (1, 2, 5, 3)


@pytest.mark.parametrize("op_name,shape,params", [c for c in MAX_CASES if c[0] != "MaxPool1dFwd"][:4] + [MAX_CASES[0]])
def test_max_indices_are_the_first_maximum_in_window_order(ops, op_name, shape, params):
    op = ops[op_name]
    w = make_workload(op_name, shape, return_indices=True, **params)
    # coarse values: many ties inside each window
    x = InputRNG("cpu", 3).integers(shape, torch.float32, -3, 3)
    values, indices = reference_of(op, w, x)
    assert indices.dtype == torch.int64 and op.output_dtypes(w) == (w.dtype, "i64")
    dims = len(shape) - 2
    positions = torch.arange(math.prod(shape[2:]), dtype=torch.float64).reshape(1, 1, *shape[2:]).expand(shape)
    tap_values, tap_positions = window_pool_taps(x.double(), positions, dims, **params)
    first_max = tap_values.argmax(dim=-1, keepdim=True)
    torch.testing.assert_close(values, tap_values.amax(dim=-1), rtol=0, atol=0)
    assert torch.equal(indices, tap_positions.gather(-1, first_max).squeeze(-1).long())


def window_pool_taps(x, positions, dims, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """Each window's taps flattened: (values with -inf padding, input positions with -1 there)."""
    kernel = per_dim(kernel_size, dims)
    stride = kernel if stride is None else per_dim(stride, dims)
    padding, dilation = per_dim(padding, dims), per_dim(dilation, dims)
    outs = [window_count(x.shape[2 + d], kernel[d], stride[d], padding[d], dilation[d], ceil_mode) for d in range(dims)]
    geometry = (kernel, stride, padding, dilation, outs)
    values = unfolded(x, *geometry, -math.inf, -math.inf).flatten(-dims)
    where = unfolded(positions, *geometry, -1.0, -1.0).flatten(-dims)
    return values, where


@pytest.mark.parametrize("op_name,shape,params", [MAX_CASES[0], MAX_CASES[6], MAX_CASES[7]])
def test_max_pool_propagates_nan(ops, op_name, shape, params):
    op = ops[op_name]
    w = make_workload(op_name, shape, **params)
    x = InputRNG("cpu", 4).normal(shape, torch.float32)
    x.view(-1)[::53] = math.nan
    ref = reference_of(op, w, x)
    expected = window_pool_by_unfold(x.double(), "max", **params)
    assert torch.isnan(ref).any() and not torch.isnan(ref).all()
    assert torch.equal(torch.isnan(ref), torch.isnan(expected))
    assert op.compare(ref.float(), ref, w).ok
    assert not op.compare(torch.nan_to_num(ref.float(), nan=0.0), ref, w).ok


def test_adaptive_max_propagates_nan(ops):
    op = ops["AdaptiveMaxPool2dFwd"]
    w = make_workload("AdaptiveMaxPool2dFwd", (1, 2, 11, 9), output_size=[4, 3])
    x = InputRNG("cpu", 5).normal((1, 2, 11, 9), torch.float32)
    x[0, 0, 5, 4] = math.nan
    ref = reference_of(op, w, x)
    expected = adaptive_by_loops(x.double(), (4, 3), amax)
    assert int(torch.isnan(ref).sum()) == 2  # row 5 lies in two overlapping windows (11 -> 4)
    assert torch.equal(torch.isnan(ref), torch.isnan(expected))


# -- baselines against the reference ----------------------------------------------------------

def shrunk(w):
    """The catalog workload with N = 1, C = 2: same geometry, small enough for the CPU."""
    shape = [1, 2, *w.shapes["input"][2:]]
    return dataclasses.replace(w, shapes={"input": shape}, params={**w.params, "N": 1, "C": 2})


def catalog_cases():
    from importlib.resources import files

    from npuops import load_catalog

    catalog = load_catalog(files("npuops_pool") / "workloads.json")
    return [(name, w.id) for name, ws in sorted(catalog.items()) for w in ws]


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
@pytest.mark.parametrize("op_name,workload_id", catalog_cases())
def test_baseline_matches_reference(ops, op_name, workload_id, dtype):
    op = ops[op_name]
    w = dataclasses.replace(shrunk(op.workload(workload_id)), dtype=dtype)
    op.validate(w)
    result = check(op, w, op.torch_impl(w), CPUDevice(), seed=0)
    assert result.ok, result.detail


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
@pytest.mark.parametrize("op_name,shape,params", [
    MAX_CASES[0], MAX_CASES[6], MAX_CASES[7],
    ("AdaptiveMaxPool2dFwd", (2, 3, 11, 9), dict(output_size=[4, 3])),
])
def test_baseline_with_indices_matches_reference(ops, op_name, shape, params, dtype):
    op = ops[op_name]
    w = make_workload(op_name, shape, dtype=dtype, return_indices=True, **params)
    result = check(op, w, op.torch_impl(w), CPUDevice(), seed=0)
    assert result.ok, result.detail


def test_compare_rejects_a_wrong_max(ops):
    op = ops["MaxPool2dFwd"]
    w = make_workload("MaxPool2dFwd", (1, 2, 9, 9), dtype="bf16", kernel_size=3, stride=2)
    x = InputRNG("cpu", 6).normal((1, 2, 9, 9), torch.bfloat16)
    ref = op.reference({"input": x}, w)
    out = op.torch_impl(w)(x)
    assert op.compare(out, ref, w).ok
    out.view(-1)[3] *= 1 + 2**-7  # at least one bf16 ulp up
    assert not op.compare(out, ref, w).ok  # max pooling is exact: one ulp is wrong


# -- catalog workloads, costs, bad workloads ---------------------------------------------------

def test_every_catalog_workload_builds_on_meta(ops):
    count = 0
    for op in ops.values():
        for w in op.workloads:
            op.validate(w)
            inputs = op.make_inputs(w, InputRNG("meta"))
            assert inputs["input"].shape == torch.Size(w.shapes["input"])
            out = op.torch_impl(w)(**inputs)
            assert tuple(out.shape) == op.outputs(w)[0][0]
            cost = op.cost(w)
            assert cost.bytes > 0 and cost.flops > 0
            assert op.memory_bytes(w) > 3 * cost.bytes
            count += 1
    assert count == 30 and len(ops) == 8


@pytest.mark.parametrize("op_name,workload_id", [("AvgPool2dFwd", "W1"), ("AvgPool3dFwd", "W2")])
def test_divisor_workloads_record_the_chosen_divisor(ops, op_name, workload_id):
    op = ops[op_name]
    w = op.workload(workload_id)
    window = math.prod(w.params["kernel_size"])
    assert w.chosen == {"divisor_override": 16} and window != 16
    assert op.pool_kwargs(op.config(w))["divisor_override"] == 16


@pytest.mark.parametrize("op_name,shape,params", AVG_CASES[:5] + MAX_CASES)
def test_flops_count_the_input_elements_of_every_window(ops, op_name, shape, params):
    op = ops[op_name]
    w = make_workload(op_name, shape, **params)
    geometry = {k: v for k, v in params.items() if k not in ("count_include_pad", "divisor_override")}
    inside = window_pool_by_unfold(torch.ones(shape, dtype=torch.float64), "avg", divisor_override=1, **geometry)
    assert op.cost(w).flops == int(inside.sum())
    in_bytes = math.prod(shape) * 4
    assert op.cost(w).bytes == in_bytes + inside.numel() * 4


def test_adaptive_flops(ops):
    w = make_workload("AdaptiveAvgPool2dFwd", (2, 3, 5, 7), output_size=[3, 2])
    # H 5 -> 3: windows [0,2) [1,4) [3,5) = 7 rows; W 7 -> 2: [0,4) [3,7) = 8 columns
    assert ops["AdaptiveAvgPool2dFwd"].cost(w).flops == 2 * 3 * 7 * 8


@pytest.mark.parametrize("op_name,shape,params,field", [
    ("AvgPool2dFwd", (2, 3, 9, 9), dict(kernel_size=3, N=4), "'N'"),
    ("AvgPool2dFwd", (2, 3, 9, 9), dict(kernel_size=3, W_in=8), "'W_in'"),
    ("AvgPool2dFwd", (2, 3, 9, 9), dict(), "'kernel_size'"),
    ("AvgPool2dFwd", (2, 3, 9, 9), dict(kernel_size=[3, 3, 3]), "'kernel_size'"),
    ("AvgPool2dFwd", (2, 3, 9, 9), dict(kernel_size=3, padding=2), "'padding'"),
    ("AvgPool2dFwd", (2, 3, 9, 9), dict(kernel_size=3, stride=0), "'stride'"),
    ("AvgPool2dFwd", (2, 3, 9, 9), dict(kernel_size=3, divisor_override=0), "'divisor_override'"),
    ("AvgPool2dFwd", (2, 3, 9, 9), dict(kernel_size=3, dilation=2), "'dilation'"),
    ("AvgPool1dFwd", (2, 3, 9), dict(kernel_size=3, divisor_override=2), "'divisor_override'"),
    ("AvgPool2dFwd", (2, 3, 9, 9), dict(kernel_size=3, ceil_mode=1), "'ceil_mode'"),
    ("MaxPool1dFwd", (2, 3, 4), dict(kernel_size=3, dilation=2), "too small"),
    ("MaxPool1dFwd", (2, 3, 9), dict(kernel_size=3, return_indices="yes"), "'return_indices'"),
    ("AdaptiveMaxPool2dFwd", (2, 3, 9, 9), dict(), "'output_size'"),
    ("AdaptiveMaxPool2dFwd", (2, 3, 9, 9), dict(output_size=[0, 2]), "'output_size'"),
    ("AdaptiveAvgPool2dFwd", (2, 3, 9, 9), dict(output_size=[2, 2, 2]), "'output_size'"),
])
def test_bad_workload_names_the_field(ops, op_name, shape, params, field):
    w = make_workload(op_name, shape, **params)
    with pytest.raises(WorkloadError, match=field):
        ops[op_name].validate(w)


def test_input_rank_is_checked(ops):
    w = Workload(op="MaxPool2dFwd", id="T", label="t", dtype="f16", shapes={"input": [2, 3, 9]}, params={"kernel_size": 2})
    with pytest.raises(WorkloadError, match="'input'"):
        ops["MaxPool2dFwd"].validate(w)


def test_window_coverage_counts_what_the_windows_cover():
    """The per-tap count against the windows one by one, over sizes, kernels, strides, paddings and
    dilations (ceil-mode lengths too)."""
    from npuops_pool.ops._pooling import pooled_length, window_coverage

    for size in range(1, 14):
        for kernel in range(1, 6):
            for stride in range(1, 5):
                for padding in range(kernel // 2 + 1):
                    for dilation in (1, 2, 3):
                        for ceil_mode in (False, True):
                            out = pooled_length(size, kernel, stride, padding, dilation, ceil_mode)
                            if out < 1:
                                continue
                            taps = [o * stride - padding + t * dilation for o in range(out) for t in range(kernel)]
                            expected = sum(0 <= i < size for i in taps)
                            assert window_coverage(size, out, kernel, stride, padding, dilation) == expected


def test_adaptive_coverage_counts_what_the_windows_cover(ops):
    from npuops_pool.ops._adaptive import adaptive_window

    op = ops["AdaptiveAvgPool2dFwd"]
    for size in range(1, 30):
        for out in range(1, 30):
            w = Workload("AdaptiveAvgPool2dFwd", "t", "t", "f32", {"input": [1, 1, size, 3]}, params={"output_size": [out, 1]})
            (axis, _) = op.axes(w, op.config(w))
            assert axis.covered == sum(end - start for start, end in (adaptive_window(i, size, out) for i in range(out)))


def test_validating_a_very_long_row_costs_no_loop_over_it(ops):
    """A 10^9-long row (pooled on meta) validates and costs at once: no check walks the output."""
    import time

    for op_name, params in [("AvgPool1dFwd", {"kernel_size": 3, "stride": 1, "padding": 1}),
                            ("AdaptiveMaxPool2dFwd", {"output_size": [10**9 // 7, 1]})]:
        shape = [1, 1, 10**9] if op_name == "AvgPool1dFwd" else [1, 1, 10**9, 1]
        op = ops[op_name]
        w = Workload(op_name, "t", "t", "f32", {"input": shape}, params=params)
        start = time.perf_counter()
        op.validate(w)
        op.cost(w)
        assert time.perf_counter() - start < 1.0
