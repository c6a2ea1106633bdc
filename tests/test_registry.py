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


# -- precedence: the project's plugins keep their names whatever sorts first ----------------------

SHADOW = '''
import torch
from npuops import Implementation, Workload, hookimpl
from npuops_norm.ops.rms_norm import RMSNormFwd


class Shadow(RMSNormFwd):
    """The real op's schema; computes zeros."""

    family = "shadow"

    def torch_impl(self, w):
        return lambda x, weight=None, **_: torch.zeros_like(x)


@hookimpl(trylast=True)  # pluggy keeps trylast implementations first in its list
def npuops_ops():
    return [Shadow([Workload("RMSNormFwd", "S1", "s", "f32", {"x": [4, 8]})])]


@hookimpl(trylast=True)
def npuops_implementations(ops):
    zeros = lambda op, w, device: (lambda x, **_: torch.zeros_like(x))
    return [Implementation("RMSNormFwd", "torch_eager", "torch_eager", zeros),
            Implementation("MaxPool2dFwd", "shadow_ours", "ours", zeros),
            Implementation("MaxPool2dFwd", "shadow_fast", "open-source", zeros)]


@hookimpl(trylast=True)
def npuops_devices():
    from npuops.devices import CPUDevice
    return [CPUDevice()]
'''


def test_third_party_plugin_sorting_first_cannot_take_the_projects_names(plugins):
    plugins.install("npuops-shadow", "npuops_shadow", SHADOW, entry_name="aaa_shadow")
    registry = load_registry()
    assert registry.op("RMSNormFwd").family == "norm" and "RMSNormFwd" in registry.plugins["norm"].ops
    assert not registry.plugins["norm"].errors and not registry.plugins["baselines"].errors
    messages = [e.message for e in registry.errors if e.plugin == "aaa_shadow"]
    # Each refusal blames the third-party plugin and names the one that keeps the name.
    assert any("op 'RMSNormFwd' is already defined by plugin 'norm' (npuops-norm)" in m for m in messages)
    assert any("implementation 'torch_eager' of RMSNormFwd is already defined by plugin 'baselines'" in m for m in messages)
    assert any("device 'cpu' is already defined by plugin 'devices'" in m for m in messages)
    assert any("'shadow_ours' of MaxPool2dFwd: tier 'ours' of an op of plugin 'pool'" in m for m in messages)
    assert {e.plugin for e in registry.errors} == {"aaa_shadow"}
    # What it may add, it adds: another tier's implementation of the project's op.
    assert "shadow_fast" in [i.name for i in registry.impls_for("MaxPool2dFwd")]
    assert registry.implementation("RMSNormFwd", "torch_eager").plugin == "baselines"
    assert list(registry.plugins)[:6] == ["devices", "baselines", "conv", "norm", "pool", "topk"]


def test_our_functions_compute_what_the_project_defines_despite_a_shadowing_plugin(plugins):
    import subprocess
    import sys

    plugins.install("npuops-shadow", "npuops_shadow", SHADOW, entry_name="aaa_shadow")
    code = ("import torch, torch.nn.functional as F; from npuops_norm import rms_norm\n"
            "x = torch.randn(4, 8); w = torch.rand(8)\n"
            "print(torch.allclose(rms_norm(x, (8,), w), F.rms_norm(x, (8,), w, torch.finfo(x.dtype).eps)))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "True"


def test_a_second_distribution_cannot_take_a_plugin_name(plugins):
    plugins.install("npuops-impostor", "npuops_impostor", "raise RuntimeError('never imported')\n", entry_name="norm")
    registry = load_registry()
    assert registry.plugins["norm"].distribution == "npuops-norm" and registry.plugins["norm"].ops
    assert any("plugin name 'norm' is already taken by 'norm' (npuops-norm); npuops-impostor was not loaded" in e.message
               for e in registry.errors)


# -- isolation: nothing a plugin raises ends the process -----------------------------------------

EXITS_AT_IMPORT = '''
import argparse
parser = argparse.ArgumentParser(prog="their-tool")
parser.add_argument("--their-flag", required=True)
parser.parse_args([])  # what a module running its CLI at import does: SystemExit(2)
'''

EXITS_IN_HOOK = '''
import sys
from npuops import hookimpl

@hookimpl
def npuops_implementations(ops):
    sys.exit(3)
'''


def test_a_plugin_calling_sys_exit_is_contained(plugins):
    plugins.install("npuops-exits", "npuops_exits", EXITS_AT_IMPORT, entry_name="exits")
    plugins.install("npuops-exits-hook", "npuops_exits_hook", EXITS_IN_HOOK, entry_name="exits_hook")
    registry = load_registry()  # a SystemExit escaping here would end pytest's test as an error
    errors = {e.plugin: e for e in registry.errors}
    assert errors["exits"].stage == "import" and "SystemExit(2)" in errors["exits"].message
    assert "the following arguments are required: --their-flag" in errors["exits"].message
    assert errors["exits_hook"].stage == "npuops_implementations" and "SystemExit(3)" in errors["exits_hook"].message
    assert len(registry.ops) == 45


def test_a_plugin_calling_sys_exit_ends_neither_the_cli_nor_the_callers_process(plugins):
    import subprocess
    import sys

    plugins.install("npuops-exits", "npuops_exits", EXITS_AT_IMPORT, entry_name="exits")
    plugins.install("npuops-exits-hook", "npuops_exits_hook", EXITS_IN_HOOK, entry_name="exits_hook")
    cli = subprocess.run([sys.executable, "-m", "npuops.cli", "list", "--family", "pool"],
                         capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr
    assert "1 families, 8 ops" in cli.stdout and "plugin 'exits' failed in import: SystemExit(2)" in cli.stdout
    code = ("import torch; from npuops_norm import rms_norm\n"
            "rms_norm(torch.randn(2, 8), (8,), torch.ones(8))\n"
            "print('still here')\n")
    user = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=300)
    assert user.returncode == 0 and user.stdout.strip().endswith("still here"), user.stderr


def test_keyboard_interrupt_in_a_plugin_is_not_swallowed(plugins):
    plugins.install("npuops-ctrl-c", "npuops_ctrl_c", "raise KeyboardInterrupt\n", entry_name="ctrl_c")
    with pytest.raises(KeyboardInterrupt):
        load_registry()


def test_a_mistyped_disabled_name_is_warned_about(monkeypatch):
    monkeypatch.setenv("NPUOPS_DISABLE_PLUGINS", "cnov")
    with pytest.warns(RuntimeWarning, match="unknown plugin 'cnov'; did you mean 'conv'"):
        registry = load_registry()
    assert not any(p.disabled for p in registry.plugins.values())


MALFORMED = '''
from npuops import Device, Op, Workload, hookimpl


class Nameless(Op):
    """An op class that forgot its name and family."""


class Named(Op):
    name = "MalformedFwd"
    family = "malformed"
    required_tensors = ("x",)


class NoName(Device):
    pass


@hookimpl
def npuops_ops():
    return [Nameless(), "RMSNormFwd", Named([Workload("MalformedFwd", "M1", "m", "f32", {"x": [4]})])]


@hookimpl
def npuops_devices():
    return [NoName()]


@hookimpl
def npuops_implementations(ops):
    yield from ()  # a generator that raises part-way: none of its items is kept
    raise ValueError("half-way")


@hookimpl
def npuops_module_forwards():
    return None  # None counts as nothing
'''


def test_malformed_hook_results_are_refused_item_by_item_and_the_rest_loads(plugins):
    """What the hookspecs promise: each item of the wrong type or without a name is refused with
    an error naming the plugin and hook, the plugin's other items are kept, a hook that raises
    contributes nothing, a hook returning None contributes nothing without error."""
    plugins.install("npuops-malformed", "npuops_malformed", MALFORMED, entry_name="malformed")
    registry = load_registry()
    errors = [(e.plugin, e.stage, e.message) for e in registry.errors]
    assert {plugin for plugin, _, _ in errors} == {"malformed"}
    assert ("malformed", "npuops_ops", "Nameless has no name (a non-empty string); got None") in errors
    assert ("malformed", "npuops_ops", "returned str, not an Op") in errors
    assert ("malformed", "npuops_devices", "NoName has no name (a non-empty string); got ''") in errors
    assert any(stage == "npuops_implementations" and "half-way" in message for _, stage, message in errors)
    assert len(errors) == 4  # npuops_module_forwards returned None: no error
    assert registry.plugins["malformed"].ops == ["MalformedFwd"] and registry.op("MalformedFwd").family == "malformed"
    assert registry.plugins["malformed"].devices == [] and "" not in registry.devices
    assert len(registry.ops) == 46 and registry.impls_for("RMSNormFwd")
    assert [plugin for plugin, _ in registry.call_each("npuops_module_forwards")].count("malformed") == 0
