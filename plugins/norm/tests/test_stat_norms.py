"""The statistic norms (batch, instance and group norm, forward and backward; RMSNorm and LayerNorm
backward): references against formulations from the definitions in f64, baselines against the
references, the catalog on the meta device, and the workload checks."""

import dataclasses
from importlib.resources import files

import pytest
import torch

from npuops import InputRNG, Workload, WorkloadError, load_catalog
from npuops.check import check, clone_inputs
from npuops.devices import CPUDevice
from npuops_norm.ops.batch_norm_bwd import BatchNormBwd
from npuops_norm.ops.batch_norm_fwd import BatchNormFwd
from npuops_norm.ops.batch_norm_inference_fwd import BatchNormInferenceFwd
from npuops_norm.ops.group_norm_bwd import GroupNormBwd
from npuops_norm.ops.group_norm_fwd import GroupNormFwd
from npuops_norm.ops.instance_norm_bwd import InstanceNormBwd
from npuops_norm.ops.instance_norm_fwd import InstanceNormFwd
from npuops_norm.ops.layer_norm_bwd import LayerNormBwd
from npuops_norm.ops.rms_norm_bwd import RMSNormBwd

OP_CLASSES = {cls.name: cls for cls in (
    BatchNormFwd, BatchNormInferenceFwd, BatchNormBwd, InstanceNormFwd, InstanceNormBwd,
    GroupNormFwd, GroupNormBwd, RMSNormBwd, LayerNormBwd,
)}
CATALOG = load_catalog(files("npuops_norm") / "workloads.json")
RUNNING = ("running_mean", "running_var")


def workload(op_name, dtype, shapes, **params) -> Workload:
    return Workload(op=op_name, id="T", label="test", dtype=dtype, shapes=shapes, params=params,
                    shape_dtypes={name: "f32" for name in RUNNING if name in shapes})


def run_reference(op, w, seed=0):
    inputs = op.make_inputs(w, InputRNG("cpu", seed))
    out = op.reference(clone_inputs(inputs), w)
    return {k: v.double() for k, v in inputs.items()}, out if isinstance(out, tuple) else (out,)


def assert_matches(outputs, expected, rtol=1e-9, atol=1e-9):
    assert len(outputs) == len(expected)
    for i, (got, want) in enumerate(zip(outputs, expected, strict=True)):
        assert got.dtype == torch.float64, f"output {i} is {got.dtype}, not computed in f64"
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol, msg=lambda m, i=i: f"output {i}: {m}")


def channel_view(t, x):
    """[C] -> broadcastable against x: [N, C, *spatial]."""
    return t.view(1, -1, *([1] * (x.dim() - 2)))


def grads_of(forward, inputs, grad_out):
    """torch.autograd.grad of an explicit f64 forward over ``inputs`` (a dict of leaf tensors)."""
    leaves = {k: v.clone().requires_grad_() for k, v in inputs.items()}
    return dict(zip(leaves, torch.autograd.grad(forward(**leaves), tuple(leaves.values()), grad_out), strict=True))


# ------------------------------------------------------------------------------ batch norm
BN_SHAPES = [(3, 5, 7, 3), (6, 5), (2, 3, 9)]


def batch_norm_explicit(x, weight, bias, eps):
    dims = (0, *range(2, x.dim()))
    mean = x.mean(dims)
    var = ((x - channel_view(mean, x)) ** 2).mean(dims)
    x_hat = (x - channel_view(mean, x)) / torch.sqrt(channel_view(var, x) + eps)
    y = x_hat * channel_view(weight, x) + channel_view(bias, x)
    return y, mean, var


@pytest.mark.parametrize("x_shape", BN_SHAPES)
def test_batch_norm_fwd_reference_is_training_batch_norm(x_shape):
    op = BatchNormFwd()
    eps, momentum = 1e-3, 0.25
    inputs, out = run_reference(op, workload(op.name, "f64", {"x": x_shape}, eps=eps, momentum=momentum))
    x = inputs["x"]
    n = x.numel() // x.shape[1]
    y, mean, var = batch_norm_explicit(x, inputs["weight"], inputs["bias"], eps)
    expected = (
        y, mean, 1 / torch.sqrt(var + eps),
        (1 - momentum) * inputs["running_mean"] + momentum * mean,
        (1 - momentum) * inputs["running_var"] + momentum * var * n / (n - 1),
    )
    assert_matches(out, expected)


@pytest.mark.parametrize("x_shape", BN_SHAPES)
def test_batch_norm_inference_reference_uses_running_stats(x_shape):
    op = BatchNormInferenceFwd()
    eps = 1e-3
    inputs, out = run_reference(op, workload(op.name, "f64", {"x": x_shape}, eps=eps))
    x = inputs["x"]
    scale = inputs["weight"] / torch.sqrt(inputs["running_var"] + eps)
    expected = (x - channel_view(inputs["running_mean"], x)) * channel_view(scale, x) + channel_view(inputs["bias"], x)
    assert_matches(out, (expected,))


@pytest.mark.parametrize("x_shape", BN_SHAPES)
def test_batch_norm_bwd_reference_is_autograd_of_batch_norm(x_shape):
    op = BatchNormBwd()
    eps = 1e-3
    inputs, out = run_reference(op, workload(op.name, "f64", {"x": x_shape}, eps=eps))
    bias = torch.zeros_like(inputs["weight"])
    grads = grads_of(lambda x, weight, bias: batch_norm_explicit(x, weight, bias, eps)[0],
                     {"x": inputs["x"], "weight": inputs["weight"], "bias": bias}, inputs["grad_out"])
    assert_matches(out, (grads["x"], grads["weight"], grads["bias"]))


# --------------------------------------------------------------------------- instance norm
IN_SHAPES = [(2, 3, 5, 4), (3, 2, 7)]
AFFINE_RUNNING = [(False, False), (True, False), (False, True), (True, True)]


def instance_shapes(x_shape, affine, running_stats):
    c = x_shape[1]
    names = (("weight", "bias") if affine else ()) + (RUNNING if running_stats else ())
    return {"x": x_shape, **{name: (c,) for name in names}}


def instance_norm_explicit(x, eps, weight=None, bias=None):
    dims = tuple(range(2, x.dim()))
    mean = x.mean(dims, keepdim=True)
    var = ((x - mean) ** 2).mean(dims, keepdim=True)
    y = (x - mean) / torch.sqrt(var + eps)
    if weight is not None:
        y = y * channel_view(weight, x) + channel_view(bias, x)
    return y, mean.flatten(), var.flatten()


@pytest.mark.parametrize("x_shape", IN_SHAPES)
@pytest.mark.parametrize("affine,running_stats", AFFINE_RUNNING)
def test_instance_norm_fwd_reference_normalizes_each_instance(x_shape, affine, running_stats):
    op = InstanceNormFwd()
    eps, momentum = 1e-3, 0.25
    w = workload(op.name, "f64", instance_shapes(x_shape, affine, running_stats),
                 affine=affine, running_stats=running_stats, eps=eps, momentum=momentum)
    inputs, out = run_reference(op, w)
    x = inputs["x"]
    n, c = x.shape[:2]
    m = x[0, 0].numel()
    y, mean, var = instance_norm_explicit(x, eps, inputs.get("weight"), inputs.get("bias"))
    expected = (y,)
    if running_stats:
        expected += (
            (1 - momentum) * inputs["running_mean"] + momentum * mean.view(n, c).mean(0),
            (1 - momentum) * inputs["running_var"] + momentum * (var * m / (m - 1)).view(n, c).mean(0),
        )
    assert_matches(out, expected)


@pytest.mark.parametrize("x_shape", IN_SHAPES)
@pytest.mark.parametrize("affine,running_stats", AFFINE_RUNNING)
def test_instance_norm_bwd_reference_is_autograd_of_instance_norm(x_shape, affine, running_stats):
    op = InstanceNormBwd()
    eps = 1e-3
    w = workload(op.name, "f64", instance_shapes(x_shape, affine, running_stats),
                 affine=affine, running_stats=running_stats, eps=eps)
    inputs, out = run_reference(op, w)
    leaves = {"x": inputs["x"]}
    if affine:
        leaves.update(weight=inputs["weight"], bias=torch.zeros_like(inputs["weight"]))
    grads = grads_of(lambda **t: instance_norm_explicit(eps=eps, **t)[0], leaves, inputs["grad_out"])
    expected = (grads["x"], grads["weight"], grads["bias"]) if affine else (grads["x"],)
    assert_matches(out, expected)


# ------------------------------------------------------------------------------ group norm
GN_CASES = [((2, 6, 5, 3), 3), ((3, 4, 7), 2), ((2, 6), 3), ((1, 5, 4, 2), 5)]


def group_norm_explicit(x, groups, eps, weight=None, bias=None):
    grouped = x.reshape(x.shape[0], groups, -1)
    mean = grouped.mean(2, keepdim=True)
    var = ((grouped - mean) ** 2).mean(2, keepdim=True)
    rstd = 1 / torch.sqrt(var + eps)
    y = ((grouped - mean) * rstd).view(x.shape)
    if weight is not None:
        y = y * channel_view(weight, x) + channel_view(bias, x)
    return y, mean.squeeze(2), rstd.squeeze(2)


def group_shapes(x_shape, affine):
    return {"x": x_shape, **({"weight": x_shape[1:2], "bias": x_shape[1:2]} if affine else {})}


@pytest.mark.parametrize("x_shape,groups", GN_CASES)
@pytest.mark.parametrize("affine", [True, False])
def test_group_norm_fwd_reference_normalizes_each_group(x_shape, groups, affine):
    op = GroupNormFwd()
    eps = 1e-3
    w = workload(op.name, "f64", group_shapes(x_shape, affine), num_groups=groups, affine=affine, eps=eps)
    inputs, out = run_reference(op, w)
    assert_matches(out, group_norm_explicit(inputs["x"], groups, eps, inputs.get("weight"), inputs.get("bias")))


@pytest.mark.parametrize("x_shape,groups", GN_CASES)
@pytest.mark.parametrize("affine", [True, False])
def test_group_norm_bwd_reference_is_autograd_of_group_norm(x_shape, groups, affine):
    op = GroupNormBwd()
    eps = 1e-3
    w = workload(op.name, "f64", group_shapes(x_shape, affine), num_groups=groups, affine=affine, eps=eps)
    inputs, out = run_reference(op, w)
    leaves = {"x": inputs["x"]}
    if affine:
        leaves.update(weight=inputs["weight"], bias=torch.zeros_like(inputs["weight"]))
    grads = grads_of(lambda **t: group_norm_explicit(groups=groups, eps=eps, **t)[0], leaves, inputs["grad_out"])
    expected = (grads["x"], grads["weight"], grads["bias"]) if affine else (grads["x"],)
    assert_matches(out, expected)


# ------------------------------------------------------------------- row-wise norm backward
ROW_CASES = [((5, 24), None), ((3, 7, 33), [33]), ((2, 3, 8), [3, 8])]


def normalized_dims(x, normalized_shape):
    count = len(normalized_shape) if normalized_shape else 1
    return tuple(range(x.dim() - count, x.dim()))


def rowwise_workload(op, x_shape, normalized_shape, eps):
    params = {"eps": eps} if normalized_shape is None else {"eps": eps, "normalized_shape": normalized_shape}
    return workload(op.name, "f64", {"x": x_shape}, **params)


@pytest.mark.parametrize("x_shape,normalized_shape", ROW_CASES)
def test_rms_norm_bwd_reference_is_autograd_of_rms_norm(x_shape, normalized_shape):
    op = RMSNormBwd()
    eps = 1e-3
    inputs, out = run_reference(op, rowwise_workload(op, x_shape, normalized_shape, eps))
    dims = normalized_dims(inputs["x"], normalized_shape)

    def rms_norm(x, weight):
        return x / torch.sqrt((x * x).mean(dims, keepdim=True) + eps) * weight

    grads = grads_of(rms_norm, {"x": inputs["x"], "weight": inputs["weight"]}, inputs["grad_out"])
    assert_matches(out, (grads["x"], grads["weight"]))


@pytest.mark.parametrize("x_shape,normalized_shape", ROW_CASES)
def test_layer_norm_bwd_reference_is_autograd_of_layer_norm(x_shape, normalized_shape):
    op = LayerNormBwd()
    eps = 1e-3
    inputs, out = run_reference(op, rowwise_workload(op, x_shape, normalized_shape, eps))
    dims = normalized_dims(inputs["x"], normalized_shape)

    def layer_norm(x, weight, bias):
        mean = x.mean(dims, keepdim=True)
        var = ((x - mean) ** 2).mean(dims, keepdim=True)
        return (x - mean) / torch.sqrt(var + eps) * weight + bias

    leaves = {"x": inputs["x"], "weight": inputs["weight"], "bias": inputs["bias"]}
    grads = grads_of(layer_norm, leaves, inputs["grad_out"])
    assert_matches(out, (grads["x"], grads["weight"], grads["bias"]))


def test_saved_statistics_inputs_match_x():
    """The backward ops' saved statistics are those of their x (else the gradients are not)."""
    op = LayerNormBwd()
    inputs = op.make_inputs(workload(op.name, "bf16", {"x": (4, 64)}), InputRNG("cpu", 3))
    x = inputs["x"].double()
    torch.testing.assert_close(inputs["mean"].double(), x.mean(1, keepdim=True), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(inputs["rstd"].double(), 1 / torch.sqrt(x.var(1, correction=0, keepdim=True) + 1e-5),
                               rtol=1e-5, atol=1e-6)
    assert inputs["mean"].dtype == inputs["rstd"].dtype == torch.float32


# ------------------------------------------------------------------------ baselines vs refs
def small(w):
    """The catalog workload ``w`` shrunk to a CPU-test size, keeping its dtype and params."""
    x = w.shapes["x"]
    params = dict(w.params)
    if "normalized_shape" in params:
        small_x = (5, 48)
        params["normalized_shape"] = [48]
    elif len(x) == 2:
        small_x = (6, 5)
    else:
        small_x = (2, 2 * params.get("num_groups", 3), 5, 3)
    shapes = {name: (small_x if name == "x" else (small_x[1],)) for name in w.shapes}
    return dataclasses.replace(w, shapes=shapes, params=params)


def baseline_cases():
    """One small workload per op, catalog (dtype, params) pair, plus f32 for each params."""
    cases = {}
    for name, workloads in CATALOG.items():
        if name not in OP_CLASSES:
            continue
        for w in workloads:
            shrunk = small(w)
            for dtype in (w.dtype, "f32"):
                key = (name, dtype, repr(sorted(shrunk.params.items())))
                cases.setdefault(key, dataclasses.replace(shrunk, dtype=dtype, id=f"{w.id}-{dtype}"))
    return sorted(cases.values(), key=lambda w: (w.op, w.id))


@pytest.mark.parametrize("w", baseline_cases(), ids=lambda w: f"{w.op}-{w.id}")
def test_torch_formulation_matches_reference(w):
    op = OP_CLASSES[w.op]()
    for seed in (0, 1):
        result = check(op, w, op.torch_impl(w), CPUDevice(), seed)
        assert result.ok, result.detail


# ------------------------------------------------------------------------------ catalog
EXPECTED_OUTPUT_DTYPES = {
    "BatchNormFwd": lambda w: (w.dtype, "f32", "f32", "f32", "f32"),
    "BatchNormInferenceFwd": lambda w: (w.dtype,),
    "BatchNormBwd": lambda w: (w.dtype, "f32", "f32"),
    "InstanceNormFwd": lambda w: (w.dtype, "f32", "f32") if w.params["running_stats"] else (w.dtype,),
    "InstanceNormBwd": lambda w: (w.dtype,) * (3 if w.params["affine"] else 1),
    "GroupNormFwd": lambda w: (w.dtype,) * 3,
    "GroupNormBwd": lambda w: (w.dtype,) * (3 if w.params["affine"] else 1),
    "RMSNormBwd": lambda w: (w.dtype,) * 2,
    "LayerNormBwd": lambda w: (w.dtype,) * 3,
}


@pytest.mark.parametrize("name", sorted(OP_CLASSES))
def test_catalog_workloads_validate_build_and_cost(name):
    op = OP_CLASSES[name](CATALOG[name])
    assert op.workloads
    for w in op.workloads:
        inputs = op.make_inputs(w, InputRNG("meta"))
        assert all(t.device.type == "meta" for t in inputs.values())
        assert inputs["x"].shape == w.shapes["x"]
        cost = op.cost(w)
        x_bytes = inputs["x"].nbytes
        assert 2 * x_bytes <= cost.bytes <= 4 * x_bytes + (1 << 20), (w.id, cost.bytes)
        assert cost.flops >= 2 * inputs["x"].numel()
        assert op.memory_bytes(w) > 4 * x_bytes
        assert op.output_dtypes(w) == EXPECTED_OUTPUT_DTYPES[name](w)


def test_large_batch_norm_cost_and_memory_are_honest():
    op = BatchNormFwd(CATALOG["BatchNormFwd"])
    w = op.workload("W1")
    x_bytes = 4 * 128 * 1024 * 1024 * 2
    # x read, y written; [C] f32: weight, bias, running stats read; saved stats, running stats written
    assert op.cost(w).bytes == 2 * x_bytes + 8 * 128 * 4
    # a check peaked at 20x x's bytes on an H200 (the f32 reference output and compare's f32
    # temporaries dominate), far above the default 6x
    assert op.memory_bytes(w) >= 20 * x_bytes


def test_layer_norm_bwd_bias_is_not_counted_as_read():
    op = LayerNormBwd()
    w = workload(op.name, "bf16", {"x": (8, 64)})
    reads = (2 * 8 * 64 + 64) * 2 + 2 * 8 * 4  # grad_out, x, weight; f32 mean, rstd
    writes = (8 * 64 + 2 * 64) * 2
    assert op.cost(w).bytes == reads + writes


# ---------------------------------------------------------------------------- bad workloads
BAD_WORKLOADS = [
    ("BatchNormFwd", {"x": (8,)}, {}, "'x'"),
    ("BatchNormBwd", {"x": (8, 4)}, {"momentum": 0.1}, "'momentum'"),
    ("InstanceNormFwd", {"x": (2, 4, 5)}, {"affine": True}, "'weight'"),
    ("InstanceNormFwd", {"x": (2, 4, 5), "weight": (3,), "bias": (4,)}, {"affine": True}, "'weight'"),
    ("InstanceNormFwd", {"x": (2, 4, 5), "running_mean": (4,), "running_var": (4,)}, {}, "'running_stats'"),
    ("InstanceNormBwd", {"x": (2, 4)}, {}, "'x'"),
    ("GroupNormFwd", {"x": (2, 8, 3)}, {"num_groups": 3, "affine": False}, "'num_groups'"),
    ("GroupNormFwd", {"x": (2, 8, 3)}, {"num_groups": "4", "affine": False}, "'num_groups'"),
    ("GroupNormBwd", {"x": (2, 8, 3), "bias": (8,)}, {"num_groups": 4}, "'weight'"),  # the bias it may leave out
    ("RMSNormBwd", {"x": (4, 64)}, {"normalized_shape": [32]}, "'normalized_shape'"),
    ("LayerNormBwd", {"x": (4, 64)}, {"normalized_shape": [4, 64]}, "'normalized_shape'"),
    ("LayerNormBwd", {"x": (4, 64), "weight": (64,)}, {}, "weight"),
]


@pytest.mark.parametrize("name,shapes,params,field", BAD_WORKLOADS)
def test_bad_workload_names_the_field(name, shapes, params, field):
    with pytest.raises(WorkloadError, match=field):
        OP_CLASSES[name]([workload(name, "f16", shapes, **params)])
