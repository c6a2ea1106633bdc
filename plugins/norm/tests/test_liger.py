"""Liger-Kernel alternatives: registered exactly when liger_kernel imports; on a GPU they go
through the same correctness gate as everything else."""

from __future__ import annotations

import sys
import types

import pytest

from npuops.check import check
from npuops.registry import load_registry
from npuops_norm.liger import BUILDS, liger_implementations


def test_registered_only_when_liger_imports(monkeypatch):
    ops = load_registry(strict=True).ops
    if "liger_kernel" not in sys.modules:
        try:
            import liger_kernel.ops.rms_norm  # noqa: F401
        except Exception:
            assert liger_implementations(ops) == []
    for name in ("liger_kernel", "liger_kernel.ops", "liger_kernel.ops.rms_norm"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    impls = liger_implementations(ops)
    assert {i.op for i in impls} == set(BUILDS) and all(i.tier == "open-source" and i.devices == ("cuda",) for i in impls)


@pytest.mark.gpu
def test_liger_passes_the_gate_where_installed():
    pytest.importorskip("liger_kernel")
    registry = load_registry(strict=True)
    device = registry.device("cuda")
    for name in BUILDS:
        op, impl = registry.op(name), registry.implementation(name, "liger")
        for w in op.workloads:
            result = check(op, w, impl.build(op, w, device.torch_device()), device, seed=2)
            assert result.ok, f"{w.key}: {result.detail}"
