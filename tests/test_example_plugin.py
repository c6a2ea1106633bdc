"""The third-party example plugin (examples/npuops-example), installed like any other."""

from __future__ import annotations

from npuops.check import check
from npuops.devices import CPUDevice
from npuops.registry import load_registry


def test_example_adds_an_implementation_to_another_plugins_op():
    registry = load_registry(strict=True)
    impl = registry.implementation("RMSNormFwd", "hf_llama_rms_norm")
    assert impl.tier == "open-source" and impl.plugin == "example"
    assert registry.plugins["example"].distribution == "npuops-example"


def test_example_implementation_passes_the_correctness_gate():
    registry = load_registry(strict=True)
    op = registry.op("RMSNormFwd")
    impl = registry.implementation("RMSNormFwd", "hf_llama_rms_norm")
    device = CPUDevice()
    for w in op.workloads:
        small = w.__class__(**{**w.__dict__, "shapes": {"x": [3, w.shapes["x"][-1]]}})
        assert check(op, small, impl.build(op, small, device.torch_device()), device, seed=1).ok, w.key
