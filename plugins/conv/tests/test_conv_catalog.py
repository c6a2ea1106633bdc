"""Every catalog workload of the conv family validates, builds inputs on the meta device, runs its
torch formulation there with the promised output shapes and dtypes, and has a positive cost; the
values derived or chosen for the irregular seed records are the intended ones."""

import dataclasses

import pytest
from conv_oracle import small

from npuops import InputRNG, WorkloadError
from npuops.registry import load_registry
from npuops.workload import dtype_name
from npuops_conv.plugin import npuops_ops

OPS = {op.name: op for op in npuops_ops()}
ALL = [pytest.param(op, w, id=w.key) for op in OPS.values() for w in op.workloads]


def test_catalog_has_all_13_ops_and_208_workloads():
    assert len(OPS) == 13
    assert len(ALL) == 208


@pytest.mark.parametrize("op, w", ALL)
def test_workload_builds_and_runs_on_meta(op, w):
    op.validate(w)
    inputs = op.make_inputs(w, InputRNG("meta"))
    specs = op.input_specs(w)
    assert {k: (tuple(t.shape), t.dtype) for k, t in inputs.items()} == {k: (s.shape, s.dtype) for k, s in specs.items()}
    out = op.torch_impl(w)(**inputs)
    outs = out if isinstance(out, tuple) else (out,)
    assert [tuple(o.shape) for o in outs] == [s.shape for s in op.output_specs(w)]
    assert tuple(dtype_name(o.dtype) for o in outs) == op.output_dtypes(w)
    cost = op.cost(w)
    assert cost.bytes > 0 and cost.flops > 0
    assert op.memory_bytes(w) > 6 * cost.bytes


def geometry(op_name, workload_id):
    op = OPS[op_name]
    return op, op.workload(workload_id), op.geometry(op.workload(workload_id))


def shapes_of(op, w):
    return {name: spec.shape for name, spec in op.input_specs(w).items()}, [s.shape for s in op.output_specs(w)]


def test_transpose_without_c_in_takes_the_bias_sibling_value():
    op, w, g = geometry("Conv2dTranspose", "W2")
    assert w.chosen == {"C_in": 512}
    assert op.workload("W1").params["C_in"] == 512  # the "-bias" sibling
    assert shapes_of(op, w) == ({"input": (2, 128, 28, 28), "weight": (128, 512, 1, 1)}, [(2, 512, 28, 28)])


@pytest.mark.parametrize("workload_id, c_in", [("W7", 256), ("W14", 32), ("W23", 256)])
def test_transpose_without_bias_sibling_takes_the_forward_layer_c_out(workload_id, c_in):
    op, w, g = geometry("Conv2dTranspose", workload_id)
    forward = next(f for f in OPS["Conv2dFwd"].workloads if f.label == w.label)
    assert w.chosen == {"C_in": c_in} == {"C_in": forward.params["C_out"]}


def test_strided_transpose_output_size_uses_pytorch_default_output_padding():
    op, w, g = geometry("Conv2dTranspose", "W24")
    assert shapes_of(op, w)[1] == [(1, 256, 111, 111)]  # (56-1)*2 - 2 + 3
    assert g.transpose_output_padding == (0, 0)


def test_pointwise_is_1x1():
    op, w, g = geometry("PointwiseConv2d", "W1")
    assert g.kernel == (1, 1) and g.groups == 1
    assert shapes_of(op, w) == (
        {"input": (2, 128, 28, 28), "weight": (512, 128, 1, 1), "bias": (512,)}, [(2, 512, 28, 28)]
    )


def test_conv3d_kernel_from_weight_or_chosen():
    _, w3, g3 = geometry("Conv3dFwd", "W3")
    assert g3.kernel == (3, 3, 3) and not w3.chosen and g3.output_shape == (1, 4, 4, 5, 6)
    _, w4, g4 = geometry("Conv3dFwd", "W4")
    assert g4.kernel == (1, 1, 1) and not w4.chosen and g4.output_shape == (1, 1, 258, 256, 128)
    _, w2, g2 = geometry("Conv3dFwd", "W2")
    assert w2.chosen == {"kD": 3, "kH": 3, "kW": 3} and g2.output_shape == (1, 256, 8, 16, 16)
    assert {w.id for w in OPS["Conv3dFwd"].workloads if w.chosen} == {"W1", "W2", "W5", "W6", "W7", "W8", "W9", "W10"}


@pytest.mark.parametrize("workload_id, groups, output_shape", [
    ("W8", 1, (1, 32, 6, 6)),  # no padding stated: PyTorch's 0
    ("W10", 4, (1, 4, 8, 9)),  # depthwise through groups
    ("W13", 4, (1, 8, 9, 10)),
])
def test_conv2d_with_explicit_weight(workload_id, groups, output_shape):
    op, w, g = geometry("Conv2dFwd", workload_id)
    assert g.weight_shape == w.shapes["weight"] and g.groups == groups and g.output_shape == output_shape


def test_conv2d_cost_counts_every_tensor_once():
    op, w, g = geometry("Conv2dFwd", "W8")
    cost = op.cost(w)
    assert cost.bytes == 2 * (16 * 8 * 8 + 32 * 16 * 3 * 3 + 32 * 6 * 6)
    assert cost.flops == 2 * 32 * 6 * 6 * 16 * 3 * 3


def test_conv1d_dilation_groups():
    op, w, g = geometry("Conv1dFwd", "W1")
    assert (g.groups, g.dilation, g.padding, g.weight_shape) == (2, (2,), (2,), (8, 2, 3))
    assert g.output_shape == (1, 8, 17)


def test_causal_conv_output_length_is_ceil_of_input_over_stride():
    _, _, g = geometry("Conv1dCausal", "W9")  # wav2vec2 layer 1: kW 10, stride 5
    assert g.pad_before == (9,) and g.pad_after == (0,) and g.output_shape == (1, 512, 3200)


def test_backward_ops_swap_the_forward_tensors():
    op, w, g = geometry("Conv2dDgrad", "W24")
    assert shapes_of(op, w) == ({"grad_output": (1, 256, 28, 28), "weight": (256, 128, 3, 3)}, [(1, 128, 56, 56)])
    op, w, g = geometry("Conv2dWgrad", "W24")
    assert shapes_of(op, w) == ({"input": (1, 128, 56, 56), "grad_output": (1, 256, 28, 28)}, [(256, 128, 3, 3), (256,)])


def test_fp8_conv_is_costed_in_fp8_with_a_bf16_output():
    op, w, g = geometry("Conv2dFp8Fwd", "W1")
    assert op.output_dtypes(w) == ("bf16",)
    assert op.cost(w).bytes == 2 * 64 * 56 * 56 + 256 * 64 + 2 * 4 + 2 * 2 * 256 * 56 * 56
    assert op.cost(w).compute_dtype in (None, "fp8e4m3") and w.dtype == "fp8e4m3"


X = {"input": [1, 8, 8, 8]}


@pytest.mark.parametrize("op_name, shapes, params, field", [
    ("Conv2dFwd", {"input": [2, 128, 28, 28]}, dict(C_in=4, C_out=8, kH=1, kW=1), "'C_in'"),
    ("Conv2dFwd", X, dict(C_out=8, kH=3, kW=3, groups=3), "'groups'"),
    ("Conv2dFwd", X, dict(C_out=8, kH=3, kW=3, padding=[1, 1, 1]), "'padding'"),
    ("Conv2dFwd", X, dict(C_out=8, kH=3, kW=3, stride="2"), "'stride'"),
    ("Conv2dFwd", X, dict(C_out=8, kH=3), "kW"),
    ("Conv2dFwd", X, dict(kH=3, kW=3), "C_out"),
    ("Conv2dFwd", {**X, "weight": [4, 8, 3, 3], "bias": [5]}, dict(bias=True), "'bias'"),
    ("Conv2dFwd", {**X, "weight": [4, 8, 3, 3], "bias": [4]}, dict(), "'bias'"),
    ("Conv2dFwd", {**X, "weight": [4, 3, 3, 3]}, dict(), "'weight'"),
    ("Conv2dFwd", {"input": [1, 8, 2, 2], "weight": [4, 8, 3, 3]}, dict(), "empty"),
    ("Conv2dFwd", {"input": [1, 8, 8]}, dict(C_out=8, kH=3, kW=3), "'input'"),
    ("Conv3dFwd", {"input": [1, 2, 4, 4, 4]}, dict(C_out=4), "kernel size"),
    ("Conv2dTranspose", X, dict(kH=3, kW=3), "C_in"),
    ("Conv2dTranspose", X, dict(C_in=4, kH=3, kW=3, stride=2, output_padding=2), "'output_padding'"),
    ("Conv2dTranspose", X, dict(C_in=4, kH=3, kW=3, dilation=2, output_padding=1), "'output_padding'"),
    ("Conv2dBiasRelu", X, dict(C_out=8, kH=3, kW=3, bias=False), "'bias'"),
    ("PointwiseConv2d", X, dict(C_out=8, kH=3), "'kH'"),
    ("Conv2dFp8Fwd", {**X, "bias": [8]}, dict(C_out=8, kH=1, kW=1), "bias"),
])
def test_bad_workload_names_the_field(op_name, shapes, params, field):
    with pytest.raises(WorkloadError, match=field):
        OPS[op_name].validate(small(op_name, "f16", shapes, **params))


def test_workload_without_its_chosen_value_is_rejected():
    op = OPS["Conv2dTranspose"]
    w = op.workload("W2")
    with pytest.raises(WorkloadError, match="C_in"):
        op.validate(dataclasses.replace(w, chosen={}))


def test_registry_loads_the_plugin_without_errors():
    registry = load_registry()
    assert not [e for e in registry.errors if e.plugin == "conv"]
    assert set(registry.plugins["conv"].ops) == set(OPS)
    assert {i.name for i in registry.impls_for("Conv2dFwd")} >= {"torch_eager", "torch_compile", "cudnn_channels_last"}


def _gemm_launches():
    from npuops_conv.conv_kernel import Problem

    for op in npuops_ops():
        for w in op.workloads:
            if hasattr(op, "fused_relu") and not op.kernel_unsupported(w):  # a forward op: A may be the input
                copied_a = Problem(op.geometry(w), w.dtype_of("input"), op.fused_relu).input_is_a
            else:
                copied_a = False
            if not op.kernel_unsupported(w):
                yield f"{op.name}/{w.id}", copied_a, op.tilelang_variants(w)


def test_no_gathered_gemm_takes_a_128x256_tile():
    """A gathered A operand takes as many producer threads as consumers, which caps a thread at 128
    registers, all of them a 128 x 256 accumulator's: ptxas spills and serializes its wgmma. Neither
    a rule nor a tuning variant offers that tile but where A is copied whole (one producer warp)."""
    offending = [(key, v) for key, copied_a, variants in _gemm_launches() for v in variants
                 if v["kernel"] != "direct" and (v["block_M"], v["block_N"]) == (128, 256) and not copied_a]
    assert offending == []
