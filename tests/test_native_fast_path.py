"""The functions' fast path in C (``npuops._fastpath``): the keys the Python path makes, and launches
that call a kernel's host entry point with the right addresses, sizes and stream, return what the
Python launch returns, and hand every call they cannot take to the Python path; each launch test
twice, reading tensors through Python's attributes and through torch's C++ objects
(``npuops._torch_fast``, built here by ``npuops.native`` as a CUDA machine builds it).

Host entry points compiled here with the system's C compiler stand in for TileLang's host
libraries (``int call(tensors..., sizes..., stream)``): they compute on the CPU, so each result is
checked against torch."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import types

import npuops_norm
import pytest
import torch
import torch.nn.functional as F
from npuops import functional
from npuops.kernels import NativeLaunch
from npuops.native import load as load_torch_fast

if os.environ.get("NPUOPS_REQUIRE_FASTPATH"):  # CI: a C compiler is there, so the extension must have built
    from npuops import _fastpath
else:
    _fastpath = pytest.importorskip("npuops._fastpath", reason="the core was installed without a C compiler")

STREAM = 7  # the stream address the stand-in entry points insist on

ENTRIES = r"""
#include <math.h>
#include <stdint.h>
int twice(const float *x, float *y, int64_t n, void *stream) {
    for (int64_t i = 0; i < n; i++) y[i] = 2 * x[i];
    return stream == (void *)7 ? 0 : 1;
}
/* 32-bit sizes, two outputs: the second allocated with a shape of its own */
int around(const float *x, float *below, float *above, int32_t n, int32_t step, void *stream) {
    for (int32_t i = 0; i < n; i++) { below[i] = x[i] - step; above[i] = x[i] + step; }
    return stream == (void *)7 ? 0 : 1;
}
int rms(const float *x, const float *w, float *y, int64_t rows, int64_t cols, void *stream) {
    for (int64_t r = 0; r < rows; r++) {
        double sum = 0;
        for (int64_t c = 0; c < cols; c++) sum += (double)x[r * cols + c] * x[r * cols + c];
        double scale = 1 / sqrt(sum / cols + 1e-6);
        for (int64_t c = 0; c < cols; c++) y[r * cols + c] = (float)(x[r * cols + c] * scale * w[c]);
    }
    return stream == (void *)7 ? 0 : 1;
}
"""


@pytest.fixture(scope="module")
def entries(tmp_path_factory):
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("needs a C compiler for the stand-in host libraries")
    folder = tmp_path_factory.mktemp("entries")
    (folder / "entries.c").write_text(ENTRIES)
    subprocess.run([compiler, "-O1", "-shared", "-fPIC", "-o", str(folder / "entries.so"), str(folder / "entries.c"),
                    "-lm"], check=True)
    lib = ctypes.CDLL(str(folder / "entries.so"))
    return {name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in ("twice", "around", "rms")}


@pytest.fixture(scope="module")
def torch_fast():
    """The table of ``npuops._torch_fast``, built for the torch installed (CI: it must build)."""
    try:
        return load_torch_fast().api
    except Exception as exc:
        if os.environ.get("NPUOPS_REQUIRE_FASTPATH"):
            raise
        pytest.skip(f"npuops._torch_fast did not build here: {exc}")


@pytest.fixture(params=["python attributes", "torch C++"])
def reading(request):
    """The fast path reading tensors each way; Python's attributes again after the test."""
    if request.param == "torch C++":
        _fastpath.accelerate(request.getfixturevalue("torch_fast"))
    functional.forget_fast_paths()
    yield request.param
    _fastpath.accelerate(None)
    functional.forget_fast_paths()


def stream(index):
    assert index == 0
    return STREAM


def native(entry, slots, sizes, returns):
    return NativeLaunch(entry, slots, sizes, returns, torch.device("cpu", 0), stream)


class Fallback:
    """The Python fast call a Launch hands calls to: records them."""

    def __init__(self):
        self.calls = []

    def __call__(self, values):
        self.calls.append(values)
        return "python path"


def twice_launch(entries, n, plan=None, fallback=None):
    plan = plan or types.SimpleNamespace(launch=object())
    return _fastpath.Launch(fallback or Fallback(), plan, (1,), native(entries["twice"], (0, (0, None)), (n,), (1,)),
                            (1,), True)


def test_the_extension_is_the_one_the_functions_use():
    """Where it was built (so these tests run), the functions take the C path, not the Python one."""
    assert functional._fastpath is _fastpath and functional.fast_call is _fastpath.call


# -- keys ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("grad", [True, False])
@pytest.mark.parametrize("by_layout", [True, False])
def test_the_c_keys_are_the_python_keys(grad, by_layout):
    x, w = torch.randn(4, 8), torch.nn.Parameter(torch.randn(8))
    needs = torch.randn(4, 8, requires_grad=True)
    calls = [
        ((x, (8,), w, 1e-6), {}),
        ((x, [8], w), {"eps": None}),                     # a list: its items, marked as a list
        ((x.t(), (True, 2), 1, 1.0, "s", None), {}),      # bools and floats beside ints
        ((needs, (8,)), {}),                              # needs a gradient (when grad is on)
        ((), {"input": x, "weight": w}),
    ]
    with torch.set_grad_enabled(grad):
        for args, kwargs in calls:
            assert _fastpath.signature(args, kwargs, by_layout) == functional._signature(args, kwargs, by_layout)
        assert (_fastpath.signature((needs,), {}, by_layout) is None) == grad


@pytest.mark.parametrize("fast_call", [_fastpath.call, functional._fast_call], ids=["c", "python"])
def test_a_missing_or_unhashable_call_is_a_miss(fast_call):
    x, needs = torch.randn(3), torch.randn(3, requires_grad=True)
    assert fast_call({}, (x, 2), {}, False) is functional._MISS
    assert fast_call({}, (x, [2]), {}, False) is functional._MISS
    assert fast_call({(): None}, (x, {"a": 1}), {}, False) is functional._MISS  # unhashable
    filed = {functional._signature((x, 2), {}, False): lambda values: ("python", values),
             functional._signature((2,), {"input": x}, False): lambda values: ("by name", values)}
    assert fast_call(filed, (x, 2), {}, False) == ("python", (x, 2))
    assert fast_call(filed, (2,), {"input": x}, False) == ("by name", (2, x))
    assert fast_call(filed, (needs, 2), {}, False) is functional._MISS
    filed[functional._signature((x, [0, 2]), {}, False)] = lambda values: ("list", values)
    assert fast_call(filed, (x, [0, 2]), {}, False) == ("list", (x, [0, 2]))
    assert fast_call(filed, (x, (0, 2)), {}, False) is functional._MISS  # a tuple is not the list


@pytest.mark.parametrize("by_layout", [True, False])
def test_keys_read_through_torch_cpp_tell_what_the_python_keys_tell(torch_fast, by_layout):
    """Through torch's C++ objects a tensor's key is bytes, not (shape, dtype, device): two calls
    share a key exactly where their Python keys are equal (strides too, by layout), and a tensor
    that needs a gradient still makes none."""
    x = torch.randn(4, 8)
    calls = [(x, (8,), 1e-6), (torch.randn(4, 8), (8,), 1e-6), (x.t().contiguous(), (8,), 1e-6), (x.t(), (8,), 1e-6),
             (x.double(), (8,), 1e-6), (x.view(32), (8,), 1e-6), (x, (8,), 1e-5), (x, [8], 1e-6),
             (torch.randn(4, 8, 1), (8,), 1e-6)]
    python = [functional._signature(c, {}, by_layout) for c in calls]
    _fastpath.accelerate(torch_fast)
    try:
        assert _fastpath.accelerated()
        cpp = [_fastpath.signature(c, {}, by_layout) for c in calls]
        assert isinstance(cpp[0][0], bytes)
        for i in range(len(calls)):
            for j in range(len(calls)):
                assert (cpp[i] == cpp[j]) == (python[i] == python[j]), (i, j)
        # A sparse tensor's key is not the dense one's of its shape (the Python key's is), and a
        # tensor of many dims has one.
        dense = torch.randn(3, 3)
        assert _fastpath.signature((dense.to_sparse(),), {}, by_layout) != _fastpath.signature((dense,), {}, by_layout)
        assert isinstance(_fastpath.signature((torch.randn([1] * 40),), {}, by_layout)[0], bytes)
        needs = torch.randn(3, requires_grad=True)
        assert _fastpath.signature((needs,), {}, by_layout) is None
        with torch.no_grad():
            assert _fastpath.signature((needs,), {}, by_layout) is not None
    finally:
        _fastpath.accelerate(None)
    assert not _fastpath.accelerated() and _fastpath.signature(calls[0], {}, by_layout) == python[0]


# -- launches --------------------------------------------------------------------------------------
def test_a_launch_calls_the_entry_on_the_call_tensors(reading, entries):
    x = torch.randn(37)
    fallback = Fallback()
    launch = twice_launch(entries, 37, fallback=fallback)
    y = launch(("not a tensor", x))
    assert fallback.calls == [] and launch.launches == 1
    assert y is not x and y.shape == x.shape
    torch.testing.assert_close(y, 2 * x)


@pytest.mark.parametrize("shape", [(2, 8), (16, 1, 1), (1, 16, 1, 1), (2, 1, 8, 1, 1), (16,)], ids=str)
def test_two_outputs_and_32_bit_sizes(reading, entries, shape):
    """The second output is a new tensor of its own shape (made like a prototype: see the
    extension's prototype_of), contiguous whatever its dims of one, a new one each call."""
    x = torch.randn(16)
    slots = (0, (0, None), (shape, torch.float32))
    launch = _fastpath.Launch(Fallback(), types.SimpleNamespace(launch=None), (0,),
                              native(entries["around"], slots, (16, 3), (1, 2)), (1, 2), False)
    below, above = launch((x,))
    torch.testing.assert_close(below, x - 3)
    assert above.shape == shape and above.is_contiguous() and above.dtype == torch.float32
    torch.testing.assert_close(above.flatten(), x + 3)
    _, again = launch((x,))
    assert again.data_ptr() != above.data_ptr()


def test_a_new_output_of_no_dims(reading, entries):
    """A shape no one-element tensor expands to, (): the output is made by empty() instead."""
    x = torch.randn(1)
    launch = _fastpath.Launch(Fallback(), types.SimpleNamespace(launch=None), (0,),
                              native(entries["twice"], (0, ((), torch.float32)), (1,), (1,)), (1,), True)
    y = launch((x,))
    assert y.shape == () and y.item() == 2 * x.item()


@pytest.mark.parametrize("case", ["not contiguous", "not aligned", "plan replaced", "front recording", "launch failed"])
def test_what_a_launch_cannot_take_goes_to_the_python_path(reading, entries, case, monkeypatch):
    x = torch.randn(64)
    plan = types.SimpleNamespace(launch=object())
    fallback = Fallback()
    launch = twice_launch(entries, 32, plan, fallback)
    tensor = x[:32]
    if case == "not contiguous":
        tensor = x[::2]
    elif case == "not aligned":
        tensor = x[1:33]
    elif case == "plan replaced":
        plan.launch = None  # as a failed launch leaves it
    elif case == "front recording":
        monkeypatch.setattr(functional._front_calls, "recorder", [])
    else:
        launch = _fastpath.Launch(fallback, plan, (1,), NativeLaunch(entries["twice"], (0, (0, None)), (32,), (1,),
                                                                     torch.device("cpu", 0), lambda index: 8),
                                  (1,), True)
    assert launch((None, tensor)) == "python path"
    assert len(fallback.calls) == 1 and fallback.calls[0][1] is tensor and launch.launches == 0


def test_a_launch_and_its_plan_are_freed_together(entries):
    """A plan holds its launches (plan.natives) and each launch its plan: the collector frees both."""
    import gc
    import weakref

    class Plan:
        launch, natives = object(), []

    plan = Plan()
    plan.natives = [twice_launch(entries, 4, plan)]
    freed = weakref.ref(plan)
    del plan
    gc.collect()
    assert freed() is None
    with pytest.raises(RuntimeError, match="not made"):
        _fastpath.Launch.__new__(_fastpath.Launch)((None,))


# -- through a front and a function ---------------------------------------------------------------
@pytest.fixture
def rms_norm_plans(entries, monkeypatch):
    """rms_norm's plans get a Python launch (the formulation) and, as a compiled kernel's would, a
    NativeLaunch (the stand-in entry); yields the op function, its plans and fast calls fresh."""
    made = functional._plan

    def plan_with_native(fn, described, devices, params):
        plan = made(fn, described, devices, params)
        if plan.reason == "cpu device" and fn.name == "rms_norm":
            (_, shape, _), formulation = described[0], plan.formulation

            def launch(x, weight):
                return formulation(x=x, weight=weight)

            launch.native = native(entries["rms"], (0, 1, (0, None)), (shape[0], shape[1]), (2,))
            plan.kernel, plan.launch, plan.reason = "stand-in", launch, None
        return plan

    rms_norm = npuops_norm.functional._rms_norm
    monkeypatch.setattr(functional, "_plan", plan_with_native)
    monkeypatch.setattr(rms_norm, "_plans", {})
    functional.forget_fast_paths()
    functional.reset_coverage()
    yield rms_norm
    functional.forget_fast_paths()


def test_a_front_call_seen_before_runs_the_c_launch(reading, rms_norm_plans):
    """The first call runs the front and the Python launch, the ones after it the C launch; each
    result is torch's."""
    w = torch.randn(64)
    for _ in range(3):
        x = torch.randn(5, 64)
        torch.testing.assert_close(npuops_norm.rms_norm(x, (64,), w, 1e-6), F.rms_norm(x, (64,), w, 1e-6))
    (plan,) = rms_norm_plans._plans.values()
    # the front's launch, beside the one the function filed for its own direct calls
    assert plan.launches == 1 and sorted(n.launches for n in plan.natives) == [0, 2]
    assert functional.coverage()["rms_norm"]["ours"] == 3


def test_a_function_called_directly_runs_the_c_launch_from_its_second_call(reading, rms_norm_plans):
    """An op function called without a front (model code calling ``fused_add_rms_norm`` and the
    like): its first call of a signature runs the plan's launch, the later ones the C launch."""
    w = torch.randn(64)
    for _ in range(3):
        x = torch.randn(5, 64)
        torch.testing.assert_close(rms_norm_plans(x, w, 1e-6), F.rms_norm(x, (64,), w, 1e-6))
    (plan,) = rms_norm_plans._plans.values()
    assert plan.launches == 1 and [n.launches for n in plan.natives] == [2]
    needs = torch.randn(5, 64, requires_grad=True)  # a gradient: the custom op's path, not the launch
    torch.testing.assert_close(rms_norm_plans(needs, w, 1e-6), F.rms_norm(needs, (64,), w, 1e-6))
    assert [n.launches for n in plan.natives] == [2]


# -- npuops.native: loading the torch-aware reads ---------------------------------------------------
@pytest.fixture
def fresh_native(monkeypatch):
    from npuops import native

    monkeypatch.setattr(native, "state", {"loaded": False, "why_not": "not built yet"})
    monkeypatch.setattr(native, "_started", None)
    yield native
    _fastpath.accelerate(None)
    functional.forget_fast_paths()


def test_accelerate_hands_the_table_to_the_fast_path_and_forgets_its_calls(torch_fast, fresh_native):
    filed = {"a key of the old form": None}
    functional._fast_paths.append(filed)
    try:
        fresh_native.accelerate_behind()
        assert fresh_native.wait(120) and fresh_native.state == {"loaded": True, "why_not": None}
        assert _fastpath.accelerated() and filed == {}
        assert fresh_native.accelerate()  # once: the second call finds it loaded
    finally:
        functional._fast_paths.remove(filed)


def test_npuops_native_0_keeps_the_python_reads(fresh_native, monkeypatch):
    monkeypatch.setenv("NPUOPS_NATIVE", "0")
    fresh_native.accelerate_behind()
    assert fresh_native._started is None and fresh_native.wait(0)
    assert not fresh_native.accelerate() and fresh_native.state["why_not"] == "off (NPUOPS_NATIVE=0)"
    assert not _fastpath.accelerated()
