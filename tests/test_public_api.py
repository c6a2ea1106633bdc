"""``npuops.__all__`` is the API plugins use: every plugin module (the families' and the example's
packages, their tests aside) imports from ``npuops`` only, and only names it exports. Checked on the
source with ``ast``, so a new import cannot slip past it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import npuops

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_MODULES = sorted([*ROOT.glob("plugins/*/npuops_*/**/*.py"), *ROOT.glob("examples/*/npuops_*/**/*.py")])


def npuops_uses(path: Path) -> list[tuple[int, str]]:
    """(line, what) for each use of npuops in a module: ``npuops.X`` for a name it imports or an
    attribute it reads, ``npuops.sub:X`` for an import from a submodule."""
    tree = ast.parse(path.read_text(), str(path))
    aliases = set()  # local names bound to the npuops module
    uses = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "npuops":
                uses += [(node.lineno, f"npuops.{a.name}") for a in node.names]
            elif node.module.startswith("npuops."):
                uses += [(node.lineno, f"{node.module}:{a.name}") for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "npuops":
                    aliases.add(a.asname or "npuops")
                elif a.name.startswith("npuops."):
                    uses.append((node.lineno, f"{a.name}:"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            uses.append((node.lineno, f"npuops.{node.attr}"))
    return uses


def test_there_are_plugin_modules_to_check():
    names = {p.parent.name for p in PLUGIN_MODULES}
    assert {"npuops_norm", "npuops_conv", "npuops_pool", "npuops_topk", "npuops_example"} <= names


@pytest.mark.parametrize("path", PLUGIN_MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_plugin_modules_import_only_what_npuops_exports(path):
    exported = set(npuops.__all__)
    bad = [f"line {line}: {what}" for line, what in npuops_uses(path)
           if ":" in what or what.removeprefix("npuops.") not in exported]
    assert not bad, f"{path.relative_to(ROOT)} uses npuops beyond npuops.__all__: {bad}"


def test_every_exported_name_resolves_and_none_is_private():
    assert len(set(npuops.__all__)) == len(npuops.__all__)
    assert not [name for name in npuops.__all__ if name.startswith("_")]
    for name in npuops.__all__:
        assert getattr(npuops, name) is not None, name
    assert set(npuops.__all__) <= set(dir(npuops))


def test_import_npuops_loads_neither_the_kernel_helpers_nor_tilelang():
    code = ("import sys, npuops\n"
            "print(sorted(m for m in ('npuops.kernels', 'npuops.functional', 'npuops.results', 'tilelang')"
            " if m in sys.modules))\n"
            "from npuops import KernelSpec, drop_in\n"
            "print('npuops.kernels' in sys.modules, 'tilelang' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "[]" and out[1] == "True False"
