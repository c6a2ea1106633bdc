"""Plugin discovery through real entry points, and what happens when a plugin is broken."""

from __future__ import annotations

import pytest

from npuops import PluginLoadError
from npuops.registry import load_registry

FAMILIES = {"norm": "npuops-norm", "conv": "npuops-conv", "pool": "npuops-pool", "topk": "npuops-topk"}


def test_installed_family_distributions_are_discovered():
    registry = load_registry(strict=True)
    for name, dist in FAMILIES.items():
        info = registry.plugins[name]
        assert info.distribution == dist and info.version and not info.errors
        assert info.ops and all(registry.op(op).family == name for op in info.ops)
    assert registry.plugins["example"].implementations == ["RMSNormFwd:hf_llama_rms_norm"]
    assert {"cpu", "cuda", "npu"} <= set(registry.devices)


BROKEN_IMPORT = "raise ImportError('libfoo.so: cannot open shared object file')\n"
BROKEN_HOOK = '''
from npuops import hookimpl

@hookimpl
def npuops_implementations(ops):
    raise RuntimeError("kaboom")
'''


def test_broken_plugins_are_reported_and_skipped(plugins):
    plugins.install("npuops-broken-import", "npuops_broken_import", BROKEN_IMPORT, entry_name="broken_import")
    plugins.install("npuops-broken-hook", "npuops_broken_hook", BROKEN_HOOK, entry_name="broken_hook")
    registry = load_registry()
    errors = {e.plugin: e for e in registry.errors}
    assert errors["broken_import"].stage == "import" and "libfoo.so" in errors["broken_import"].message
    assert errors["broken_hook"].stage == "npuops_implementations" and "kaboom" in errors["broken_hook"].message
    # Everything else still loads.
    assert len(registry.ops) == 45 and registry.impls_for("RMSNormFwd")
    with pytest.raises(PluginLoadError, match="broken_import"):
        load_registry(strict=True)


def test_disable_env_skips_plugins(monkeypatch):
    monkeypatch.setenv("NPUOPS_DISABLE_PLUGINS", "conv, topk")
    registry = load_registry()
    assert registry.plugins["conv"].disabled and registry.plugins["topk"].disabled
    assert registry.families == ["norm", "pool"]


def test_strict_env(plugins, monkeypatch):
    plugins.install("npuops-broken-import", "npuops_broken_import", BROKEN_IMPORT, entry_name="broken_import")
    monkeypatch.setenv("NPUOPS_STRICT", "1")
    with pytest.raises(PluginLoadError):
        load_registry()


DUPLICATE = '''
from npuops import hookimpl
from npuops_pool.plugin import npuops_ops as pool_ops

@hookimpl
def npuops_ops():
    return pool_ops()[:1]
'''


def test_a_plugin_cannot_redefine_another_plugins_op(plugins):
    # Plugins load in entry-point name order; the later definition is the one rejected.
    plugins.install("npuops-dup", "npuops_dup", DUPLICATE, entry_name="zz_dup")
    registry = load_registry()
    assert any(e.plugin == "zz_dup" and "already defined" in e.message for e in registry.errors)
    assert registry.op("AdaptiveAvgPool2dFwd").family == "pool"
