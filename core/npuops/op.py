"""The op interface: what an operator computes, how to feed it, how to judge and cost it.

A family plugin subclasses :class:`Op` once per operator. The class docstring is the op's exact
semantics; :meth:`Op.reference` must agree with it. Implementations (our kernels, baselines) are
registered separately, see :mod:`npuops.impl`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from .data import InputRNG, high_precision, reference_math
from .errors import WorkloadError
from .workload import Workload, dtype_name, torch_dtype

Outputs = torch.Tensor | tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class Param:
    """One workload parameter of an op: its default and what values it may take."""

    default: Any
    doc: str = ""
    choices: tuple[Any, ...] | None = None
    types: tuple[type, ...] | None = None

    def check(self, where: str, name: str, value: Any) -> None:
        if self.choices is not None and value not in self.choices:
            allowed = ", ".join(repr(c) for c in self.choices)
            raise WorkloadError(f"{where}: param {name!r} = {value!r} is not allowed; allowed: {allowed}")
        if self.types is not None and not isinstance(value, self.types):
            allowed = " or ".join(t.__name__ for t in self.types)
            raise WorkloadError(f"{where}: param {name!r} = {value!r} must be {allowed}")


@dataclass(frozen=True)
class Tolerance:
    """|out - ref| <= atol * rms(ref) + rtol * |ref|: atol is relative to the output's typical
    magnitude so that one tolerance serves outputs of any scale."""

    atol: float
    rtol: float


DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "f64": Tolerance(1e-9, 1e-9),
    # f32 results may come from TF32 tensor cores, the default for cuDNN convolutions.
    "f32": Tolerance(2e-3, 2e-3),
    "f16": Tolerance(4e-3, 4e-3),
    "bf16": Tolerance(2e-2, 2e-2),
    "fp8e4m3": Tolerance(0.15, 0.15),
    "fp8e5m2": Tolerance(0.3, 0.3),
}


@dataclass(frozen=True)
class Cost:
    """The least work any implementation must do: bytes that must cross DRAM, and FLOPs."""

    bytes: int
    flops: int = 0
    compute_dtype: str | None = None  # dtype whose peak FLOP rate bounds ``flops``; default: the workload's


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    max_error: float  # largest |out-ref| / (atol*rms(ref) + rtol*|ref|): <= 1 passes
    max_abs_error: float
    detail: str = ""


def tensor_bytes(shape: Sequence[int], dtype: torch.dtype) -> int:
    return math.prod(shape) * dtype.itemsize


class Op:
    """Subclass per operator. Class attributes describe it; methods build, check and cost it."""

    name: ClassVar[str]
    family: ClassVar[str]
    summary: ClassVar[str]  # one line
    params: ClassVar[Mapping[str, Param]] = {}
    required_tensors: ClassVar[tuple[str, ...]] = ()
    optional_tensors: ClassVar[tuple[str, ...]] = ()
    tolerances: ClassVar[Mapping[str, Tolerance]] = {}

    def __init__(self, workloads: Sequence[Workload] = ()):
        self.workloads: tuple[Workload, ...] = tuple(workloads)
        for w in self.workloads:
            self.validate(w)

    def __repr__(self) -> str:
        return f"<{self.family}.{self.name}: {len(self.workloads)} workloads>"

    # -- workloads -------------------------------------------------------------------------------
    def validate(self, w: Workload) -> None:
        """Raise :class:`WorkloadError` naming the field and the allowed values."""
        where = f"{self.name} {w.id}"
        if w.op != self.name:
            raise WorkloadError(f"{where}: workload is for op {w.op!r}, not {self.name!r}")
        known = set(self.required_tensors) | set(self.optional_tensors)
        missing = [t for t in self.required_tensors if t not in w.shapes]
        if missing:
            raise WorkloadError(f"{where}: 'shapes' lacks {', '.join(missing)}; needs {', '.join(self.required_tensors)}")
        extra = [t for t in w.shapes if t not in known]
        if extra:
            raise WorkloadError(f"{where}: 'shapes' has unknown tensor(s) {', '.join(extra)}; allowed: {', '.join(sorted(known))}")
        for source in (w.params, w.chosen):
            for key, value in source.items():
                if key not in self.params:
                    allowed = ", ".join(sorted(self.params)) or "none"
                    raise WorkloadError(f"{where}: unknown param {key!r}; allowed: {allowed}")
                self.params[key].check(where, key, value)
        self.check_workload(w, self.config(w))

    def check_workload(self, w: Workload, cfg: Mapping[str, Any]) -> None:
        """Op-specific consistency checks (shapes agreeing with params, ...). Raise WorkloadError."""

    def config(self, w: Workload) -> dict[str, Any]:
        """Every parameter's value for ``w``: stated > chosen > the op's default."""
        cfg = {name: p.default for name, p in self.params.items()}
        cfg.update(w.chosen)
        cfg.update(w.params)
        return cfg

    def workload(self, id: str) -> Workload:
        for w in self.workloads:
            if w.id == id:
                return w
        from .errors import unknown

        raise unknown(f"workload of {self.name}", id, [w.id for w in self.workloads])

    # -- data ------------------------------------------------------------------------------------
    def make_inputs(self, w: Workload, rng: InputRNG) -> dict[str, torch.Tensor]:
        """Seeded, realistic inputs (never zeros). Default: standard normal per named shape."""
        return {name: rng.normal(shape, w.dtype_of(name)) for name, shape in w.shapes.items()}

    def torch_impl(self, w: Workload) -> Callable[..., Outputs] | None:
        """The op written in PyTorch, called as ``fn(**inputs)``; the core's eager and
        torch.compile baselines wrap it. None when PyTorch has no formulation."""
        return None

    def reference(self, inputs: Mapping[str, torch.Tensor], w: Workload) -> Outputs:
        """The op in higher precision: the torch formulation with every floating input upcast to
        one dtype (f32 for 16-bit and 8-bit workloads, f64 for f32 ones), so f32 statistics beside
        16-bit activations stay consistent. The result keeps that precision."""
        fn = self.torch_impl(w)
        if fn is None:
            raise NotImplementedError(f"{self.name} defines neither reference() nor torch_impl()")
        compute = high_precision(torch.empty(0, dtype=torch_dtype(w.dtype))).dtype
        with reference_math():
            return fn(**{k: v.to(compute) if v.is_floating_point() else v for k, v in inputs.items()})

    def meta_io(self, w: Workload) -> tuple[dict[str, torch.Tensor], tuple[torch.Tensor, ...]]:
        """The inputs ``make_inputs`` builds and the outputs the torch formulation returns, on the
        ``meta`` device: every shape and dtype, without data or device. Cost models built on it
        cannot drift from what the op actually moves."""
        fn = self.torch_impl(w)
        if fn is None:
            raise NotImplementedError(f"{self.name} has no torch formulation to derive its outputs from")
        inputs = self.make_inputs(w, InputRNG("meta"))
        return inputs, _as_tuple(fn(**inputs))

    def io_bytes(self, w: Workload, unread: Sequence[str] = ()) -> int:
        """Bytes to read every input once (except ``unread`` ones no implementation needs) and
        write every output once: the DRAM floor of a single-pass op."""
        inputs, outputs = self.meta_io(w)
        return sum(t.nbytes for name, t in inputs.items() if name not in unread) + sum(t.nbytes for t in outputs)

    def output_dtypes(self, w: Workload) -> tuple[str, ...] | None:
        """Dtype of each output as implementations must return it (the torch formulation's);
        None skips the dtype check."""
        if self.torch_impl(w) is None:
            return None
        return tuple(dtype_name(t.dtype) for t in self.meta_io(w)[1])

    # -- judging ---------------------------------------------------------------------------------
    def tolerance(self, dtype: torch.dtype) -> Tolerance:
        name = dtype_name(dtype)
        if name in self.tolerances:
            return self.tolerances[name]
        if not dtype.is_floating_point:
            return Tolerance(0.0, 0.0)
        return DEFAULT_TOLERANCES[name]

    def compare(self, out: Outputs, ref: Outputs, w: Workload) -> CheckResult:
        """Elementwise closeness per output; NaN where the reference is finite fails (outputs are
        NaN-filled before the call, so unwritten elements fail too)."""
        outs, refs = _as_tuple(out), _as_tuple(ref)
        if len(outs) != len(refs):
            return CheckResult(False, math.inf, math.inf, f"returned {len(outs)} outputs, expected {len(refs)}")
        expected_dtypes = self.output_dtypes(w)
        worst = CheckResult(True, 0.0, 0.0)
        for i, (o, r) in enumerate(zip(outs, refs, strict=True)):
            if not isinstance(o, torch.Tensor):
                return CheckResult(False, math.inf, math.inf, f"output {i} is {type(o).__name__}, not a tensor")
            if tuple(o.shape) != tuple(r.shape):
                return CheckResult(False, math.inf, math.inf, f"output {i} has shape {tuple(o.shape)}, expected {tuple(r.shape)}")
            if expected_dtypes is not None and dtype_name(o.dtype) != expected_dtypes[i]:
                return CheckResult(False, math.inf, math.inf, f"output {i} has dtype {dtype_name(o.dtype)}, expected {expected_dtypes[i]}")
            result = compare_tensors(o, r, self.tolerance(o.dtype), label=f"output {i}")
            if not result.ok or result.max_error > worst.max_error:
                worst = result
            if not result.ok:
                break
        return worst

    # -- cost ------------------------------------------------------------------------------------
    def cost(self, w: Workload) -> Cost:
        raise NotImplementedError(f"{self.name} has no cost model")

    def memory_bytes(self, w: Workload) -> int:
        """Device memory one check-and-time needs at most: the inputs and the reference's clone and
        upcast copy of them, the outputs and the reference's, and the comparison's temporaries
        (about seven of the largest output in the reference's precision). Measured on the H200
        against BatchNorm's 1 GiB workload (20 GiB peak, 21 estimated)."""
        inputs, outputs = self.meta_io(w)
        read = sum(t.nbytes for t in inputs.values())
        written = sum(t.nbytes for t in outputs)
        compare = 7 * max((t.numel() * high_precision(t).dtype.itemsize for t in outputs), default=0)
        return 4 * read + 3 * written + compare + (64 << 20)



class KernelOp(Op):
    """An op with kernels of ours: the interface between an op and them, in one place.

    A family subclasses it (instead of :class:`Op`) for the ops it has kernels for, and its
    plugin's ``npuops_implementations`` hook returns ``npuops.kernels.kernel_implementations(ops,
    __package__, description)``: one ``ours`` implementation per such op whose kernel takes at
    least one of its workloads. The runner and the functions for model code then call:

    - :meth:`kernel_unsupported` before anything else: None where the kernel computes ``w``, else
      the reason it does not (the row is skipped with it; a function call runs torch's
      formulation). Called for every catalog workload when the plugin loads: keep it cheap.
    - :meth:`kernel_key` to find the build that serves ``w``: workloads of equal keys share one
      (a kernel taking sizes at launch serves every size of its key; a ``KernelKey`` lets a build
      of another launch class stand in while one is built).
    - :meth:`kernel_launch_classes` for the functions for model code: after the first build of a
      key's ``shared`` part, the other launch classes' builds run in the background, so that a
      later call in another class (a new token count) finds its kernel built.
    - :meth:`tilelang_variants` for ``npuops run --tune``: launch configurations, the default first.
    - :meth:`tilelang_build` to compile: the callable checked, timed and called as
      ``fn(**inputs)`` (usually ``KernelSpec.compile``'s); ``config`` one of the variants, None
      for the default launch. A failure to build fails the row (the functions fall back to torch).
    """

    kernel_description: ClassVar[str] = ""  # one line for `npuops list`; the plugin's description if empty

    def kernel_unsupported(self, w: Workload) -> str | None:
        return None

    def kernel_key(self, w: Workload) -> Hashable:
        return w.fingerprint  # one build per workload

    def kernel_launch_classes(self, w: Workload) -> Sequence[Workload]:
        """Workloads like ``w`` in each of the other launch classes of its ``KernelKey`` (those of
        another key's ``shared`` part are ignored)."""
        return ()

    def tilelang_variants(self, w: Workload) -> Sequence[Mapping[str, Any]]:
        return ()  # the default launch only

    def tilelang_build(self, w: Workload, device: torch.device, config: Mapping[str, Any] | None = None) -> Callable[..., Any]:
        raise NotImplementedError(f"{self.name} defines no tilelang_build")

def _as_tuple(x: Any) -> tuple:
    if isinstance(x, tuple | list):
        return tuple(x)
    return (x,)


def compare_tensors(out: torch.Tensor, ref: torch.Tensor, tol: Tolerance, label: str = "output") -> CheckResult:
    if not out.dtype.is_floating_point and not ref.dtype.is_floating_point:
        diff = (out.to(torch.int64) - ref.to(torch.int64)).abs()
        max_abs = float(diff.max()) if diff.numel() else 0.0
        ok = max_abs <= tol.atol
        return CheckResult(ok, max_abs / max(tol.atol, 1.0), max_abs, "" if ok else f"{label}: integer mismatch up to {max_abs:g}")
    o = out.to(torch.float64 if ref.dtype == torch.float64 else torch.float32)
    r = ref.to(o.dtype)
    if o.numel() == 0:
        return CheckResult(True, 0.0, 0.0)
    ref_nan = torch.isnan(r)
    out_nan = torch.isnan(o)
    if bool((out_nan != ref_nan).any()):
        n = int((out_nan & ~ref_nan).sum())
        m = int((ref_nan & ~out_nan).sum())
        what = f"{n} NaN where the reference is a number" if n else f"{m} numbers where the reference is NaN"
        return CheckResult(False, math.inf, math.inf, f"{label}: {what} (unwritten or wrong)")
    finite = torch.isfinite(r)
    inf_mismatch = (~finite & ~ref_nan) & (o != r)
    if bool(inf_mismatch.any()):
        return CheckResult(False, math.inf, math.inf, f"{label}: infinities differ from the reference")
    r_f = torch.where(finite, r, torch.zeros_like(r))
    o_f = torch.where(finite, o, torch.zeros_like(o))
    scale = float(r_f.square().mean().sqrt()) if finite.any() else 0.0
    scale = scale if scale > 0 else 1.0
    abs_err = (o_f - r_f).abs()
    allowed = tol.atol * scale + tol.rtol * r_f.abs()
    ratio = abs_err / allowed.clamp_min(torch.finfo(allowed.dtype).tiny)
    max_ratio = float(ratio.max())
    max_abs = float(abs_err.max())
    ok = max_ratio <= 1.0
    detail = "" if ok else (
        f"{label}: max |err| {max_abs:.3g} is {max_ratio:.3g}x the tolerance "
        f"(atol {tol.atol:g} x rms {scale:.3g} + rtol {tol.rtol:g} x |ref|)"
    )
    return CheckResult(ok, max_ratio, max_abs, detail)


def ops_from_catalog(op_classes: Sequence[type[Op]], catalog: Mapping[str, Sequence[Workload]]) -> list[Op]:
    """Instantiate each op class with its catalog workloads; every catalog op needs a class."""
    by_name = {cls.name: cls for cls in op_classes}
    orphans = sorted(set(catalog) - set(by_name))
    if orphans:
        raise WorkloadError(f"catalog has workloads for ops without a class: {', '.join(orphans)}")
    return [cls(catalog.get(name, ())) for name, cls in by_name.items()]


def discover_op_classes(package: str) -> list[type[Op]]:
    """Every concrete Op subclass defined in the modules of ``package`` (one module per op;
    modules whose name starts with ``_`` hold shared pieces and are only imported by others)."""
    import importlib
    import pkgutil

    pkg = importlib.import_module(package)
    classes: list[type[Op]] = []
    for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{package}.{info.name}")
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, Op) and obj.__module__ == module.__name__ and "name" in vars(obj):
                classes.append(obj)
    return classes


def package_ops(package: str) -> list[Op]:
    """A family plugin's ops: the Op classes of ``<package>.ops`` with the workloads of the
    ``workloads.json`` the package ships (what a plugin's ``npuops_ops`` hook returns)."""
    from importlib.resources import files

    from .workload import load_catalog

    return ops_from_catalog(discover_op_classes(f"{package}.ops"), load_catalog(files(package) / "workloads.json"))
