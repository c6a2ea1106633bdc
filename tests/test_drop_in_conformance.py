"""Drop-in conformance (issue 42): PyTorch's OpInfo samples through our functions.

Every ``op_db`` entry named in ``ENTRIES`` (all its variants), every floating dtype torch supports
for it on the device, every sample of ``sample_inputs``: the same call goes to torch's op and to
ours, which must take it (not *refused*: ValueError, TypeError or RuntimeError where torch ran; not
an *internal* error: any other exception) and return what torch returns (not *wrong*: the same
structure, shape and dtype, values within ``assert_close``'s default tolerance for the dtype,
or no more than twice as far from the float64 result as torch's own; integer outputs such as
max-pool indices equal). The float64 result judges where two correct implementations part
beyond that tolerance: sums in another order, and on the GPU cuDNN's float32 convolutions in TF32
(its default, which our float32 kernels follow). A call torch raises on must raise in ours too.
``test_gradients_match_torch`` does the same for the gradients in float32 and float64.

Each test collects every failure and asserts at the end, listing the distinct ones. The CPU
variants run in CI; the ``cuda`` ones (marker ``gpu``) run on a GPU and also say how many samples
ran our kernel (``npuops.functional.coverage()`` where the core offers it): ``pytest -s`` prints
it, and it is recorded as the test's ``kernel_samples`` property (``--junitxml``).

``op_db`` is imported on first use, not at collection (it takes seconds).
"""

from __future__ import annotations

import functools
import importlib
import os
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import expecttest  # noqa: F401  (the test extra; op_db's test utilities need it)
import numpy  # noqa: F401  (the test extra; op_db's sample generators need it)
import pytest
import torch

# OpInfo name (every op_db entry of that name, whatever its variant) -> (our module, our function)
ENTRIES = {
    "nn.functional.rms_norm": ("npuops_norm", "rms_norm"),
    "nn.functional.layer_norm": ("npuops_norm", "layer_norm"),
    "nn.functional.normalize": ("npuops_norm", "normalize"),
    "nn.functional.batch_norm": ("npuops_norm", "batch_norm"),
    "nn.functional.instance_norm": ("npuops_norm", "instance_norm"),
    "nn.functional.group_norm": ("npuops_norm", "group_norm"),
    "nn.functional.max_pool1d": ("npuops_pool", "max_pool1d"),
    "nn.functional.max_pool2d": ("npuops_pool", "max_pool2d"),
    "nn.functional.max_pool3d": ("npuops_pool", "max_pool3d"),
    "nn.functional.avg_pool1d": ("npuops_pool", "avg_pool1d"),
    "nn.functional.avg_pool2d": ("npuops_pool", "avg_pool2d"),
    "nn.functional.avg_pool3d": ("npuops_pool", "avg_pool3d"),
    "nn.functional.adaptive_avg_pool2d": ("npuops_pool", "adaptive_avg_pool2d"),
    "nn.functional.adaptive_max_pool2d": ("npuops_pool", "adaptive_max_pool2d"),
    "nn.functional.conv1d": ("npuops_conv", "conv1d"),
    "nn.functional.conv2d": ("npuops_conv", "conv2d"),
    "nn.functional.conv3d": ("npuops_conv", "conv3d"),
    "nn.functional.conv_transpose2d": ("npuops_conv", "conv_transpose2d"),
}
FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
GRAD_DTYPES = (torch.float32, torch.float64)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
SHOWN = 20  # distinct failures listed per test
EXACT_ATOL = 1e-5  # assert_close's default atol for the half and single dtypes


def _short(name: str) -> str:
    return name.removeprefix("nn.functional.")


def _dtype_id(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# ---------------------------------------------------------------------------------------------
# op_db and our functions, loaded once


@functools.cache
def _op_db() -> tuple:
    frozen = torch.backends.flags_frozen()
    from torch.testing._internal.common_methods_invocations import op_db

    # common_utils' import freezes torch.backends flags for the whole process; this module only
    # reads samples, so give the rest of the session (benchmarks setting cudnn flags) them back.
    flags = getattr(torch.backends.flags_frozen, "__globals__", {})
    if not frozen and "__allow_nonbracketed_mutation_flag" in flags:
        flags["__allow_nonbracketed_mutation_flag"] = True
    return tuple(op_db)


def _opinfos(name: str) -> list:
    found = [info for info in _op_db() if info.name == name]
    if not found:
        pytest.fail(f"op_db has no entry named {name!r} (renamed in this torch?); entries with the same tail: "
                    f"{sorted({i.name for i in _op_db() if i.name.endswith(_short(name))})}")
    return found


def _ours(name: str) -> Callable:
    module_name, fn_name = ENTRIES[name]
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # a plugin mid-rewrite: say so rather than erroring the collection
        pytest.fail(f"import {module_name} failed: {type(exc).__name__}: {_first_line(exc)}")
    fn = getattr(module, fn_name, None)
    if fn is None:
        pytest.fail(f"{module_name} has no function {fn_name} (the drop-in for torch's {name})")
    return fn


# ---------------------------------------------------------------------------------------------
# describing samples and failures


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines() or [""])[0][:300]


def _fmt(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        flags = []
        if value.dim() == 4 and not value.is_contiguous() and value.is_contiguous(memory_format=torch.channels_last):
            flags.append("channels_last")
        elif value.dim() == 5 and not value.is_contiguous() and value.is_contiguous(
                memory_format=torch.channels_last_3d):
            flags.append("channels_last_3d")
        elif not value.is_contiguous():
            flags.append(f"strides={list(value.stride())}")
        if value.requires_grad:
            flags.append("grad")
        return f"T{list(value.shape)}:{_dtype_id(value.dtype)}" + (f"({', '.join(flags)})" if flags else "")
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        inner = ", ".join(_fmt(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _describe(sample) -> str:
    parts = [_fmt(sample.input), *(_fmt(a) for a in sample.args),
             *(f"{k}={_fmt(v)}" for k, v in sample.kwargs.items())]
    return f"({', '.join(parts)})"


@dataclass
class Tally:
    """Per test: samples run, skipped (no float output or torch's own backward failed), failures
    by kind, and for each distinct (kind, message) the count and the first sample."""

    label: str
    ran: int = 0
    skipped: int = 0
    kinds: Counter = field(default_factory=Counter)
    distinct: dict = field(default_factory=dict)
    kernel: str = ""

    def fail(self, kind: str, message: str, where: str, sample) -> None:
        """Failures whose messages differ only in numbers (sizes, counts, differences) are one;
        the first of each keeps its message and its sample (``where`` + the call's arguments)."""
        self.kinds[kind] += 1
        key = (kind, re.sub(r"\d+(\.\d+)?(e[+-]?\d+)?", "#", message))
        if key in self.distinct:
            count, first = self.distinct[key]
            self.distinct[key] = (count + 1, first)
        else:
            self.distinct[key] = (1, (message, where + _describe(sample)))

    def report(self) -> str:
        failed = sum(self.kinds.values())
        head = (f"{self.label}: {self.ran} samples, {self.ran - failed} ok, "
                + ", ".join(f"{self.kinds[k]} {k}" for k in ("refused", "wrong", "internal"))
                + (f", {self.skipped} skipped" if self.skipped else "") + (f"; {self.kernel}" if self.kernel else ""))
        lines = [head, f"{len(self.distinct)} distinct failures (kind xcount: first message  <- its sample):"]
        ranked = sorted(self.distinct.items(), key=lambda kv: ("refused wrong internal".split().index(kv[0][0]),
                                                              -kv[1][0]))
        for (kind, _), (count, (message, where)) in ranked[:SHOWN]:
            lines.append(f"  {kind} x{count}: {message}  <- {where}")
        if len(ranked) > SHOWN:
            lines.append(f"  ... and {len(ranked) - SHOWN} more distinct failures")
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# calling and comparing


def _call(fn: Callable, sample) -> Any:
    return fn(sample.input, *sample.args, **sample.kwargs)


def _classify(exc: Exception) -> tuple[str, str]:
    kind = "refused" if isinstance(exc, (ValueError, TypeError, RuntimeError)) else "internal"
    return kind, f"{type(exc).__name__}: {_first_line(exc)}"


def _leaves(value: Any) -> list:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def _in_float64(sample) -> Any:
    """``sample`` with its floating tensors in float64 (gradients required where they were)."""
    def cast(value):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.detach().to(torch.float64).requires_grad_(value.requires_grad)
        if isinstance(value, (tuple, list)):
            return type(value)(cast(v) for v in value)
        return value
    return SimpleNamespace(input=cast(sample.input), args=[cast(a) for a in sample.args],
                           kwargs={k: cast(v) for k, v in sample.kwargs.items()})


def _no_farther(got: torch.Tensor, expected: torch.Tensor, exact: torch.Tensor) -> str | None:
    """None where ``got`` is at most twice as far from the float64 result ``exact`` as torch's own
    ``expected`` is (max abs error; plus assert_close's default atol), NaN and inf where torch's
    are; else the two errors."""
    g, e, r = (t.detach().to(torch.float64) for t in (got, expected, exact))
    finite = torch.isfinite(g) & torch.isfinite(e) & torch.isfinite(r)
    if not torch.equal(torch.isfinite(g), torch.isfinite(e)) or not torch.equal(g[~finite], e[~finite]):
        return "NaN or inf where torch's result has none"
    if not finite.any():
        return None
    ours, theirs = (float((t - r)[finite].abs().max()) for t in (g, e))
    if ours <= 2 * theirs + EXACT_ATOL:
        return None
    return f"max error vs the float64 result {ours:.3g} (torch's {theirs:.3g})"


def _compare(got: Any, expected: Any, exact: Callable[[], Any] | None = None) -> str | None:
    """None if ``got`` is what torch returned, else what differs. Floating values pass within
    ``assert_close``'s default tolerance of torch's, or (given ``exact``: the float64 result, asked
    for only then) where :func:`_no_farther` from it than torch's."""
    want, have = _leaves(expected), _leaves(got)
    if isinstance(expected, (tuple, list)) != isinstance(got, (tuple, list)) or len(want) != len(have):
        return (f"returned {type(got).__name__} of {len(have)} (torch: {type(expected).__name__} "
                f"of {len(want)})")
    for i, (g, e) in enumerate(zip(have, want)):
        at = f"output {i}: " if len(want) > 1 else ""
        if not isinstance(e, torch.Tensor):
            if g != e:
                return f"{at}{g!r} (torch: {e!r})"
            continue
        if not isinstance(g, torch.Tensor):
            return f"{at}returned {type(g).__name__} (torch: a Tensor)"
        if g.shape != e.shape:
            return f"{at}shape {list(g.shape)} (torch: {list(e.shape)})"
        if g.dtype != e.dtype:
            return f"{at}dtype {g.dtype} (torch: {e.dtype})"
        if g.device != e.device:
            return f"{at}device {g.device} (torch: {e.device})"
        if not (e.is_floating_point() or e.is_complex()):
            if not torch.equal(g, e):
                differ = int((g != e).sum())
                return f"{at}{_dtype_id(e.dtype)} values (indices?) differ at {differ} of {e.numel()} positions"
            continue
        try:
            torch.testing.assert_close(g, e, equal_nan=True, check_stride=False)
        except AssertionError as exc:
            detail = "; ".join(line.strip() for line in str(exc).splitlines()[1:] if line.strip())
            farther = "no float64 result" if exact is None else _no_farther(g, e, _leaves(exact())[i])
            if farther:
                return f"{at}values not close: {detail}; {farther}"
    return None


# ---------------------------------------------------------------------------------------------
# kernel coverage (GPU runs): how many samples ran our kernel rather than torch's formulation


def _coverage_module():
    try:
        return importlib.import_module("npuops.functional")
    except Exception:
        return None


def _reset_coverage() -> None:
    module = _coverage_module()
    if module is not None and hasattr(module, "reset_coverage"):
        module.reset_coverage()


def _count(value: Any, keys: tuple[str, ...]) -> int | None:
    for key in keys:
        found = value.get(key) if isinstance(value, dict) else getattr(value, key, None)
        if isinstance(found, int):
            return found
        if isinstance(found, (dict, Counter)):
            return sum(v for v in found.values() if isinstance(v, int))
    return None


def _kernel_coverage() -> tuple[int | None, str]:
    """(calls that ran our kernel, a description) from ``npuops.functional.coverage()`` since the
    test's :func:`_reset_coverage`: every function it records then was reached from the function
    under test (``normalize`` runs through ``l2_norm``, a max pool through ``*_with_indices``).
    (None, why) where the core does not offer it."""
    module = _coverage_module()
    if module is None or not hasattr(module, "coverage"):
        return None, "npuops.functional.coverage() not available"
    try:
        table = dict(module.coverage())
    except Exception as exc:
        return None, f"coverage() raised {type(exc).__name__}: {_first_line(exc)}"
    ours = [_count(v, ("ours", "kernel", "our_kernel", "ran_kernel")) for v in table.values()]
    theirs = [_count(v, ("torch", "formulation", "fallback")) for v in table.values()]
    if not table or any(n is None for n in ours):
        return None, f"coverage(): {table!r}"[:500]
    fallback = sum(n for n in theirs if n is not None)
    return sum(ours), f"{sum(ours)} calls ran our kernel, {fallback} torch's formulation; {table!r}"[:800]


def _report_coverage(tally: Tally, device: str, record_property) -> None:
    kernel_calls, description = _kernel_coverage()
    record_property("kernel_samples", kernel_calls if kernel_calls is not None else "unknown")
    tally.kernel = f"our kernel: {description}"
    if device != "cpu":
        print(f"\n[kernel coverage] {tally.label}: {description}")


def _conclude(tally: Tally) -> None:
    """Fail with the tally's report where anything failed (or nothing ran). With
    NPUOPS_CONFORMANCE_REPORTS set, every test's report is also written there as it ends (a file a
    test): a run cut short keeps the reports of the tests that ended."""
    folder = os.environ.get("NPUOPS_CONFORMANCE_REPORTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / f"{re.sub(r'[^A-Za-z0-9._-]+', '_', tally.label)}.txt").write_text(tally.report() + "\n")
    if tally.kinds or not tally.ran:
        pytest.fail(tally.report(), pytrace=False)


# ---------------------------------------------------------------------------------------------
# the tests


@pytest.fixture
def quiet(device):
    """One CPU thread (the samples are tiny, and on a loaded machine two threads' hand-offs cost
    milliseconds a call) and a seeded RNG, restored afterwards. Samples are drawn with
    ``set_seed=False``: OpInfo's default reseeds every device's generator before each sample,
    which costs more than running it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[] if device == "cpu" else None, device_type=torch.device(device).type):
            torch.manual_seed(0)
            yield
    finally:
        torch.set_num_threads(threads)


def _samples(info, device: str, dtype: torch.dtype, requires_grad: bool):
    return info.sample_inputs(device, dtype, requires_grad=requires_grad, set_seed=False)


def test_every_mapped_entry_and_dtype_is_parametrized():
    """Each name in ENTRIES exists in op_db, and no floating dtype torch supports for it is left
    out of the parametrization below."""
    for name in ENTRIES:
        for info in _opinfos(name):
            for device in ("cpu", "cuda"):
                extra = {d for d in info.supported_dtypes(device) if d.is_floating_point} - set(FLOAT_DTYPES)
                assert not extra, f"{name} ({device}) supports {extra}, not in FLOAT_DTYPES"


def test_the_float64_judge_passes_rounding_and_fails_wrong_values():
    """float32 results of two TF32 convolutions (about 1e-4 relative error each, in other places):
    beyond assert_close's float32 tolerance of each other, as close to the float64 result."""
    exact = torch.linspace(-1, 1, 101, dtype=torch.float64)
    k = torch.arange(101)
    theirs = (exact * (1 + 1e-4 * torch.cos(37.0 * k))).float()
    ours = (exact * (1 + 1e-4 * torch.sin(50.0 * k))).float()
    assert _compare(ours, theirs) is not None
    assert _compare(ours, theirs, lambda: exact) is None
    wrong = ours.clone()
    wrong[7] += 0.25
    assert "max error vs the float64 result" in _compare(wrong, theirs, lambda: exact)
    nan = ours.clone()
    nan[3] = float("nan")
    assert "NaN" in _compare(nan, theirs, lambda: exact)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=_dtype_id)
@pytest.mark.parametrize("name", list(ENTRIES), ids=_short)
@pytest.mark.parametrize("device", DEVICES)
def test_samples_match_torch(device, name, dtype, record_property, quiet):
    infos = [info for info in _opinfos(name) if dtype in info.supported_dtypes(device)]
    if not infos:
        pytest.skip(f"torch does not support {name} in {dtype} on {device}")
    ours = _ours(name)
    tally = Tally(f"{_short(name)} {_dtype_id(dtype)} on {device}")
    _reset_coverage()
    for info in infos:
        where = _short(name) + (f"[{info.variant_test_name}]" if info.variant_test_name else "")
        for sample in _samples(info, device, dtype, False):
            tally.ran += 1
            try:
                expected = _call(info.op, sample)
            except Exception as exc:  # torch refuses it: ours must refuse too
                try:
                    _call(ours, sample)
                except Exception:
                    continue
                message = f"ran where torch raised {type(exc).__name__}: {_first_line(exc)}"
                tally.fail("wrong", message, where, sample)
                continue
            try:
                got = _call(ours, sample)
            except Exception as exc:
                tally.fail(*_classify(exc), where, sample)
                continue
            problem = _compare(got, expected, functools.cache(lambda: _call(info.op, _in_float64(sample))))
            if problem:
                tally.fail("wrong", problem, where, sample)
    _report_coverage(tally, device, record_property)
    _conclude(tally)


def _detached(value: Any, leaves: list[tuple[str, torch.Tensor]], label: str) -> Any:
    """``value`` with each tensor a fresh leaf of the same storage and strides (so one sample
    feeds torch and ours separately, non-contiguous layouts kept), collected into ``leaves``."""
    if isinstance(value, torch.Tensor):
        leaf = value.detach().requires_grad_(value.requires_grad)
        if leaf.requires_grad:
            leaves.append((label, leaf))
        return leaf
    if isinstance(value, (tuple, list)):
        return type(value)(_detached(v, leaves, f"{label}[{i}]") for i, v in enumerate(value))
    return value


def _forward(fn: Callable, sample) -> tuple[Any, list[tuple[str, torch.Tensor]]]:
    leaves: list[tuple[str, torch.Tensor]] = []
    args = [_detached(a, leaves, f"args[{i}]") for i, a in enumerate(sample.args)]
    kwargs = {k: _detached(v, leaves, k) for k, v in sample.kwargs.items()}
    return fn(_detached(sample.input, leaves, "input"), *args, **kwargs), leaves


def _grads(outputs: Any, weights: list[torch.Tensor], leaves) -> tuple:
    floats = [o for o in _leaves(outputs) if isinstance(o, torch.Tensor) and o.is_floating_point()]
    loss = sum((o * w).sum() for o, w in zip(floats, weights, strict=True))
    return torch.autograd.grad(loss, [leaf for _, leaf in leaves], allow_unused=True)


def _exact_grads(op: Callable, sample, weights: list[torch.Tensor]) -> tuple:
    """torch's gradients of the sample in float64, for the same output weights."""
    outputs, leaves = _forward(op, _in_float64(sample))
    return _grads(outputs, [w.to(torch.float64) for w in weights], leaves)


@pytest.mark.parametrize("dtype", GRAD_DTYPES, ids=_dtype_id)
@pytest.mark.parametrize("name", list(ENTRIES), ids=_short)
@pytest.mark.parametrize("device", DEVICES)
def test_gradients_match_torch(device, name, dtype, quiet):
    infos = [info for info in _opinfos(name)
             if info.supports_autograd and dtype in info.supported_backward_dtypes(device)]
    if not infos:
        pytest.skip(f"torch has no backward for {name} in {dtype} on {device}")
    ours = _ours(name)
    tally = Tally(f"{_short(name)} gradients {_dtype_id(dtype)} on {device}")
    generator = torch.Generator(device=device)
    for info in infos:
        where = _short(name) + (f"[{info.variant_test_name}]" if info.variant_test_name else "")
        for index, sample in enumerate(_samples(info, device, dtype, True)):
            try:
                expected, torch_leaves = _forward(info.op, sample)
                floats = [o for o in _leaves(expected) if isinstance(o, torch.Tensor) and o.is_floating_point()]
                if not torch_leaves or not any(o.requires_grad for o in floats):
                    tally.skipped += 1
                    continue
                generator.manual_seed(index)
                weights = [torch.randn(o.shape, dtype=o.dtype, device=o.device, generator=generator) for o in floats]
                expected_grads = _grads(expected, weights, torch_leaves)
            except Exception:  # torch's own forward or backward fails on it: nothing to match
                tally.skipped += 1
                continue
            tally.ran += 1
            try:
                got, our_leaves = _forward(ours, sample)
            except Exception as exc:
                tally.fail(*_classify(exc), where, sample)
                continue
            shapes = [tuple(o.shape) for o in _leaves(got) if isinstance(o, torch.Tensor) and o.is_floating_point()]
            if shapes != [tuple(o.shape) for o in floats]:
                want = [list(o.shape) for o in floats]
                tally.fail("wrong", f"float output shapes {[list(t) for t in shapes]} (torch: {want})", where, sample)
                continue
            if not any(o.requires_grad for o in _leaves(got) if isinstance(o, torch.Tensor)):
                tally.fail("wrong", "output does not require grad (no autograd through ours)", where, sample)
                continue
            try:
                got_grads = _grads(got, weights, our_leaves)
            except Exception as exc:
                kind, message = _classify(exc)
                tally.fail(kind, f"backward: {message}", where, sample)
                continue
            exact = functools.cache(lambda: _exact_grads(info.op, sample, weights))
            for k, ((label, _), g, e) in enumerate(zip(torch_leaves, got_grads, expected_grads, strict=True)):
                if (g is None) != (e is None):
                    tally.fail("wrong", f"grad of {label} is {'None' if g is None else 'a tensor'} "
                                        f"(torch: {'None' if e is None else 'a tensor'})", where, sample)
                    break
                problem = None if e is None else _compare(g, e, lambda k=k: exact()[k])
                if problem:
                    tally.fail("wrong", f"grad of {label}: {problem}", where, sample)
                    break
    _conclude(tally)
