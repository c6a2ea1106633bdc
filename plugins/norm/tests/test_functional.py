"""The functions model code calls (npuops_norm.rms_norm, ...): torch custom ops with fake
implementations, checked against the ops' references, inside torch.compile, and on bad input."""

from __future__ import annotations

import pytest
import torch

import npuops_norm as F
from npuops import InputRNG, Workload, compare_tensors
from npuops.registry import load_registry

REGISTRY = load_registry(strict=True)

# function, op, argument order (the op's input names), extra scalar args
CASES = [
    (F.rms_norm, "RMSNormFwd", ["x", "weight"], {}),
    (F.layer_norm, "LayerNormFwd", ["x", "weight", "bias"], {}),
    (F.gemma_rms_norm, "GemmaRMSNormFwd", ["x", "weight"], {}),
    (F.group_rms_norm, "GroupRMSNormFwd", ["x", "weight"], {"groups": 4}),
    (F.rms_norm_quant, "RMSNormQuantFwd", ["x", "weight"], {}),
    (F.layer_norm_quant, "LayerNormQuantFwd", ["x", "weight", "bias"], {}),
    (F.qk_norm, "QKNormFwd", ["q", "k", "q_weight", "k_weight"], {}),
    (F.ada_layer_norm, "AdaLayerNormFwd", ["x", "shift", "scale"], {"batch": 3}),
    (F.weight_norm, "WeightNormFwd", ["v", "g"], {}),
    (F.l2_norm, "L2NormFwd", ["x"], {}),
    (F.l1_norm, "L1NormFwd", ["x"], {}),
]


def make(op_name, params, dtype="bf16", shape=(6, 256)):
    op = REGISTRY.op(op_name)
    w = Workload(op_name, "t", "t", dtype, {"x": list(shape)}, params=params)
    return op, w, op.make_inputs(w, InputRNG("cpu", seed=5))


@pytest.mark.parametrize("fn, op_name, order, params", CASES, ids=[c[1] for c in CASES])
@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_function_matches_the_reference(fn, op_name, order, params, dtype):
    op, w, inputs = make(op_name, params, dtype)
    expected = op.reference({k: v.clone() for k, v in inputs.items()}, w)
    out = fn(*(inputs[n] for n in order), **params)
    outs = out if isinstance(out, tuple) else (out,)
    refs = expected if isinstance(expected, tuple) else (expected,)
    for o, r in zip(outs, refs):
        assert compare_tensors(o, r, op.tolerance(o.dtype)).ok


def test_fused_add_updates_residual_in_place_and_returns_the_norm():
    op, w, inputs = make("FusedAddRMSNormFwd", {})
    normed_ref, residual_ref = op.reference({k: v.clone() for k, v in inputs.items()}, w)
    residual = inputs["residual"]
    out = F.fused_add_rms_norm(inputs["x"], residual, inputs["weight"])
    assert compare_tensors(residual, residual_ref, op.tolerance(residual.dtype)).ok
    assert compare_tensors(out, normed_ref, op.tolerance(out.dtype)).ok


def test_works_inside_torch_compile():
    op, w, inputs = make("RMSNormFwd", {})

    def block(x, weight, residual):
        y = F.fused_add_rms_norm(x, residual, weight, 1e-6)
        return F.rms_norm(y * 2, weight)

    residual = torch.randn_like(inputs["x"])
    eager = block(inputs["x"], inputs["weight"], residual.clone())
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")(inputs["x"], inputs["weight"], residual.clone())
    torch.testing.assert_close(compiled, eager)


@pytest.mark.parametrize("fn, args", [
    (F.rms_norm, (torch.randn(4, 64), torch.randn(64))),
    (F.fused_add_rms_norm, (torch.randn(4, 64), torch.randn(4, 64), torch.randn(64))),
    (F.layer_norm_quant, (torch.randn(4, 64), torch.randn(64), torch.randn(64))),
    (F.qk_norm, (torch.randn(4, 64), torch.randn(4, 64), torch.randn(64), torch.randn(64))),
], ids=["rms_norm", "fused_add_rms_norm", "layer_norm_quant", "qk_norm"])
def test_opcheck(fn, args):
    """torch's own checks of a custom op: schema (mutations declared), fake tensors, autograd
    registration, dispatch under AOT."""
    torch.library.opcheck(fn, args)


@pytest.mark.parametrize("call, message", [
    (lambda: F.rms_norm(torch.randn(4, 64), torch.randn(63)), "weight must have shape [64] (given x [4, 64]), got [63]"),
    (lambda: F.rms_norm(torch.randn(4, 64), torch.randn(64, dtype=torch.float16)), "weight must be torch.float32"),
    (lambda: F.rms_norm(torch.ones(4, 64, dtype=torch.int32), torch.randn(64)), "must be a bf16, f16 or f32 tensor"),
    (lambda: F.group_rms_norm(torch.randn(4, 64), torch.randn(64), 1e-6, 5), "param 'groups' = 5 must be >= 1 and divide"),
    (lambda: F.ada_layer_norm(torch.randn(3, 64), torch.randn(2, 64), torch.randn(2, 64), 1e-6, 2), "param 'batch' = 2"),
])
def test_bad_input_says_what_is_expected(call, message):
    with pytest.raises(ValueError) as err:
        call()
    assert message in str(err.value)


def test_cpu_calls_run_the_torch_formulation():
    _, _, inputs = make("RMSNormFwd", {})
    assert F.rms_norm.kernel_for(inputs["x"], inputs["weight"]) is None


def test_layout_problems_are_named():
    from npuops.kernels import layout_problem

    x = torch.randn(8, 64)
    assert layout_problem(x) is None
    assert "contiguous" in layout_problem(x.t())
    assert "16-byte boundary" in layout_problem(x.view(-1)[1:])


@pytest.mark.gpu
@pytest.mark.parametrize("fn, op_name, order, params", CASES, ids=[c[1] for c in CASES])
def test_cuda_calls_run_our_kernel_and_match_the_reference(fn, op_name, order, params):
    op, w, inputs = make(op_name, params, "bf16", shape=(33, 4096))
    inputs = {k: v.cuda() for k, v in inputs.items()}
    expected = op.reference({k: v.clone() for k, v in inputs.items()}, w)
    out = fn(*(inputs[n] for n in order), **params)
    outs = out if isinstance(out, tuple) else (out,)
    refs = expected if isinstance(expected, tuple) else (expected,)
    for o, r in zip(outs, refs):
        assert o.is_cuda and compare_tensors(o, r, op.tolerance(o.dtype)).ok
    assert fn.kernel_for(*(inputs[n] for n in order), **params) is not None, "the torch path ran, not ours"
