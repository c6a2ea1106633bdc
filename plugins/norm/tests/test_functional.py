"""The functions model code calls (npuops_norm.rms_norm, ...): checked against the ops' references
and torch's functions, with torch's arguments, inside torch.compile, under autograd, and on bad
input."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as TF

import npuops_norm as F
from npuops import InputRNG, Workload, compare_tensors
from npuops.functional import coverage, reset_coverage
from npuops.registry import load_registry

REGISTRY = load_registry(strict=True)


def _rms(x, weight, eps=1e-6):
    return F.rms_norm(x, x.shape[-1:], weight, eps)


def _layer(x, weight, bias, eps=1e-5):
    return F.layer_norm(x, [x.shape[-1]], weight, bias, eps)


def _l2(x, eps=1e-12):
    return F.normalize(x, 2.0, -1, eps)


def _l1(x, eps=1e-12):
    return F.normalize(x, p=1, dim=-1, eps=eps)


# function, op, argument order (the op's input names), extra scalar args
CASES = [
    (_rms, "RMSNormFwd", ["x", "weight"], {}),
    (_layer, "LayerNormFwd", ["x", "weight", "bias"], {}),
    (F.gemma_rms_norm, "GemmaRMSNormFwd", ["x", "weight"], {}),
    (F.group_rms_norm, "GroupRMSNormFwd", ["x", "weight"], {"groups": 4}),
    (F.rms_norm_quant, "RMSNormQuantFwd", ["x", "weight"], {}),
    (F.layer_norm_quant, "LayerNormQuantFwd", ["x", "weight", "bias"], {}),
    (F.qk_norm, "QKNormFwd", ["q", "k", "q_weight", "k_weight"], {}),
    (F.ada_layer_norm, "AdaLayerNormFwd", ["x", "shift", "scale"], {"batch": 3}),
    (F.weight_norm, "WeightNormFwd", ["v", "g"], {}),
    (_l2, "L2NormFwd", ["x"], {}),
    (_l1, "L1NormFwd", ["x"], {}),
]


def make(op_name, params, dtype="bf16", shape=(6, 256)):
    op = REGISTRY.op(op_name)
    w = Workload(op_name, "t", "t", dtype, {"x": list(shape)}, params=params)
    return op, w, op.make_inputs(w, InputRNG("cpu", seed=5))


def assert_matches_reference(op, w, inputs, out, on_cuda=False):
    expected = op.reference({k: v.clone() for k, v in inputs.items()}, w)
    outs = out if isinstance(out, tuple) else (out,)
    refs = expected if isinstance(expected, tuple) else (expected,)
    assert len(outs) == len(refs)
    for o, r in zip(outs, refs):
        assert o.is_cuda == on_cuda and compare_tensors(o, r, op.tolerance(o.dtype)).ok


@pytest.mark.parametrize("fn, op_name, order, params", CASES, ids=[c[1] for c in CASES])
@pytest.mark.parametrize("dtype", ["bf16", "f32", "f64"])
def test_function_matches_the_reference(fn, op_name, order, params, dtype):
    op, w, inputs = make(op_name, params, dtype)
    out = fn(*(inputs[n].clone() for n in order), **params)
    assert_matches_reference(op, w, inputs, out)


@pytest.mark.parametrize("call", [
    lambda x, w: (F.rms_norm(x, (8, 16), w.view(8, 16)), TF.rms_norm(x, (8, 16), w.view(8, 16))),
    lambda x, w: (F.rms_norm(x, [16]), TF.rms_norm(x, [16])),
    lambda x, w: (F.rms_norm(x, (16,), w[:16]), TF.rms_norm(x, (16,), w[:16])),
    lambda x, w: (F.rms_norm(x.transpose(0, 1), (16,), w[:16]), TF.rms_norm(x.transpose(0, 1), (16,), w[:16])),
    lambda x, w: (F.rms_norm(x.half(), (16,), w[:16]), TF.rms_norm(x.half(), (16,), w[:16])),
    lambda x, w: (F.layer_norm(x, (16,)), TF.layer_norm(x, (16,))),
    lambda x, w: (F.layer_norm(x, (8, 16), w.view(8, 16), w.view(8, 16), 1e-3),
                  TF.layer_norm(x, (8, 16), w.view(8, 16), w.view(8, 16), 1e-3)),
    lambda x, w: (F.layer_norm(x, (16,), w[:16]), TF.layer_norm(x, (16,), w[:16])),
    lambda x, w: (F.normalize(x), TF.normalize(x)),
    lambda x, w: (F.normalize(x, 3.0, 0), TF.normalize(x, 3.0, 0)),
    lambda x, w: (F.normalize(x, 1, -1, 1e-3), TF.normalize(x, 1, -1, 1e-3)),
    lambda x, w: (F.normalize(x, 2, [0, 2]), TF.normalize(x, 2, [0, 2])),
    lambda x, w: (F.normalize(x, 1, (-1, 0, 1)), TF.normalize(x, 1, (-1, 0, 1))),
    lambda x, w: (F.rms_norm(x[:0], (16,), w[:16]), TF.rms_norm(x[:0], (16,), w[:16])),
], ids=["two-dims", "no-weight", "eps-none", "strided", "f16-with-f32-weight", "layer-no-affine", "layer-two-dims",
        "layer-no-bias", "normalize-default", "normalize-p3-dim0", "normalize-l1", "normalize-dims-list",
        "normalize-dims-tuple", "empty"])
def test_drop_ins_take_torch_arguments(call):
    x, w = torch.randn(4, 8, 16, dtype=torch.float64).float(), torch.randn(128)
    ours, theirs = call(x, w)
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    torch.testing.assert_close(ours, theirs)


@pytest.mark.parametrize("call", [
    lambda: F.rms_norm(torch.randn(4, 64), (32,), torch.randn(32, 2)),
    lambda: F.layer_norm(torch.randn(4, 64), (64,), torch.randn(63), torch.randn(64)),
    lambda: F.normalize(torch.randn(4, 64), 2, 5),
], ids=["rms-weight-shape", "layer-weight-shape", "normalize-dim"])
def test_drop_ins_raise_where_torch_raises(call):
    with pytest.raises(Exception) as ours:
        call()
    assert not isinstance(ours.value, AssertionError)


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
        return F.rms_norm(y * 2, (y.shape[-1],), weight)

    residual = torch.randn_like(inputs["x"])
    eager = block(inputs["x"], inputs["weight"], residual.clone())
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")(inputs["x"], inputs["weight"], residual.clone())
    torch.testing.assert_close(compiled, eager)


def _grads(fn, inputs):
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    out = out if isinstance(out, tuple) else (out,)
    weights = [torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view(o.shape) for o in out]
    sum((o * g).sum() for o, g in zip(out, weights)).backward()
    return [t.grad for t in leaves]


@pytest.mark.parametrize("ours, theirs, shapes", [
    (lambda x, w: F.rms_norm(x, (32,), w), lambda x, w: TF.rms_norm(x, (32,), w), [(5, 32), (32,)]),
    (lambda x, w, b: F.layer_norm(x, (32,), w, b), lambda x, w, b: TF.layer_norm(x, (32,), w, b),
     [(2, 5, 32), (32,), (32,)]),
    (lambda x: F.normalize(x, dim=-1), lambda x: TF.normalize(x, dim=-1), [(5, 32)]),
    (lambda x, w: F.gemma_rms_norm(x, w), lambda x, w: TF.rms_norm(x, (32,), 1 + w, 1e-6), [(5, 32), (32,)]),
    (lambda q, k, wq, wk: F.qk_norm(q, k, wq, wk),
     lambda q, k, wq, wk: (TF.rms_norm(q, (32,), wq, 1e-6), TF.rms_norm(k, (32,), wk, 1e-6)),
     [(5, 32), (5, 32), (32,), (32,)]),
], ids=["rms_norm", "layer_norm", "normalize", "gemma_rms_norm", "qk_norm"])
def test_gradients_match_torch(ours, theirs, shapes):
    inputs = [torch.randn(s, dtype=torch.float32) for s in shapes]
    for got, want in zip(_grads(ours, inputs), _grads(theirs, inputs)):
        torch.testing.assert_close(got, want)


def test_gradcheck_through_the_custom_op():
    x, w = torch.randn(3, 16, dtype=torch.float64, requires_grad=True), torch.randn(16, dtype=torch.float64,
                                                                                    requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: F.rms_norm(x, (16,), w, 1e-6), (x, w))


def test_gradient_through_an_in_place_op_runs_torchs_formulation():
    x, residual, w = torch.randn(4, 32, requires_grad=True), torch.randn(4, 32), torch.randn(32)
    reset_coverage()
    F.fused_add_rms_norm(x, residual, w).sum().backward()
    assert x.grad is not None and coverage()["fused_add_rms_norm"]["why"] == {"gradient through an in-place op": 1}


@pytest.mark.parametrize("fn, args", [
    (F.functional._rms_norm, (torch.randn(4, 64), torch.randn(64))),
    (F.fused_add_rms_norm, (torch.randn(4, 64), torch.randn(4, 64), torch.randn(64))),
    (F.layer_norm_quant, (torch.randn(4, 64), torch.randn(64), torch.randn(64))),
    (F.qk_norm, (torch.randn(4, 64), torch.randn(4, 64), torch.randn(64), torch.randn(64))),
], ids=["rms_norm", "fused_add_rms_norm", "layer_norm_quant", "qk_norm"])
def test_opcheck(fn, args):
    """torch's own checks of a custom op: schema (mutations declared), fake tensors, autograd
    registration, dispatch under AOT."""
    torch.library.opcheck(fn.custom_op, args)


@pytest.mark.parametrize("call, message", [
    (lambda: F.gemma_rms_norm(torch.randn(4, 64), torch.randn(63)), "weight must have shape [64] (given x [4, 64]), got [63]"),
    (lambda: F.gemma_rms_norm(torch.randn(4, 64), torch.randn(64, dtype=torch.float16)), "weight must be torch.float32"),
    (lambda: F.group_rms_norm(torch.randn(4, 64), torch.randn(64), 1e-6, 5), "param 'groups' = 5 must be >= 1 and divide"),
    (lambda: F.ada_layer_norm(torch.randn(3, 64), torch.randn(2, 64), torch.randn(2, 64), 1e-6, 2), "param 'batch' = 2"),
    (lambda: F.gemma_rms_norm(torch.randn(4, 64), torch.randn(64, device="meta")), "is on meta but x is on cpu"),
])
def test_bad_input_says_what_is_expected(call, message):
    with pytest.raises(ValueError) as err:
        call()
    assert message in str(err.value)


def test_cpu_calls_run_the_torch_formulation_and_count_it():
    _, _, inputs = make("RMSNormFwd", {})
    assert F.functional._rms_norm.kernel_for(inputs["x"], inputs["weight"]) is None
    reset_coverage()
    _rms(inputs["x"], inputs["weight"])
    F.rms_norm(inputs["x"], (256,))
    assert coverage()["rms_norm"] == {"ours": 0, "torch": 2,
                                      "why": {"cpu device": 1, "no weight or not the trailing dims": 1}}


def test_normalize_over_several_dims_goes_to_our_op():
    """F.normalize takes a list of dims (the norm over all of them): ours hands it to the op, whose
    kernel takes dims 0 and 2 of a 3-D x (on the CPU, its torch formulation runs, counted)."""
    reset_coverage()
    x = torch.randn(4, 8, 16)
    F.normalize(x, 2.0, [0, 2])
    F.normalize(x, 1.0, (0, 2))
    with pytest.raises(TypeError, match="must be tuple of ints"):  # not ints: torch's function, which refuses them
        F.normalize(x, 2.0, [True, 2])
    assert coverage()["l2_norm"]["why"] == {"cpu device": 1} and coverage()["l1_norm"]["why"] == {"cpu device": 1}
    assert coverage()["normalize"]["torch"] == 1


def test_a_kernel_that_fails_to_launch_falls_back_to_torch_and_warns_once():
    fn = F.functional._rms_norm
    x, w = torch.randn(4, 64), torch.randn(64)
    fn(x, w)
    plan = fn._plan_for(fn._complete((x, w), {}))

    def broken(*inputs):
        raise RuntimeError("no such device function")

    plan.kernel, plan.launch, plan.reason = broken, broken, None
    reset_coverage()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first, second = fn(x, w), fn(x, w)
    torch.testing.assert_close(first, TF.rms_norm(x, (64,), w, 1e-6))
    torch.testing.assert_close(second, first)
    assert [str(c.message) for c in caught] == [
        "npuops: rms_norm: our kernel failed to launch (RuntimeError: no such device function); "
        "this call and others like it run torch's formulation"]
    assert coverage()["rms_norm"]["why"] == {"kernel failed to launch": 2}


def test_layout_problems_are_named():
    from npuops.kernels import layout_problem

    x = torch.randn(8, 64)
    assert layout_problem(x) is None
    assert "contiguous" in layout_problem(x.t())
    assert "16-byte boundary" in layout_problem(x.view(-1)[1:])


@pytest.mark.gpu
@pytest.mark.parametrize("fn, op_name, order, params", CASES, ids=[c[1] for c in CASES])
@pytest.mark.parametrize("rows", [1, 3, 33, 300])
def test_cuda_calls_run_our_kernel_and_match_the_reference(fn, op_name, order, params, rows):
    shape = (rows * 3 if op_name == "AdaLayerNormFwd" else rows, 4096)
    op, w, inputs = make(op_name, params, "bf16", shape=shape)
    inputs = {k: v.cuda() for k, v in inputs.items()}
    reset_coverage()
    out = fn(*(inputs[n].clone() for n in order), **params)
    assert_matches_reference(op, w, inputs, out, on_cuda=True)
    (counts,) = coverage().values()
    assert counts["ours"] == 1, f"the torch path ran, not ours: {counts}"


@pytest.mark.gpu
@pytest.mark.parametrize("p", [1.0, 2.0])
def test_cuda_normalize_over_dims_0_and_2_runs_our_kernel(p):
    """normalize over dims [0, 2] of a 3-D input (the catalog's L2NormFwd W1 form) on the GPU: our
    kernel, against the norm taken in float64."""
    x = torch.randn(4, 128, 512, device="cuda", dtype=torch.bfloat16)
    reset_coverage()
    out = F.normalize(x, p, [0, 2])
    expected = TF.normalize(x.double(), p, [0, 2]).to(x.dtype)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-2)  # outputs of 1/45 (p=2) to 1/1600: relative
    counts = coverage()["l2_norm" if p == 2 else "l1_norm"]
    assert counts["ours"] == 1, f"the torch path ran, not ours: {counts}"


@pytest.mark.gpu
def test_row_counts_share_a_build():
    """13 row counts: one kernel a row class (4), the classes the calls did not reach built behind
    them; counted once every build has ended (earlier tests' builds behind theirs too)."""
    from npuops.functional import built_kernels, finish_builds

    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    finish_builds()
    before = built_kernels()
    for rows in (1, 2, 5, 8, 9, 100, 132, 133, 200, 264, 265, 1000, 4099):
        x = torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16)
        torch.testing.assert_close(F.rms_norm(x, (4096,), w, 1e-6), TF.rms_norm(x, (4096,), w, 1e-6),
                                   atol=2e-2, rtol=2e-2)
    finish_builds()
    assert built_kernels() - before <= 4


def test_tensors_on_two_devices_are_named_by_the_drop_ins_too():
    x, w = torch.randn(4, 64), torch.randn(64)
    F.rms_norm(x, (64,), w)  # a CPU plan exists: a meta weight must not reuse it
    with pytest.raises(ValueError, match="weight is on meta but x is on cpu"):
        F.rms_norm(x, (64,), w.to("meta"))


@pytest.mark.parametrize("op_name", ["RMSNormFwd", "FusedAddRMSNormFwd", "LayerNormFwd", "GroupRMSNormFwd"])
def test_a_row_norm_names_a_workload_of_each_row_class_of_its_kernel(op_name):
    """What the functions build behind a key's first build: one workload a row class, all of the
    key's shared part, so that a call of another token count finds its kernel built."""
    op = REGISTRY.op(op_name)
    (ours,) = [i for i in REGISTRY.impls_for(op_name) if i.tier == "ours"]
    w = next(w for w in op.workloads if op.kernel_unsupported(w) is None and math.prod(w.shapes["x"][:-1]) > 1000)
    classes = list(ours.launch_classes(op, w))
    for other in classes:
        op.validate(other)
    keys = [ours.build_key(op, other) for other in classes]
    assert len({key.launch for key in keys}) == len(keys) == 4
    assert {key.shared for key in keys} == {ours.build_key(op, w).shared}


def test_no_row_classes_where_rows_are_not_the_kernels_alone():
    op = REGISTRY.op("AdaLayerNormFwd")  # rows split in samples: the row count is not free
    w = next(w for w in op.workloads if op.kernel_samples(w) > 1)
    assert list(op.kernel_launch_classes(w)) == []
