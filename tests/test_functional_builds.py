"""The functions' builds: one per kernel key, a new launch class that never waits for its build
while a kernel of the same shared key can compute it, and the other launch classes built behind a
key's first build (npuops.functional._kernel)."""

from __future__ import annotations

import threading

import pytest
import torch

from npuops import KernelKey
from npuops import functional


class CountingImpl:
    """An implementation whose builds are recorded; ``hold`` keeps the named build running."""

    plugin, op, name = "test", "ToyOp", "ours"
    launch_classes = None

    def __init__(self, hold: str | None = None):
        self.built: list[str] = []
        self.hold, self.release = hold, threading.Event()

    def build_key(self, op, w):
        shared, launch = w.split(":")
        return KernelKey(shared, launch)

    def build(self, op, w, device):
        if w == self.hold:
            self.release.wait(10)
        self.built.append(w)
        return f"kernel {w}"


def test_a_new_launch_class_runs_a_stand_in_while_its_own_build_runs_behind():
    impl, cpu = CountingImpl(hold="a:big"), torch.device("cpu")
    assert functional._kernel(impl, None, "a:small", cpu, "toy") == ("kernel a:small", None, None)
    kernel, why, pending = functional._kernel(impl, None, "a:big", cpu, "toy")
    assert (kernel, why) == ("kernel a:small", None) and pending is not None
    assert functional._kernel(impl, None, "a:big", cpu, "toy")[0] == "kernel a:small"  # still building
    impl.release.set()
    assert functional._kernel(impl, None, "a:big", cpu, "toy", behind=False) == ("kernel a:big", None, None)
    assert impl.built == ["a:small", "a:big"]


def test_no_stand_in_across_shared_keys_and_one_build_per_key():
    impl, cpu = CountingImpl(), torch.device("cpu")
    functional._kernel(impl, None, "b:small", cpu, "toy")
    assert functional._kernel(impl, None, "c:small", cpu, "toy") == ("kernel c:small", None, None)
    functional._kernel(impl, None, "b:small", cpu, "toy")
    assert impl.built == ["b:small", "c:small"]


def test_a_failed_build_behind_keeps_the_stand_in():
    class FailingBig(CountingImpl):
        def build(self, op, w, device):
            if w.endswith(":big"):
                raise RuntimeError("ptxas: out of registers")
            return super().build(op, w, device)

    impl, cpu = FailingBig(), torch.device("cpu")
    functional._kernel(impl, None, "d:small", cpu, "toy")
    with pytest.warns(RuntimeWarning, match="out of registers.*another launch class keeps running these calls"):
        functional._kernel(impl, None, "d:big", cpu, "toy")
        assert functional._kernel(impl, None, "d:big", cpu, "toy", behind=False)[0] == "kernel d:small"


class ToyOp:
    def validate(self, w):
        if w.endswith(":invalid"):
            raise ValueError("not a toy workload")


def test_the_first_build_of_a_shared_key_builds_its_other_launch_classes_behind():
    class WithClasses(CountingImpl):
        def launch_classes(self, op, w):
            shared = w.split(":")[0]
            return [f"{shared}:{c}" for c in ("small", "mid", "big", "invalid")] + ["other:small"]

    impl, cpu = WithClasses(hold="f:big"), torch.device("cpu")
    assert functional._kernel(impl, ToyOp(), "f:mid", cpu, "toy") == ("kernel f:mid", None, None)
    assert not functional.finish_builds(timeout=0.2)  # f:big held
    assert functional._kernel(impl, ToyOp(), "f:big", cpu, "toy")[0] != "kernel f:big"  # a stand-in meanwhile
    impl.release.set()
    assert functional.finish_builds(timeout=10)
    # every class of f's shared part once, none of another shared part, none the op refuses
    assert sorted(impl.built) == ["f:big", "f:mid", "f:small"]
    assert functional._kernel(impl, ToyOp(), "f:small", cpu, "toy") == ("kernel f:small", None, None)
    assert functional._kernel(impl, ToyOp(), "f:big", cpu, "toy") == ("kernel f:big", None, None)
    assert sorted(impl.built) == ["f:big", "f:mid", "f:small"]



def test_a_graph_capture_runs_the_registered_callbacks_first(monkeypatch):
    """Device.capture_graph runs the callbacks registered with devices.before_graph_capture after
    its warm-up calls and before it captures; the functions register finish_builds (a build behind
    a call loads its kernel from its own thread, which CUDA refuses during another thread's
    capture)."""
    import contextlib
    from types import SimpleNamespace

    from npuops import devices

    assert functional.finish_builds in devices._before_capture
    events = []
    stream = SimpleNamespace(wait_stream=lambda other: None)
    api = SimpleNamespace(Stream=lambda: stream, current_stream=lambda: stream, stream=lambda s: contextlib.nullcontext(),
                          CUDAGraph=lambda: SimpleNamespace(replay=lambda: events.append("replay")),
                          graph=lambda g: contextlib.nullcontext(events.append("capture")))
    device = devices.AcceleratorDevice("fake", 0)
    device._module = api
    monkeypatch.setattr(devices, "_before_capture", [])
    devices.before_graph_capture(lambda: events.append("callback"))
    replay = device.capture_graph(lambda: events.append("call"))
    replay()
    assert events == ["call", "call", "callback", "capture", "call", "replay"]
