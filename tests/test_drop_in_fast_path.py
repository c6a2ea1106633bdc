"""The drop-ins' eager fast path (``npuops.functional.drop_in``): a call of a signature seen before
launches the kernel its first call ran, with none of the front's work; every other call runs the
front as written. On the CPU, plans get a stand-in kernel that counts its launches and computes
the op's formulation."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import npuops_norm
import npuops_pool
from npuops import functional


@pytest.fixture(params=["c", "python"])
def launches(request, monkeypatch):
    """Every plan made during the test launches a counting stand-in kernel on the CPU; the fronts'
    fast path in C (npuops._fastpath) and, as where it was not built, in Python."""
    if request.param == "python":
        monkeypatch.setattr(functional, "_fastpath", None)
        monkeypatch.setattr(functional, "fast_call", functional._fast_call)
        monkeypatch.setattr(functional, "signature", functional._signature)
    functional.forget_fast_paths()
    request.addfinalizer(functional.forget_fast_paths)
    monkeypatch.setattr(functional, "_warned", set())  # each test sees its own once-only warnings
    counted: list[str] = []
    made = functional._plan

    def plan_with_a_kernel(fn, described, devices, params):
        plan = made(fn, described, devices, params)
        if plan.launch is None and plan.reason == "cpu device":
            formulation, names = plan.formulation, plan.names

            def launch(*tensors):
                counted.append(fn.name)
                return formulation(**dict(zip(names, tensors)))

            plan.kernel, plan.launch, plan.reason = "stand-in", launch, None
        return plan

    monkeypatch.setattr(functional, "_plan", plan_with_a_kernel)
    for function in functional._functions:
        monkeypatch.setattr(function, "_plans", {})
    functional.reset_coverage()
    return counted


def test_a_repeated_signature_skips_the_front_and_gives_the_same_result(launches, monkeypatch):
    x, w = torch.randn(3, 64), torch.randn(64)
    first = npuops_norm.rms_norm(x, (64,), w, 1e-6)
    fronts = []
    monkeypatch.setattr(npuops_norm.functional, "_trailing", lambda *a: fronts.append(a) or (64,))
    again = npuops_norm.rms_norm(x, (64,), w, 1e-6)
    assert fronts == [] and launches == ["rms_norm", "rms_norm"]
    torch.testing.assert_close(again, first)
    torch.testing.assert_close(again, F.rms_norm(x, (64,), w, 1e-6))
    assert functional.coverage()["rms_norm"]["ours"] == 2


def test_the_fast_path_takes_new_tensors_of_the_same_signature(launches):
    w = torch.randn(32)
    for _ in range(3):
        x = torch.randn(5, 32)
        torch.testing.assert_close(npuops_norm.rms_norm(x, (32,), w, 1e-5), F.rms_norm(x, (32,), w, 1e-5))
    assert len(launches) == 3


def test_a_call_the_kernel_cannot_take_runs_the_front(launches):
    x, w = torch.randn(4, 64), torch.randn(64)
    npuops_norm.rms_norm(x, (64,), w, 1e-6)
    strided = torch.randn(64, 4).t()  # same shape, dtype and device; not contiguous
    torch.testing.assert_close(npuops_norm.rms_norm(strided, (64,), w, 1e-6), F.rms_norm(strided, (64,), w, 1e-6))
    assert launches == ["rms_norm"]
    assert functional.coverage()["rms_norm"]["why"] == {"non-contiguous or misaligned input": 1}


def test_a_signature_torch_ran_runs_the_front_at_once_the_next_time(launches, monkeypatch):
    """A call our ops do not take (normalize with p=3) goes to torch's function as it is; the
    next call of its signature runs the front without the fast path's Python work (the signature
    worked out, the front's kernel calls recorded), with keyword arguments as given."""
    x = torch.randn(4, 8, 16)
    first = npuops_norm.normalize(x, 3.0, [0, 2], eps=1e-12)
    worked_out = []
    made = functional.signature
    monkeypatch.setattr(functional, "signature", lambda *a: worked_out.append(a) or made(*a))
    for _ in range(2):
        torch.testing.assert_close(npuops_norm.normalize(x, 3.0, [0, 2], eps=1e-12), first)
    torch.testing.assert_close(first, F.normalize(x, 3.0, [0, 2], 1e-12))
    assert worked_out == [] and launches == []
    assert functional.coverage()["normalize"]["torch"] == 3
    torch.testing.assert_close(npuops_norm.normalize(x, 3.0, [0, 1], eps=1e-12), F.normalize(x, 3.0, [0, 1], 1e-12))
    assert len(worked_out) == 1  # another signature: worked out once


def test_a_front_by_layout_keeps_a_fast_call_per_layout(launches):
    """A front whose canonical form depends on its tensors' layouts (``by_layout``): tensors of one
    shape but other strides (here both contiguous: a size-1 dim's stride differs) run the front
    again; each layout's later calls take their own fast call."""
    fronts = []

    @functional.drop_in(by_layout=True)
    def front(x, weight):
        fronts.append(x.stride())
        return npuops_norm.functional._rms_norm(x, weight, 1e-6)

    w, x = torch.randn(8), torch.randn(4, 1, 8)
    other = torch.empty_strided(x.shape, (8, 1, 1)).copy_(x)
    for _ in range(2):
        for t in (x, other):
            torch.testing.assert_close(front(t, w), F.rms_norm(t, (8,), w, 1e-6))
    assert fronts == [x.stride(), other.stride()] and launches == ["rms_norm"] * 4


def test_a_front_s_context_joins_its_signature(launches):
    """A front that reads a global setting (``context``: the conv fronts read whether float32 may
    run in TF32) runs again when it changes; each value's later calls take their own fast call."""
    setting, fronts = [True], []

    @functional.drop_in(context=lambda: setting[0])
    def front(x, weight):
        fronts.append(setting[0])
        return npuops_norm.functional._rms_norm(x, weight, 1e-6)

    x, w = torch.randn(4, 8), torch.randn(8)
    for value in (True, True, False, False, True):
        setting[0] = value
        torch.testing.assert_close(front(x, w), F.rms_norm(x, (8,), w, 1e-6))
    assert fronts == [True, False] and launches == ["rms_norm"] * 5


def test_values_equal_in_python_but_not_to_torch_do_not_share_an_entry(launches):
    x = torch.randn(1, 2, 8, 8)
    npuops_pool.max_pool2d(x, (2, 2))
    with pytest.raises(TypeError):  # torch refuses a bool in an int[] argument; 1 == True in Python
        npuops_pool.max_pool2d(x, (True, 2))
    with pytest.raises(TypeError):
        npuops_pool.max_pool2d(x, (2.0, 2.0))
    torch.testing.assert_close(npuops_pool.max_pool2d(x, 2, ceil_mode=True), F.max_pool2d(x, 2, ceil_mode=True))


def test_keyword_arguments_lists_and_gradients_are_served(launches):
    x = torch.randn(2, 3, 9, 9)
    for _ in range(2):
        torch.testing.assert_close(npuops_pool.avg_pool2d(x, kernel_size=3, stride=2), F.avg_pool2d(x, 3, 2))
        torch.testing.assert_close(npuops_pool.avg_pool2d(x, [3, 3], [2, 2]), F.avg_pool2d(x, 3, 2))
    assert launches == ["avg_pool2d"] * 4
    leaf = x.clone().requires_grad_()
    npuops_pool.avg_pool2d(leaf, kernel_size=3, stride=2).sum().backward()
    expected = leaf.detach().clone().requires_grad_()
    F.avg_pool2d(expected, 3, 2).sum().backward()
    torch.testing.assert_close(leaf.grad, expected.grad)


def test_a_list_argument_takes_the_fast_path_by_its_items(launches, monkeypatch):
    """A list (``dim=[0, 2]``, a window as a list) keys a call by its items as they are at the call:
    the second call skips the front, and the same list with other items runs it again."""
    x, windows, window = torch.randn(2, 3, 9, 9), [], npuops_pool.functional._window
    monkeypatch.setattr(npuops_pool.functional, "_window", lambda *a: windows.append(list(a[2])) or window(*a))
    size = [3, 3]
    for _ in range(2):
        torch.testing.assert_close(npuops_pool.avg_pool2d(x, size, [2, 2]), F.avg_pool2d(x, 3, 2))
    size[1] = 2
    torch.testing.assert_close(npuops_pool.avg_pool2d(x, size, [2, 2]), F.avg_pool2d(x, [3, 2], 2))
    assert windows == [[3, 3], [3, 2]] and launches == ["avg_pool2d"] * 3


def test_a_front_that_reshapes_keeps_its_own_path(launches, monkeypatch):
    unbatched = torch.randn(3, 10, 10)  # the front adds a batch dim: its tensor is not the caller's
    for _ in range(2):
        torch.testing.assert_close(npuops_pool.max_pool2d(unbatched, 2), F.max_pool2d(unbatched, 2))
    assert launches == ["max_pool2d"] * 2


def test_a_kernel_failing_on_the_fast_path_falls_back_once_reported(launches):
    x, w = torch.randn(2, 16), torch.randn(16)
    npuops_norm.rms_norm(x, (16,), w, 1e-6)
    plan = next(iter(npuops_norm.functional._rms_norm._plans.values()))

    def broken(*tensors):
        raise RuntimeError("an illegal memory access")

    plan.launch = broken
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            torch.testing.assert_close(npuops_norm.rms_norm(x, (16,), w, 1e-6), F.rms_norm(x, (16,), w, 1e-6))
    assert [str(c.message) for c in caught if "failed to launch" in str(c.message)]
    assert functional.coverage()["rms_norm"]["why"] == {"kernel failed to launch": 2}
