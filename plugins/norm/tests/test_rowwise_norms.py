"""The row-wise forward norms (RMS/Layer/fused-add/quant/Gemma/QK/group RMS, L1/L2 normalize, adaLN,
weight norm, spectral norm): references against independent f64 formulations, the torch
formulations against the references, and the catalog workloads."""

from importlib.resources import files

import pytest
import torch
from npuops import InputRNG, Workload, WorkloadError, discover_op_classes, load_catalog
from npuops.check import check, clone_inputs
from npuops.devices import CPUDevice

from npuops_norm.ops._quant import per_token_int8

OP_NAMES = (
    "RMSNormFwd", "LayerNormFwd", "FusedAddRMSNormFwd", "FusedAddLayerNormFwd", "RMSNormQuantFwd",
    "LayerNormQuantFwd", "GemmaRMSNormFwd", "QKNormFwd", "GroupRMSNormFwd", "L1NormFwd", "L2NormFwd",
    "AdaLayerNormFwd", "WeightNormFwd", "SpectralNormPowerIterFwd",
)
OPS = {cls.name: cls for cls in discover_op_classes("npuops_norm.ops") if cls.name in OP_NAMES}
CATALOG = load_catalog(files("npuops_norm") / "workloads.json")
FP32_EPS = float(torch.finfo(torch.float32).eps)


def small(name, shape, dtype="f32", **params):
    return Workload(op=name, id="T", label="test", dtype=dtype, shapes={"x": shape}, params=params)


def reference_case(name, shape, **params):
    """(f64 copies of the f32 inputs, the op's reference for them: computed in f64)."""
    op, w = OPS[name](), small(name, shape, **params)
    inputs = op.make_inputs(w, InputRNG("cpu", seed=3))
    return {k: v.double() for k, v in inputs.items()}, op.reference(clone_inputs(inputs), w)


def as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


def assert_f64_close(actual, expected):
    actual, expected = as_tuple(actual), as_tuple(expected)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected, strict=True):
        assert a.dtype == torch.float64
        torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-12)


# -- independent formulations (explicit sums in f64) --------------------------------------------
def rms_normalized(x, eps):
    return x / ((x * x).sum(-1, keepdim=True) / x.shape[-1] + eps).sqrt()


def layer_normalized(x, eps):
    centered = x - x.sum(-1, keepdim=True) / x.shape[-1]
    return centered / ((centered * centered).sum(-1, keepdim=True) / x.shape[-1] + eps).sqrt()


def int8_per_row(y, min_scale=FP32_EPS):
    """Per-row max and Python's round (half to even) element by element."""
    q, scales = [], []
    for row in y.tolist():
        scale = max(max(abs(v) for v in row) / 127, min_scale)
        q.append([min(max(round(v / scale), -128), 127) for v in row])
        scales.append([scale])
    return torch.tensor(q, dtype=torch.int8), torch.tensor(scales, dtype=torch.float64)


def normalized_over(x, p, dims, eps):
    """Move the reduced dims last, flatten them, divide each line by its p-norm, move back."""
    reduced = [d % x.dim() for d in dims]
    order = [d for d in range(x.dim()) if d not in reduced] + reduced
    moved = x.permute(order)
    lines = moved.reshape(*moved.shape[: x.dim() - len(reduced)], -1)
    norms = (lines.abs() ** p).sum(-1, keepdim=True) ** (1 / p)
    return (lines / norms.clamp_min(eps)).reshape(moved.shape).permute(torch.argsort(torch.tensor(order)).tolist())


ROWWISE_SHAPES = [(1, 1000), (3, 5120), (3, 64)]


@pytest.mark.parametrize("shape", ROWWISE_SHAPES)
def test_rms_norm_reference(shape):
    x, ref = reference_case("RMSNormFwd", shape)
    assert_f64_close(ref, rms_normalized(x["x"], 1e-6) * x["weight"])


@pytest.mark.parametrize("shape", ROWWISE_SHAPES)
def test_layer_norm_reference(shape):
    x, ref = reference_case("LayerNormFwd", shape)
    assert_f64_close(ref, layer_normalized(x["x"], 1e-5) * x["weight"] + x["bias"])


@pytest.mark.parametrize("shape", ROWWISE_SHAPES)
def test_fused_add_rms_norm_reference(shape):
    x, ref = reference_case("FusedAddRMSNormFwd", shape)
    total = x["x"] + x["residual"]
    assert_f64_close(ref, (rms_normalized(total, 1e-6) * x["weight"], total))


@pytest.mark.parametrize("shape", ROWWISE_SHAPES)
def test_fused_add_layer_norm_reference(shape):
    x, ref = reference_case("FusedAddLayerNormFwd", shape)
    total = x["x"] + x["residual"]
    assert_f64_close(ref, (layer_normalized(total, 1e-5) * x["weight"] + x["bias"], total))


@pytest.mark.parametrize("name", ["FusedAddRMSNormFwd", "FusedAddLayerNormFwd"])
def test_fused_add_writes_residual_in_place(name):
    op, w = OPS[name](), small(name, (3, 1000), "bf16")
    inputs = op.make_inputs(w, InputRNG("cpu", seed=1))
    expected_sum = inputs["x"] + inputs["residual"]
    residual = inputs["residual"]
    _, returned = op.torch_impl(w)(**inputs)
    assert returned is residual
    assert torch.equal(residual, expected_sum)


@pytest.mark.parametrize("shape", ROWWISE_SHAPES)
def test_rms_norm_quant_reference(shape):
    x, (q, scale) = reference_case("RMSNormQuantFwd", shape)
    expected_q, expected_scale = int8_per_row(rms_normalized(x["x"], 1e-6) * x["weight"])
    assert q.dtype == torch.int8 and torch.equal(q, expected_q)
    assert_f64_close(scale, expected_scale)


@pytest.mark.parametrize("shape", ROWWISE_SHAPES)
def test_layer_norm_quant_reference(shape):
    x, (q, scale) = reference_case("LayerNormQuantFwd", shape, min_scale=1e-3)
    expected_q, expected_scale = int8_per_row(layer_normalized(x["x"], 1e-5) * x["weight"] + x["bias"], 1e-3)
    assert q.dtype == torch.int8 and torch.equal(q, expected_q)
    assert_f64_close(scale, expected_scale)


def test_int8_rounds_half_to_even_and_floors_the_scale():
    # max |y| = 127 makes the scale exactly 1, so y / scale keeps its .5 ties.
    q, scale = per_token_int8(torch.tensor([[127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -127.0]]), FP32_EPS)
    assert q.tolist() == [[127, 0, 2, 2, 0, -2, -127]] and scale.tolist() == [[1.0]]
    q, scale = per_token_int8(torch.zeros(2, 4), 0.25)
    assert torch.equal(q, torch.zeros(2, 4, dtype=torch.int8)) and scale.tolist() == [[0.25], [0.25]]


@pytest.mark.parametrize("shape", ROWWISE_SHAPES)
def test_gemma_rms_norm_reference(shape):
    x, ref = reference_case("GemmaRMSNormFwd", shape)
    assert_f64_close(ref, rms_normalized(x["x"], 1e-6) * (1 + x["weight"]))


@pytest.mark.parametrize("shape", ROWWISE_SHAPES)
def test_qk_norm_reference(shape):
    x, ref = reference_case("QKNormFwd", shape, eps=1e-5)
    assert not torch.equal(x["q"], x["k"])
    assert_f64_close(ref, (rms_normalized(x["q"], 1e-5) * x["q_weight"], rms_normalized(x["k"], 1e-5) * x["k_weight"]))


@pytest.mark.parametrize("shape, groups", [((1, 1000), 8), ((3, 5120), 8), ((3, 5120), 1), ((2, 96), 3)])
def test_group_rms_norm_reference(shape, groups):
    x, ref = reference_case("GroupRMSNormFwd", shape, groups=groups)
    size = shape[-1] // groups
    pieces = [rms_normalized(x["x"][:, g * size:(g + 1) * size], 1e-6) for g in range(groups)]
    assert_f64_close(ref, torch.cat(pieces, -1) * x["weight"])


VECTOR_CASES = [((3, 1000), -1), ((1, 5120), 1), ((2, 3, 1000), (0, 2)), ((4, 5, 6), (-1, 0)), ((4, 5, 6), 0)]


@pytest.mark.parametrize("name, p", [("L1NormFwd", 1), ("L2NormFwd", 2)])
@pytest.mark.parametrize("shape, dim", VECTOR_CASES)
def test_vector_normalize_reference(name, p, shape, dim):
    x, ref = reference_case(name, shape, dim=dim)
    assert_f64_close(ref, normalized_over(x["x"], p, (dim,) if isinstance(dim, int) else dim, 1e-12))


def test_vector_normalize_eps_floors_the_norm():
    op, w = OPS["L2NormFwd"](), small("L2NormFwd", (2, 3), eps=1.0)
    x = torch.tensor([[0.3, 0.0, 0.4], [3.0, 0.0, 4.0]], dtype=torch.float64)
    assert torch.allclose(op.reference({"x": x}, w), torch.tensor([[0.3, 0.0, 0.4], [0.6, 0.0, 0.8]], dtype=torch.float64))


@pytest.mark.parametrize("shape, batch", [((1, 1000), 1), ((3, 5120), 3), ((6, 64), 2), ((6, 64), 1)])
def test_ada_layer_norm_reference(shape, batch):
    x, ref = reference_case("AdaLayerNormFwd", shape, batch=batch)
    tokens = shape[0] // batch
    samples = [
        layer_normalized(x["x"][b * tokens:(b + 1) * tokens], 1e-6) * (1 + x["scale"][b]) + x["shift"][b]
        for b in range(batch)
    ]
    assert_f64_close(ref, torch.cat(samples))


@pytest.mark.parametrize("shape", ROWWISE_SHAPES)
def test_weight_norm_reference(shape):
    x, ref = reference_case("WeightNormFwd", shape)
    v = x["v"]
    assert_f64_close(ref, x["g"] * v / (v * v).sum(1, keepdim=True).sqrt())


def explicit_power_iteration(weight, u, v, eps=1e-12):
    rows = weight.shape[0]
    wt_u = sum(weight[i] * u[i] for i in range(rows))
    v = wt_u / max(float((wt_u * wt_u).sum().sqrt()), eps)
    w_v = torch.stack([(weight[i] * v).sum() for i in range(rows)])
    u = w_v / max(float((w_v * w_v).sum().sqrt()), eps)
    return weight / (u * w_v).sum(), u, v


@pytest.mark.parametrize("shape", [(1, 1000), (3, 5120), (7, 5)])
def test_spectral_norm_reference(shape):
    x, ref = reference_case("SpectralNormPowerIterFwd", shape)
    assert_f64_close(ref, explicit_power_iteration(x["weight"], x["u"], x["v"]))


def test_spectral_norm_matches_torch_module():
    x, (weight, u, v) = reference_case("SpectralNormPowerIterFwd", (7, 5))
    layer = torch.nn.Linear(5, 7, bias=False, dtype=torch.float64)
    with torch.no_grad():
        layer.weight.copy_(x["weight"])
    layer = torch.nn.utils.spectral_norm(layer)
    layer.weight_u.copy_(x["u"])
    layer.weight_v.copy_(x["v"])
    layer(torch.zeros(1, 5, dtype=torch.float64))  # training mode: one power iteration
    assert_f64_close((weight, u, v), (layer.weight.detach(), layer.weight_u, layer.weight_v))


# -- the torch formulations (the baselines) against the references ------------------------------
def baseline_cases():
    for name in OP_NAMES:
        for dtype in ("bf16", "f16", "f32"):
            for shape in [(1, 1000), (3, 5120)]:
                params = {"batch": shape[0]} if name == "AdaLayerNormFwd" else {}
                yield name, dtype, shape, params
    for name in ("L1NormFwd", "L2NormFwd"):
        for dtype in ("bf16", "f16", "f32"):
            yield name, dtype, (2, 3, 1000), {"dim": (0, 2)}


@pytest.mark.parametrize("name, dtype, shape, params", list(baseline_cases()))
def test_torch_impl_matches_reference(name, dtype, shape, params):
    op, w = OPS[name](), small(name, shape, dtype, **params)
    result = check(op, w, op.torch_impl(w), CPUDevice(), seed=11)
    assert result.ok, result.detail


def off_by_a_little(out):
    """5% too large floats, integers off by 2: beyond every tolerance."""
    return tuple(o * 1.05 if o.is_floating_point() else o + 2 for o in as_tuple(out))


@pytest.mark.parametrize("name", OP_NAMES)
def test_check_rejects_a_wrong_result(name):
    op, w = OPS[name](), small(name, (3, 1000), "bf16")
    fn = op.torch_impl(w)
    result = check(op, w, lambda **inputs: off_by_a_little(fn(**inputs)), CPUDevice(), seed=11)
    assert not result.ok and result.max_error > 1


# -- the catalog --------------------------------------------------------------------------------
def test_every_op_has_a_class_and_workloads():
    assert sorted(OPS) == sorted(OP_NAMES)
    assert all(CATALOG[name] for name in OP_NAMES)


@pytest.mark.parametrize("name", OP_NAMES)
def test_catalog_workloads_build_on_meta_and_cost(name):
    op = OPS[name](CATALOG[name])  # validates every workload
    for w in op.workloads:
        inputs = op.make_inputs(w, InputRNG("meta"))
        assert all(t.device.type == "meta" for t in inputs.values())
        cost = op.cost(w)
        assert cost.bytes >= sum(t.nbytes for t in inputs.values()) > 0 and cost.flops > 0
        assert op.memory_bytes(w) > cost.bytes


def catalog_workload(name, id):
    return next(w for w in CATALOG[name] if w.id == id)


@pytest.mark.parametrize("name, id, expected_bytes, expected_dtypes", [
    # x [2048, 4096] bf16 read + y written + weight (+ bias)
    ("RMSNormFwd", "W8", 2 * 2048 * 4096 * 2 + 4096 * 2, ("bf16",)),
    ("LayerNormFwd", "W8", 2 * 2048 * 4096 * 2 + 2 * 4096 * 2, ("bf16",)),
    # x and residual read, y and residual written
    ("FusedAddRMSNormFwd", "W8", 4 * 2048 * 4096 * 2 + 4096 * 2, ("bf16", "bf16")),
    # x read, int8 q and one f32 scale per row written
    ("RMSNormQuantFwd", "W8", 2048 * 4096 * (2 + 1) + 4096 * 2 + 2048 * 4, ("i8", "f32")),
    ("QKNormFwd", "W8", 4 * 2048 * 4096 * 2 + 2 * 4096 * 2, ("bf16", "bf16")),
    # 4 DiT images: shift and scale [4, 1152]
    ("AdaLayerNormFwd", "W1", 2 * 1024 * 1152 * 2 + 2 * 4 * 1152 * 2, ("bf16",)),
    ("WeightNormFwd", "W8", 2 * 2048 * 4096 * 2 + 2048 * 2, ("bf16",)),
    ("SpectralNormPowerIterFwd", "W8", 2 * (2048 * 4096 + 2048 + 4096) * 2, ("bf16", "bf16", "bf16")),
    ("L2NormFwd", "W1", 2 * 4 * 128 * 4096 * 2, ("f16",)),
])
def test_cost_counts_each_input_and_output_once(name, id, expected_bytes, expected_dtypes):
    op = OPS[name](CATALOG[name])
    w = op.workload(id)
    assert op.cost(w).bytes == expected_bytes
    assert op.output_dtypes(w) == expected_dtypes


def test_dit_workloads_choose_four_images():
    op = OPS["AdaLayerNormFwd"]()
    assert [op.config(catalog_workload("AdaLayerNormFwd", id))["batch"] for id in ("W1", "W2", "W3")] == [4, 4, 1]


@pytest.mark.parametrize("name, shape, params, field", [
    ("RMSNormFwd", (3, 64), {"normalized_shape": [32]}, "normalized_shape"),
    ("LayerNormQuantFwd", (3, 64), {"normalized_shape": [3, 64]}, "normalized_shape"),
    ("QKNormFwd", (3, 64), {"eps": 1}, "eps"),
    ("GroupRMSNormFwd", (3, 1000), {"groups": 3}, "groups"),
    ("GroupRMSNormFwd", (3, 1000), {"groups": 0}, "groups"),
    ("L1NormFwd", (3, 64), {"dim": 2}, "dim"),
    ("L2NormFwd", (3, 4, 5), {"dim": [0, -3]}, "dim"),
    ("L2NormFwd", (3, 4, 5), {"dim": []}, "dim"),
    ("AdaLayerNormFwd", (10, 64), {"batch": 4}, "batch"),
    ("WeightNormFwd", (2, 3, 64), {}, "'x'"),
    ("SpectralNormPowerIterFwd", (64,), {}, "'x'"),
    ("FusedAddRMSNormFwd", (3, 64), {"group": 2}, "group"),
])
def test_bad_workload_names_the_field(name, shape, params, field):
    with pytest.raises(WorkloadError, match=field):
        OPS[name]([small(name, shape, **params)])


def test_missing_tensor_is_named():
    w = Workload(op="RMSNormFwd", id="T", label="test", dtype="bf16", shapes={"y": (3, 64)})
    with pytest.raises(WorkloadError, match="lacks x"):
        OPS["RMSNormFwd"]([w])
