"""The channel norms as functions (npuops_norm.batch_norm, instance_norm, group_norm) and the
norms' gradients: forward, running statistics and ``loss.backward()`` against torch's functions
in fp32 (fresh random inputs, off-centre and wider than unit), a gradcheck in fp64, through the
backward ops; the same with our kernels built for TileLang's CPU target in place of the GPU's (the
functions' wiring of the kernels, checked without a GPU); and on a GPU (marker ``gpu``) our kernels,
forward and backward, against torch."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as TF

import npuops_norm as F
from npuops.functional import coverage, reset_coverage
from npuops.registry import load_registry

REGISTRY = load_registry(strict=True)


def _x(*shape, dtype=torch.float32, device="cpu"):
    return (torch.randn(shape, dtype=torch.float64) * 1.5 + 0.5).to(device=device, dtype=dtype)


def _per_channel(c, device="cpu", mean=0.0, std=1.0):
    return (torch.randn(c, dtype=torch.float64) * std + mean).float().to(device)


@dataclasses.dataclass
class Case:
    """A call of ours and torch's, on ``x`` and per-channel tensors (weight, bias, running mean and
    variance: [C]), the running ones updated in place by both."""

    name: str
    call: object  # (functions module, x, weight, bias, running_mean, running_var) -> y
    shape: tuple
    gradient_of: tuple = ("x", "weight", "bias")  # the tensors that require a gradient
    backward_function: str | None = None  # the function our backward runs, counted in coverage()


CASES = [
    Case("batch_norm-train", lambda f, x, w, b, rm, rv: f.batch_norm(x, rm, rv, w, b, True, 0.2, 1e-4), (4, 6, 5, 7),
         backward_function="batch_norm_backward"),
    Case("batch_norm-train-2d", lambda f, x, w, b, rm, rv: f.batch_norm(x, rm, rv, w, b, training=True), (9, 6),
         backward_function="batch_norm_backward"),
    Case("batch_norm-eval", lambda f, x, w, b, rm, rv: f.batch_norm(x, rm, rv, w, b), (4, 6, 5, 7)),
    Case("batch_norm-train-no-weight", lambda f, x, w, b, rm, rv: f.batch_norm(x, rm, rv, None, b, True), (4, 6, 35),
         ("x", "bias"), backward_function="batch_norm_backward"),
    Case("instance_norm", lambda f, x, w, b, rm, rv: f.instance_norm(x), (3, 6, 5, 7), ("x",),
         backward_function="instance_norm_backward"),
    Case("instance_norm-affine-running",
         lambda f, x, w, b, rm, rv: f.instance_norm(x, rm, rv, w, b, momentum=0.3), (3, 6, 35),
         backward_function="instance_norm_affine_backward"),
    Case("instance_norm-running-stats", lambda f, x, w, b, rm, rv: f.instance_norm(x, rm, rv, use_input_stats=False),
         (3, 6, 5, 7), ("x",)),
    Case("group_norm", lambda f, x, w, b, rm, rv: f.group_norm(x, 3), (4, 6, 5, 7), ("x",),
         backward_function="group_norm_backward"),
    Case("group_norm-affine", lambda f, x, w, b, rm, rv: f.group_norm(x, 2, w, b, 1e-3), (4, 6, 35),
         backward_function="group_norm_affine_backward"),
    Case("rms_norm", lambda f, x, w, b, rm, rv: f.rms_norm(x, x.shape[-1:], w[:x.shape[-1]], 1e-6), (4, 6, 7),
         ("x", "weight"), backward_function="rms_norm_backward"),
    Case("rms_norm-two-dims", lambda f, x, w, b, rm, rv: f.rms_norm(x, x.shape[-2:], w[:x[0].numel()].view(x[0].shape)),
         (4, 6, 7), ("x", "weight"), backward_function="rms_norm_backward"),
    Case("layer_norm", lambda f, x, w, b, rm, rv: f.layer_norm(x, x.shape[-1:], w[:x.shape[-1]], b[:x.shape[-1]]),
         (4, 6, 7), backward_function="layer_norm_backward"),
]


def _inputs(case, device="cpu", dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    # Per channel; the row norms take slices of the affine as wide as their rows.
    c = math.prod(case.shape[1:]) if case.name.startswith(("rms_norm", "layer_norm")) else case.shape[1]
    return {"x": _x(*case.shape, dtype=dtype, device=device), "weight": _per_channel(c, device, 1.0, 0.3),
            "bias": _per_channel(c, device, 0.0, 0.3), "running_mean": _per_channel(c, device, 0.5, 0.2)[:case.shape[1]],
            "running_var": (_per_channel(c, device, 0.0, 0.3).abs() + 1.5)[:case.shape[1]]}


def _run(case, functions, inputs, backward=True):
    """(y, the running statistics after the call, the gradients of ``case.gradient_of``)."""
    given = {k: v.clone() for k, v in inputs.items()}
    for name in case.gradient_of:
        given[name].requires_grad_()
    y = case.call(functions, given["x"], given["weight"], given["bias"], given["running_mean"], given["running_var"])
    grads = {}
    if backward:
        upstream = torch.randn(y.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        (y * upstream.to(y)).sum().backward()
        grads = {name: given[name].grad for name in case.gradient_of}
    return y.detach(), (given["running_mean"], given["running_var"]), grads


def _assert_same(ours, theirs, **tolerance):
    (y, running, grads), (want_y, want_running, want_grads) = ours, theirs
    assert y.shape == want_y.shape and y.dtype == want_y.dtype
    torch.testing.assert_close(y, want_y, **tolerance)
    torch.testing.assert_close(running, want_running, **tolerance)
    for name, got in grads.items():
        assert got is not None, f"no gradient of {name}"
        torch.testing.assert_close(got, want_grads[name], **tolerance, msg=lambda m, name=name: f"gradient of {name}: {m}")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_forward_running_statistics_and_gradients_match_torch(case):
    inputs = _inputs(case)
    reset_coverage()
    ours = _run(case, F, inputs)
    if case.backward_function:  # the gradient came through our backward function, not torch's derivative
        assert coverage()[case.backward_function]["torch"] == 1, coverage()
    _assert_same(ours, _run(case, TF, inputs))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_running_statistics_update_in_place_without_a_gradient(case):
    inputs = _inputs(case, seed=3)
    with torch.no_grad():
        _assert_same(_run(case, F, inputs, backward=False), _run(case, TF, inputs, backward=False))


@pytest.mark.parametrize("fn, make", [
    (lambda x, w, b: F.instance_norm(x, weight=w, bias=b), lambda: (_x(2, 3, 9), _per_channel(3), _per_channel(3))),
    (lambda x, w, b: F.group_norm(x, 3, w, b), lambda: (_x(2, 6, 4), _per_channel(6), _per_channel(6))),
    (lambda x: F.group_norm(x, 2), lambda: (_x(3, 4, 5),)),
    (lambda x, w: F.rms_norm(x, (8,), w), lambda: (_x(3, 8), _per_channel(8, mean=1.0))),
    (lambda x, w, b: F.layer_norm(x, (2, 4), w, b), lambda: (_x(3, 2, 4), _per_channel(8).view(2, 4),
                                                             _per_channel(8).view(2, 4))),
], ids=["instance_norm", "group_norm", "group_norm-no-affine", "rms_norm", "layer_norm"])
def test_gradcheck_in_float64(fn, make):
    torch.manual_seed(7)
    inputs = [t.double().requires_grad_() for t in make()]
    assert torch.autograd.gradcheck(fn, inputs)


def test_a_gradient_of_the_weight_alone():
    x, w, b = _x(4, 6, 5), _per_channel(6).requires_grad_(), _per_channel(6)
    F.group_norm(x, 3, w, b).pow(2).sum().backward()
    w_torch = w.detach().clone().requires_grad_()
    TF.group_norm(x, 3, w_torch, b).pow(2).sum().backward()
    torch.testing.assert_close(w.grad, w_torch.grad)


@pytest.mark.parametrize("call", [
    lambda f, x, w, b, rm, rv: f.batch_norm(x, None, None, w, b, True),
    lambda f, x, w, b, rm, rv: f.batch_norm(x, rm, rv, None, None, True),
    lambda f, x, w, b, rm, rv: f.batch_norm(x.double(), rm.double(), rv.double(), w.double(), b.double(), True),
    lambda f, x, w, b, rm, rv: f.batch_norm(x[:1, :, :1, :1], rm, rv, w, b, True),
    lambda f, x, w, b, rm, rv: f.batch_norm(x, rm, rv, w, b, True, eps=0.0),
    lambda f, x, w, b, rm, rv: f.batch_norm(x, rm, rv, w, b, False, eps=-1.0),
    lambda f, x, w, b, rm, rv: f.instance_norm(x, weight=w),
    lambda f, x, w, b, rm, rv: f.instance_norm(x[:, :, :1, :1]),
    lambda f, x, w, b, rm, rv: f.instance_norm(x[:, :, 0, 0]),
    lambda f, x, w, b, rm, rv: f.instance_norm(x, use_input_stats=False),
    lambda f, x, w, b, rm, rv: f.group_norm(x, 4, w, b),
    lambda f, x, w, b, rm, rv: f.group_norm(x, 3, w.half(), b.half()),
    lambda f, x, w, b, rm, rv: f.group_norm(x[:1, :3, :1, :1], 3),
    lambda f, x, w, b, rm, rv: f.group_norm(x[0, 0, 0], 1),
], ids=["bn-no-running", "bn-no-affine", "bn-f64", "bn-one-value", "bn-eps-0", "bn-eval-eps-negative",
        "in-half-affine", "in-one-element", "in-2d", "in-no-running-stats", "gn-groups-not-dividing", "gn-f16-weight",
        "gn-one-value", "gn-1d"])
def test_forms_our_ops_do_not_take_go_to_torch_alike(call):
    """Calls our ops do not take go to torch's function as they are: the same result and running
    statistics, or the same exception."""
    inputs = _inputs(CASES[0], seed=5)
    ours, theirs = ({k: v.clone() for k, v in inputs.items()} for _ in range(2))
    try:
        want = call(TF, *theirs.values())
    except Exception as exc:  # noqa: BLE001 - torch refuses it: so must we, alike
        with pytest.raises(type(exc)):
            call(F, *ours.values())
        return
    torch.testing.assert_close(call(F, *ours.values()), want)
    torch.testing.assert_close(ours, theirs)


def test_the_running_statistics_are_the_callers_tensors():
    x, w, b = _x(4, 6, 5), _per_channel(6), _per_channel(6)
    rm, rv = torch.zeros(6), torch.ones(6)
    mean, var = rm, rv
    F.batch_norm(x, rm, rv, w, b, True, 1.0)
    assert rm is mean and rv is var  # updated in place, momentum 1: the batch's own statistics
    torch.testing.assert_close(rm, x.mean((0, 2)))
    torch.testing.assert_close(rv, x.var((0, 2)))


def test_works_inside_torch_compile_with_a_gradient():
    x, w, b = _x(4, 6, 5).requires_grad_(), _per_channel(6).requires_grad_(), _per_channel(6)
    rm, rv = torch.zeros(6), torch.ones(6)

    def step(x, w, rm, rv):
        return F.group_norm(F.batch_norm(x, rm, rv, w, b, True), 3).square().sum()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    compiled(x, w, rm, rv).backward()
    got = (x.grad, w.grad, rm.clone(), rv.clone())
    x.grad = w.grad = None
    rm.zero_(), rv.fill_(1)
    step(x, w, rm, rv).backward()
    torch.testing.assert_close(got, (x.grad, w.grad, rm, rv))


@pytest.mark.parametrize("name, args", [
    ("_batch_norm_train", lambda: (_x(4, 6, 5), _per_channel(6), _per_channel(6), torch.zeros(6), torch.ones(6))),
    ("_batch_norm_eval", lambda: (_x(4, 6, 5), _per_channel(6), _per_channel(6), torch.zeros(6), torch.ones(6))),
    ("_group_norm_affine", lambda: (_x(4, 6, 5), _per_channel(6), _per_channel(6), 3)),
    ("_instance_norm_running", lambda: (_x(4, 6, 5), torch.zeros(6), torch.ones(6))),
], ids=["batch_norm_train", "batch_norm_eval", "group_norm", "instance_norm_running"])
def test_opcheck(name, args):
    """torch's checks of the custom ops: functional schemas (state returned, not mutated), fake
    tensors, the registered backward, dispatch under AOT."""
    functions = F.functional
    fn = {"_group_norm_affine": functions._group_norms[True],
          "_instance_norm_running": functions._instance_norms[False, True]}.get(name) or getattr(functions, name)
    torch.library.opcheck(fn.custom_op, args())


# -- our kernels, through the functions, built for TileLang's CPU target --------------------------
@pytest.fixture
def cpu_target_kernels(monkeypatch):
    """Plans of CPU calls run our kernel built for TileLang's CPU target, as CUDA calls run it built
    for the GPU (the row norms' forward kernels, warp-level code, do not build there: torch's)."""
    pytest.importorskip("tilelang")
    from npuops import functional as core
    from npuops.kernels import CPU_TARGET

    make_plan = core._plan

    def plan(fn, described, devices, params):
        made = make_plan(fn, described, devices, params)
        op = REGISTRY.op(fn.op)
        if made.reason != "cpu device" or not hasattr(op, "kernel_callable"):
            return made
        w = core._workload(fn, op, described, params)
        if op.kernel_unsupported(w) is not None:
            return made
        kernel = op.kernel_callable(w, torch.device("cpu"), target=CPU_TARGET)

        def launch(*tensors):
            return kernel(**dict(zip(made.names, tensors)))

        return dataclasses.replace(made, kernel=kernel, launch=launch, reason=None)

    monkeypatch.setattr(core, "_plan", plan)
    for function in core._functions:
        monkeypatch.setattr(function, "_plans", {})


KERNEL_CASES = [c for c in CASES if c.backward_function or c.name in ("batch_norm-eval", "instance_norm-running-stats")]


@pytest.mark.parametrize("case", KERNEL_CASES, ids=lambda c: c.name)
def test_our_kernels_run_forward_and_backward_through_the_functions(case, cpu_target_kernels):
    inputs = _inputs(case, seed=11)
    reset_coverage()
    ours = _run(case, F, inputs)
    ran = {name: counts["ours"] for name, counts in coverage().items()}
    backward = ran.pop(case.backward_function, None)
    (forward,) = ran.values()
    assert (forward, backward) == (0 if case.name.startswith(("rms", "layer")) else 1,
                                   1 if case.backward_function else None), coverage()
    _assert_same(ours, _run(case, TF, inputs), rtol=1e-4, atol=1e-4)


# -- on a GPU -------------------------------------------------------------------------------------
def _on_the_gpu(case):
    """``case`` at a size our GPU kernels are for: C = 48 (3 groups, or 2), rows of 256."""
    if case.name.startswith(("rms_norm", "layer_norm")):
        return dataclasses.replace(case, shape=(300, 4, 256))
    return dataclasses.replace(case, shape={4: (8, 48, 28, 28), 3: (4, 48, 1089), 2: (256, 48)}[len(case.shape)])


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_our_kernels_match_torch_forward_and_backward_on_the_gpu(case):
    """Against torch's CPU functions: its CUDA batch_norm's backward fails where the weight is None
    beside a bias that needs a gradient ("tensor does not have a device", torch 2.11)."""
    case = _on_the_gpu(case)
    inputs = _inputs(case, device="cuda", seed=13)
    reset_coverage()
    ours = _run(case, F, inputs)
    ran = coverage()
    assert all(counts["torch"] == 0 for counts in ran.values()), f"torch's path ran: {ran}"
    if case.backward_function:
        assert ran[case.backward_function]["ours"] == 1, ran
    y, running, grads = ours
    on_cpu = (y.cpu(), tuple(t.cpu() for t in running), {name: g.cpu() for name, g in grads.items()})
    _assert_same(on_cpu, _run(case, TF, {k: v.cpu() for k, v in inputs.items()}), rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mixed_precision_batch_norm_and_group_norm_run_ours_on_the_gpu(dtype):
    """16-bit activations beside f32 parameters and running statistics (autocast's batch norm).
    Judged by the float64 result: the gradient through two 16-bit norms is rounded in each
    implementation's own places (its batch norm backward subtracts terms of the gradient's scale,
    so an element near zero can part from torch's by more than a tolerance of its own), so ours
    may be no more than twice as far from the float64 result as torch's (f16 batch norm, f32
    group norm: torch's CUDA group_norm takes no f32 affine beside 16-bit x)."""
    x = _x(8, 64, 16, 16, dtype=dtype, device="cuda")
    w, b, rm, rv = (_per_channel(64, "cuda") for _ in range(4))
    rv = rv.abs() + 0.5
    reset_coverage()
    results = {}
    for functions in (F, TF, "float64"):
        wide = torch.float64 if functions == "float64" else None
        leaf, weight = x.clone().to(wide or dtype).requires_grad_(), w.clone().to(wide or w.dtype).requires_grad_()
        bias, mean, var = (t.to(wide or t.dtype) for t in (b, rm.clone(), rv.clone()))
        if functions == "float64":
            y = TF.group_norm(TF.batch_norm(leaf, mean, var, weight, bias, True), 8, weight, bias)
        elif functions is F:
            y = F.group_norm(F.batch_norm(leaf, mean, var, weight, bias, True), 8, weight, bias)
        else:
            h = TF.batch_norm(leaf, mean, var, weight, bias, True)
            y = TF.group_norm(h.float(), 8, weight, bias).to(dtype)
        y.double().square().sum().backward()
        results[functions] = (y, leaf.grad, weight.grad)
        if functions is F:
            assert all(counts["torch"] == 0 for counts in coverage().values()), coverage()
    for what, ours, theirs, exact in zip(("y", "input gradient", "weight gradient"), *results.values()):
        scale = exact.abs().max().item()
        ours_error, theirs_error = ((t.double() - exact).abs().max().item() for t in (ours, theirs))
        assert ours_error <= 2 * theirs_error + 1e-3 * scale, (
            f"{what}: max error vs the float64 result {ours_error:.3g}, torch's {theirs_error:.3g} (max |value| {scale:.3g})")
