"""Fixtures that install throwaway plugin distributions, found through real entry points.

A distribution is a ``<name>.dist-info`` folder (METADATA + entry_points.txt) next to its module on
a path entry: exactly what pip leaves in site-packages, so discovery goes through
``importlib.metadata`` as for any installed plugin. Worker processes and CLI subprocesses see it
through PYTHONPATH.
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

TOY_OP = '''
import torch
from npuops import Cost, Implementation, Op, Param, Workload, hookimpl


class ToyScaleFwd(Op):
    """y = alpha * x, in x's dtype."""

    name = "ToyScaleFwd"
    family = "toy"
    summary = "scale a tensor"
    required_tensors = ("x",)
    params = {"alpha": Param(2.0, "the factor", types=(float,))}

    def torch_impl(self, w):
        alpha = self.config(w)["alpha"]
        return lambda x: x * alpha

    def cost(self, w):
        n = w.shapes["x"][0] * w.dtype_of("x").itemsize
        return Cost(bytes=2 * n, flops=w.shapes["x"][0])


WORKLOADS = [
    Workload("ToyScaleFwd", "W1", "small", "f32", {"x": [1024]}),
    Workload("ToyScaleFwd", "W2", "medium", "f16", {"x": [4096]}, params={"alpha": 3.0}),
]


@hookimpl
def npuops_ops():
    return [ToyScaleFwd(WORKLOADS)]


def _ours(op, w, device):
    alpha = op.config(w)["alpha"]

    def scale(x):
        out = torch.empty_like(x)
        torch.mul(x, alpha, out=out)
        return out

    scale.config = {"threads": 128}
    return scale


def _half_written(op, w, device):
    def scale(x):
        out = torch.empty_like(x)
        out[: x.numel() // 2] = x[: x.numel() // 2] * op.config(w)["alpha"]
        return out

    return scale


def _crash(op, w, device):
    import os

    def scale(x):
        os._exit(7)

    return scale


def _variants(op, w):
    return [{"spin_s": 0.002}, {"spin_s": 0.0}, {"spin_s": 0.0, "writes": "half"}]


def _tunable(op, w, device, config=None):
    import time

    config = config or _variants(op, w)[0]

    def scale(x):
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < config["spin_s"]:
            pass
        out = torch.empty_like(x)
        n = x.numel() // 2 if config.get("writes") == "half" else x.numel()
        out[:n] = x[:n] * op.config(w)["alpha"]
        return out

    scale.config = config
    return scale


def _tunable_variants(op, w):
    environ = __import__("os").environ
    if "TOY_HANGING_VARIANT" in environ and w.id == "W1":
        return [{"spin_s": 0.0}, {"spin_s": 3600.0}]
    return _variants(op, w)[:2] if "TOY_BAD_IMPLS" not in environ else _variants(op, w)


@hookimpl
def npuops_implementations(ops):
    impls = [Implementation("ToyScaleFwd", "toy_ours", "ours", _ours),
             Implementation("ToyScaleFwd", "toy_tunable", "ours", _tunable, variants=_tunable_variants)]
    if "TOY_BAD_IMPLS" in __import__("os").environ:
        impls += [
            Implementation("ToyScaleFwd", "half_written", "ours", _half_written),
            Implementation("ToyScaleFwd", "crashes", "vendor", _crash),
        ]
    return impls
'''


class PluginInstaller:
    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch):
        self.root = root
        self.monkeypatch = monkeypatch
        monkeypatch.syspath_prepend(str(root))
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(root), *sys.path]))

    def install(self, dist: str, module: str, source: str, entry_name: str | None = None, version: str = "0.1.0") -> None:
        (self.root / f"{module}.py").write_text(textwrap.dedent(source))
        info = self.root / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text(f"[npuops]\n{entry_name or module} = {module}\n")
        sys.modules.pop(module, None)


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PluginInstaller:
    root = tmp_path / "site"
    root.mkdir()
    return PluginInstaller(root, monkeypatch)


@pytest.fixture
def toy(plugins: PluginInstaller) -> PluginInstaller:
    """The toy op plugin installed; real families disabled so runs stay small."""
    plugins.install("npuops-toy", "npuops_toy", TOY_OP, entry_name="toy")
    plugins.monkeypatch.setenv("NPUOPS_DISABLE_PLUGINS", "norm,conv,pool,topk,example")
    return plugins



@pytest.fixture
def killed_after_first_row():
    """``run(cmd, out)``: start the CLI command ``cmd`` writing results to ``out``, kill -9 its
    process group once a row is finished (or after 120 s), and wait for it."""
    import signal
    import subprocess
    import time

    def run(cmd, out: Path) -> None:
        proc = subprocess.Popen(cmd, env=os.environ.copy(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            if out.exists() and out.read_text().count('"status": "ok"') >= 1:
                break
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    return run
