"""Ops as functions for model code, shared by the family plugins.

:func:`define_function` turns an npuops op into a function: our kernel (tier ``ours``) where it
covers the call, the op's torch formulation for every other call, never an internal error. A
kernel that fails to build or launch falls back to torch and warns once; :func:`coverage` says
which calls ran ours and why the others did not.

Three paths, one computation:

- **Eager calls** (plain tensors, no gradient needed) go straight to a plan cached per call
  signature (shapes, dtypes, devices, scalars): one dict lookup, the layout checks the kernel
  needs, the launch. Kernels are built once per *kernel key* (``Implementation.build_key``: the
  dims their code depends on; sizes the kernel takes at launch are not part of it), so a new row
  count or image size reuses a build.
- **Traced calls** (``torch.compile``, tensor subclasses, functorch transforms) go through a
  ``torch.library`` custom op with a fake implementation (the torch formulation on fake tensors).
- **Calls that need a gradient** go through the same custom op, whose backward is the function's
  own (``OpFunction.backward``: backward ops of ours, themselves functions) where it has one,
  else torch's derivative of the op's formulation (recomputed from the saved inputs); for an op
  that updates an input in place, they run the formulation itself.

An op that updates *state* in place (``OpFunction.state``: running statistics, which its
differentiable outputs do not read) is defined functional: its custom op updates copies and
returns them after the function's outputs, and the call copies them back, as torch's function
updates its buffers. Torch registers a backward only for ops that mutate nothing.

A function defined with a ``fallback`` (torch's own function with the op function's arguments) is
a drop-in: an input the op cannot express (a dtype it has no name for, shapes its workload
validation refuses) is passed to the fallback, which computes it or raises as torch does. One
without raises a ValueError that says what was expected.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import operator
import threading
import time
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import torch

from . import native
from .data import InputRNG
from .devices import before_graph_capture
from .errors import WorkloadError
from .impl import KernelKey
from .kernels import VECTOR_BYTES
from .workload import Workload, dtype_name


@functools.cache
def _registry():
    from .registry import load_registry

    return load_registry()


@dataclass(frozen=True)
class OpFunction:
    """One function: ``schema`` is the custom op's (``"(Tensor x, Tensor weight, float eps=1e-06)
    -> Tensor"``); ``inputs`` its tensor arguments in order, the first filling the workload shape
    ``shape_name``; ``params`` the other arguments with their defaults, in order (they become the
    workload's params); ``returns`` which of the op's outputs the function returns; ``fallback``
    torch's function called with the same arguments, for calls the op cannot express."""

    namespace: str
    name: str
    op: str
    schema: str
    inputs: tuple[str, ...]
    params: tuple[tuple[str, Any], ...] = ()
    shape_name: str = "x"
    mutates: tuple[str, ...] = ()
    returns: tuple[int, ...] = (0,)
    fallback: Callable[..., Any] | None = None
    constants: tuple[tuple[str, Any], ...] = ()  # workload params every call has (not arguments)
    # Inputs the op updates in place that are state, not values: see the module's docstring. The
    # schema returns the function's outputs, then one tensor per state input.
    state: tuple[str, ...] = ()
    # The gradient of ours: backward(inputs by name, params by name, the custom op's outputs, their
    # gradients) -> the gradient of each tensor input in order (None where it has none), or None
    # where it does not cover the call (torch's derivative of the formulation runs). A backward with
    # a ``needs`` parameter is also given which tensor inputs' gradients autograd asks for (a bool
    # each), and computes only those.
    backward: Callable[..., tuple | None] | None = None
    # Inputs that lend the workload their shape alone (a gradient op's forward input, whose shape
    # the op's own tensors do not fix): neither the op's formulation nor its kernel reads them.
    shape_only: tuple[str, ...] = ()

    @property
    def qualname(self) -> str:
        return f"{self.namespace}::{self.name}"


def int_tuple(value: Any, dims: int) -> tuple[int, ...] | None:
    """``value`` as ``dims`` ints, as torch's int[dims] arguments take it: an int, or a sequence of
    one int (for every dim) or of ``dims`` ints; None for any other form (a front passes that call
    to torch as it is)."""
    if type(value) is int:
        return (value,) * dims
    if isinstance(value, tuple | list) and len(value) in (1, dims) and all(type(v) is int for v in value):
        return tuple(value) * (dims // len(value))
    return None


def batched(input: Any, dims: int) -> tuple[torch.Tensor, bool] | None:
    """(``input`` of ``dims`` spatial dims with a batch dim, whether one was added: torch's
    functions take [C, *spatial] too), or None for an empty tensor, one of a rank torch refuses, or
    not a tensor."""
    if not isinstance(input, torch.Tensor) or input.dim() not in (dims + 1, dims + 2) or input.numel() == 0:
        return None
    return (input.unsqueeze(0), True) if input.dim() == dims + 1 else (input, False)


def unbatched(result: Any, added: bool) -> Any:
    """``result`` of a call :func:`batched` gave a batch dim, without it again."""
    if not added:
        return result
    return tuple(t.squeeze(0) for t in result) if isinstance(result, tuple) else result.squeeze(0)


# -- coverage -------------------------------------------------------------------------------------
_calls: dict[str, Counter] = defaultdict(Counter)
_warned: set[tuple[str, str]] = set()


def record(function: str, reason: str | None) -> None:
    """Count one call of ``function``: ours (``reason`` None) or torch's, for ``reason``."""
    _calls[function][reason or "ours"] += 1


def torch_call(function: str, reason: str, torch_function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``torch_function(*args, **kwargs)``, counted as a call of ``function`` that ran torch's, for
    ``reason``: for the forms of a call a drop-in passes to torch as they are."""
    record(function, reason)
    return torch_function(*args, **kwargs)


def coverage() -> dict[str, dict[str, Any]]:
    """Per function called since the last :func:`reset_coverage`: how many calls ran our kernel
    (``ours``), how many torch's formulation (``torch``), and why, per reason (``why``)."""
    calls = defaultdict(Counter, {name: Counter(counts) for name, counts in _calls.items()})
    for function in _functions:
        for plan in function._plans.values():
            launches = plan.launches + sum(native.launches for native in plan.natives)
            if launches:
                calls[function.fn.name]["ours"] += launches
    report = {}
    for name, counts in sorted(calls.items()):
        why = {reason: n for reason, n in counts.items() if reason != "ours"}
        report[name] = {"ours": counts["ours"], "torch": sum(why.values()), "why": why}
    return report


def reset_coverage() -> None:
    _calls.clear()
    for function in _functions:
        for plan in function._plans.values():
            plan.launches = 0
            for native in plan.natives:
                native.launches = 0


TORCH_RUNS = "this call and others like it run torch's formulation"


def _warn_once(function: str, what: str, then: str = TORCH_RUNS) -> None:
    if (function, what) not in _warned:
        _warned.add((function, what))
        warnings.warn(f"npuops: {function}: {what}; {then}", RuntimeWarning, stacklevel=4)


# -- builds ---------------------------------------------------------------------------------------
_builds: dict[Hashable, Any] = {}
_build_lock = threading.Lock()
_build_done = threading.Condition(_build_lock)  # notified as each build behind the calls ends
_PENDING = object()  # a build running behind the calls, while another stands in


def built_kernels() -> int:
    """How many kernels the functions of this process have built (or found in TileLang's disk
    cache): one per kernel key and device, whatever the number of shapes called."""
    return len({id(kernel) for kernel in _builds.values() if kernel is not None and kernel is not _PENDING})


def _build(impl, op, w: Workload, device: torch.device, function: str, then: str = TORCH_RUNS) -> Any:
    try:
        return impl.build(op, w, device)
    except Exception as exc:  # a kernel that fails to build must not fail the call
        _warn_once(function, f"our kernel failed to build ({type(exc).__name__}: {exc})", then)
        return None


def _stand_in(key: tuple) -> Any:
    """A built kernel that computes ``key``'s workloads correctly (see ``KernelKey``), or None."""
    build_key = key[3]
    if not isinstance(build_key, KernelKey):
        return None
    for other, kernel in _builds.items():
        if (other[:3] == key[:3] and other[4] == key[4] and isinstance(other[3], KernelKey)
                and other[3].shared == build_key.shared and kernel is not None and kernel is not _PENDING):
            return kernel
    return None


def _build_behind(builds: list[tuple[tuple, Workload]], impl, op, device: torch.device, function: str,
                  stand_in: Any) -> None:
    """Build each (key, workload) of ``builds`` in turn, each key's calls run by ``stand_in`` until
    its kernel is built (or for good, where its build fails)."""
    with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
        for key, w in builds:
            kernel = _build(impl, op, w, device, function,
                            "the kernel of another launch class keeps running these calls")
            with _build_done:
                _builds[key] = kernel if kernel is not None else stand_in
                _build_done.notify_all()


def _behind(builds: list[tuple[tuple, Workload]], impl, op, device: torch.device, function: str,
            stand_in: Any) -> None:
    """Mark ``builds``' keys pending and start their builds in a thread (the caller holds the lock)."""
    for key, _ in builds:
        _builds[key] = _PENDING
    threading.Thread(target=_build_behind, args=(builds, impl, op, device, function, stand_in),
                     name=f"npuops build {impl.op}", daemon=True).start()


def _other_classes(impl, op, w: Workload, key: tuple) -> list[tuple[tuple, Workload]]:
    """(key, workload) of each launch class of ``key``'s ``shared`` part not built or building yet
    (the implementation's ``launch_classes``), one workload a class."""
    if impl.launch_classes is None or not isinstance(key[3], KernelKey):
        return []
    others: dict[tuple, Workload] = {}
    for other in impl.launch_classes(op, w):
        try:
            op.validate(other)
            build_key = impl.build_key(op, other)
        except Exception:  # noqa: BLE001 - a class the op cannot express is one fewer to build ahead
            continue
        other_key = (*key[:3], build_key, key[4])
        if isinstance(build_key, KernelKey) and build_key.shared == key[3].shared and other_key not in _builds:
            others.setdefault(other_key, other)
    return list(others.items())


@before_graph_capture
def finish_builds(timeout: float | None = None) -> bool:
    """Wait until no build runs behind the calls (a launch class's, see :func:`_kernel`, and the
    fast path's, see :mod:`npuops.native`), at most ``timeout`` seconds: whether none does. For
    code that must not share its first seconds with compilation, and for timing the calls as they
    run once every kernel is built."""
    start = time.monotonic()
    with _build_done:
        if not _build_done.wait_for(lambda: all(kernel is not _PENDING for kernel in _builds.values()), timeout):
            return False
    return native.wait(None if timeout is None else max(0.0, timeout - (time.monotonic() - start)))


def _kernel(impl, op, w: Workload, device: torch.device, function: str,
            behind: bool = True) -> tuple[Any, str | None, tuple | None]:
    """(the kernel serving ``w``'s kernel key, None, None), or (None, why not, None). With
    ``behind``, a key not built yet whose kernel another build can stand in for (``KernelKey``)
    gets that one at once, and its own build runs in a thread: (stand-in, None, the key it waits
    for). A call never waits for a build that another kernel can do for it. The first build of a
    ``shared`` part starts its other launch classes' builds behind it, so that by the time model
    code calls them (a token count of another class) they are built."""
    key = (impl.plugin, impl.op, impl.name, impl.build_key(op, w), str(device))
    with _build_lock:
        kernel = _builds.get(key)
        if key not in _builds or kernel is _PENDING:
            stand_in = _stand_in(key) if behind else None
            if stand_in is not None:
                if key not in _builds:
                    _behind([(key, w)], impl, op, device, function, stand_in)
                return stand_in, None, key
            if kernel is not _PENDING:
                _builds[key] = kernel = _build(impl, op, w, device, function)
                if kernel is not None and (others := _other_classes(impl, op, w, key)):
                    _behind(others, impl, op, device, function, kernel)
    if kernel is _PENDING:  # behind=False while a build runs behind: wait for it
        with _build_done:
            _build_done.wait_for(lambda: _builds[key] is not _PENDING)
            kernel = _builds[key]
    return (kernel, None, None) if kernel is not None else (None, "kernel failed to build", None)


def warm(workloads, progress: Callable[[Workload, str | None], None] | None = None) -> dict[str, int]:
    """Build our kernel for each of ``workloads`` (on the current CUDA device) as a function's first
    call like it would, into this process's builds and TileLang's disk cache, where later processes
    find them: for deployments that must not stall on a first call. ``progress(w, why_not)`` after
    each, then waits for the other launch classes' builds these started. Returns how many workloads
    got a kernel, how many had none, and the builds that took. Builds the fast path's torch-aware
    reads too (:mod:`npuops.native`), where a kernel was built."""
    registry = _registry()
    device, cuda = torch.device("cuda"), registry.device("cuda")
    before, counts = built_kernels(), Counter()
    for w in workloads:
        op = registry.op(w.op)
        ours = [i for i in registry.impls_for(w.op) if i.tier == "ours"]
        why = ours[0].why_not(op, w, cuda) if ours else "no kernel for this op"
        if why is None:
            why = _kernel(ours[0], op, w, device, w.op, behind=False)[1]
        if why is None:
            native.accelerate_behind()
        counts["with a kernel" if why is None else "without"] += 1
        if progress:
            progress(w, why)
    finish_builds()
    return {**counts, "built": built_kernels() - before}


# -- plans ----------------------------------------------------------------------------------------
@dataclass
class _Plan:
    """How calls of one signature run: ``kernel`` (or None, and ``reason``) and ``formulation``
    (the op's torch formulation, or the function's fallback where the op cannot express them)."""

    kernel: Any
    formulation: Callable[..., Any]
    reason: str | None
    names: tuple[str, ...]
    launch: Callable[..., Any] | None = None  # the kernel prepared for this signature, tensors positional
    launches: int = 0  # calls that ran it since reset_coverage(), counted here: one attribute on the hot path
    natives: list = field(default_factory=list, init=False)  # its C fast calls, which count their own launches
    pending: tuple | None = None  # the build key whose kernel will replace a stand-in (see _kernel)
    outside: bool = False  # the formulation is the function's fallback: the op cannot express these calls
    # Whether the kernel takes a tensor as it is laid out: the kernel's ``accepts`` (a kernel that
    # reads another layout, or converts, says which it takes), else contiguous. Derived from the
    # kernel, so a plan made with another one (dataclasses.replace) checks that one's.
    accepts: Callable[[torch.Tensor], bool] = field(init=False)

    def __post_init__(self) -> None:
        self.accepts = getattr(self.kernel, "accepts", torch.Tensor.is_contiguous)


def _workload(fn: OpFunction, op, tensors: tuple, params: tuple) -> Workload:
    """The workload of one call, given (name, shape, dtype) per tensor argument."""
    (_, shape, dtype), *others = tensors
    # The first tensor fills the workload's main shape; others the op names as workload tensors
    # (top-k's starts and ends) too, with their dtype where it differs.
    named = {name: (s, d) for name, s, d in others if name in op.required_tensors + op.optional_tensors}
    return Workload(fn.op, "call", "call", dtype_name(dtype), {fn.shape_name: shape, **{n: s for n, (s, _) in named.items()}},
                    params={**dict(fn.constants), **{k: v for k, v in params if v is not None}},
                    shape_dtypes={n: dtype_name(d) for n, (_, d) in named.items() if d != dtype})


def _plan(fn: OpFunction, described: tuple, devices: tuple, params: tuple) -> _Plan:
    registry = _registry()
    op = registry.op(fn.op)
    names = tuple(name for name, _, _ in described)
    for (name, _, _), device in zip(described, devices):
        if device != devices[0]:  # torch's own message names neither tensor
            raise ValueError(f"{fn.name}: {name} is on {device} but {described[0][0]} is on {devices[0]}; use one device")
    try:
        w = _workload(fn, op, described, params)
        op.validate(w)
        expected = {name: (tuple(t.shape), t.dtype) for name, t in op.make_inputs(w, InputRNG("meta")).items()}
        _check(fn, tuple(d for d in described if d[0] not in fn.shape_only), expected)
    except Exception as exc:  # noqa: BLE001 - whatever the op cannot express goes to torch as it is
        if fn.fallback is None:
            if not isinstance(exc, WorkloadError | ValueError):
                raise
            message = str(exc) if isinstance(exc, ValueError) else f"{fn.name}: {exc}"
            raise ValueError(message) from None
        fallback, given = fn.fallback, dict(params)
        return _Plan(None, lambda **tensors: fallback(**tensors, **given), f"outside the op ({exc})", names,
                     outside=True)
    formulation = op.torch_impl(w)
    if fn.shape_only:
        formulation = _without(fn.shape_only, formulation)
    device = devices[0]
    if device.type != "cuda":
        return _Plan(None, formulation, f"{device.type} device", names)
    if any(0 in shape for _, shape, _ in described):
        return _Plan(None, formulation, "empty input", names)
    ours = [i for i in registry.impls_for(fn.op) if i.tier == "ours"]
    if not ours:
        return _Plan(None, formulation, "no kernel for this op", names)
    why = ours[0].why_not(op, w, registry.device("cuda"))
    if why is not None:
        return _Plan(None, formulation, why, names)
    kernel, why, pending = _kernel(ours[0], op, w, device, fn.name)
    if kernel is None:
        return _Plan(None, formulation, why, names)
    native.accelerate_behind()  # the fast path's torch-aware reads, built once a kernel of ours runs here
    read = tuple(name for name in names if name not in fn.shape_only)
    if hasattr(kernel, "prepare"):
        launch = kernel.prepare(read, {name: shape for name, shape, _ in described if name in read},
                                {name: dtype for name, _, dtype in described if name in read})
    else:
        def launch(*tensors):
            return kernel(**dict(zip(read, tensors)))
    if fn.shape_only:
        launch = _read_only(tuple(i for i, name in enumerate(names) if name in read), launch)
    return _Plan(kernel, formulation, None, names, launch, pending=pending)


def _without(names: tuple[str, ...], formulation: Callable[..., Any]) -> Callable[..., Any]:
    """``formulation`` of the tensors by name, the shape-only ones (``names``) left out."""
    def read(**tensors):
        return formulation(**{k: v for k, v in tensors.items() if k not in names})
    return read


def _read_only(positions: tuple[int, ...], launch: Callable[..., Any]) -> Callable[..., Any]:
    """``launch`` of the tensors at ``positions`` alone (the others lend their shape only)."""
    def read(*tensors):
        return launch(*(tensors[i] for i in positions))
    return read


def _check(fn: OpFunction, described: tuple, expected: dict[str, tuple]) -> None:
    first_name, first_shape, _ = described[0]
    for name, shape, dtype in described:
        want_shape, want_dtype = expected[name]
        if shape != want_shape:
            raise ValueError(f"{fn.name}: {name} must have shape {list(want_shape)} (given {first_name} "
                             f"{list(first_shape)}), got {list(shape)}")
        if dtype != want_dtype:
            raise ValueError(f"{fn.name}: {name} must be {want_dtype} (as {first_name}), got {dtype}")


def _pick(fn: OpFunction, outputs: Any) -> Any:
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    picked = tuple(outputs[i] for i in fn.returns)
    return picked[0] if len(picked) == 1 else picked


def _as_tuple(outputs: Any) -> tuple:
    return outputs if isinstance(outputs, tuple) else (outputs,)


def _unaliased(outputs: Any, tensors: tuple) -> Any:
    """A custom op's outputs may not alias its inputs; kernels allocate theirs, a torch formulation
    may hand back a view: copy only those."""
    def fresh(o):
        return o.clone() if any(torch._C._is_alias_of(o, t) for t in tensors) else o
    return tuple(fresh(o) for o in outputs) if isinstance(outputs, tuple) else fresh(outputs)


_PLAIN = (torch.Tensor, torch.nn.Parameter)
_functions: list[DropIn] = []  # every function defined, for coverage()
_META = torch.device("meta")


class DropIn:
    """The function :func:`define_function` returns; see the module's docstring."""

    def __init__(self, fn: OpFunction):
        self.fn = fn
        self.__name__ = self.__qualname__ = fn.name
        self.__doc__ = f"npuops {fn.op} as a function: {fn.schema}"
        self._plans: dict[tuple, _Plan] = {}
        self._fast_calls: dict[tuple, Any] = {}  # the C launches of calls seen before (_file_fast_call)
        _fast_paths.append(self._fast_calls)
        self._tensor_count = len(fn.inputs)
        self._defaults = tuple(default for _, default in fn.params)
        self._param_names = tuple(name for name, _ in fn.params)
        self._differentiable = not fn.mutates
        # A kernel's one output is returned as it is (an op with state returns that too).
        self._single = fn.returns == (0,) and not fn.state
        self._arity = len(fn.inputs) + len(fn.params)
        self._lists = "[" in fn.schema.split("->")[0]  # int[] parameters, which callers may give as lists
        self._state = tuple(fn.inputs.index(name) for name in fn.state)  # positions of the state inputs
        self._backward_needs = fn.backward is not None and "needs" in inspect.signature(fn.backward).parameters
        self.custom_op = self._define_custom_op()
        _functions.append(self)

    # -- the eager path ---------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs or len(args) != self._arity or (self._lists and any(type(v) is list for v in args)):
            args = self._complete(args, kwargs)
        count = self._tensor_count
        tensors = args[:count]
        if not (torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active()):
            # The C launch of a call seen before (only where the extension was built: in Python
            # the key would cost what the plan's lookup below costs, twice).
            if _fastpath is not None and (result := _fastpath.call(self._fast_calls, args, None, False)) is not _MISS:
                return result
            # The eager path: one pass over the tensors tells whether it may take the call (plain
            # tensors, no gradient to record) and makes the plan's key.
            grad = torch.is_grad_enabled()
            key = [args[count:]]
            for t in tensors:
                if type(t) not in _PLAIN or (grad and t.requires_grad):
                    break
                key.append((t.shape, t.dtype, t.is_cuda, t.is_meta, t.get_device()))
            else:
                plan = self._plans.get(key := tuple(key))
                if plan is None or plan.pending is not None:
                    plan = None  # new, or waiting for a build: _run makes it again
                result = self._run(args, tensors, plan)
                self._file_fast_call(args, self._plans.get(key))
                return result
        args = self._complete(args, {})  # the types checked: the eager test took only plain tensors
        if self._differentiable or not self._wants_grad(tensors):
            return self.custom_op(*args)
        plan = self._plan_for(args)
        record(self.fn.name, "gradient through an in-place op")
        return _pick(self.fn, plan.formulation(**dict(zip(plan.names, tensors))))

    def _file_fast_call(self, args: tuple, plan: _Plan | None) -> None:
        """After a call of ``plan``: where its launch is one the C fast path runs (a compiled
        kernel's, see :func:`_fast_launch`), file that under the call's key, so that calls like it
        (model code calling an op function directly, ``fused_add_rms_norm`` a layer) go from their
        arguments to the launch in C, as the fronts' do."""
        if _fastpath is None or plan is None or plan.pending is not None or getattr(plan.launch, "native", None) is None:
            return
        key = signature(args, None, False)
        if key is not None and _hashable(key) and key not in self._fast_calls:
            self._fast_calls[key] = _fast_launch(self, plan, tuple(range(self._tensor_count)))

    def _run(self, args: tuple, tensors: tuple, plan: _Plan | None = None) -> Any:
        """A call by its plan (``__call__`` found it; else looked up, made if new): our kernel where
        the plan has one and the inputs are laid out for it (in a layout the kernel accepts, on a
        16-byte boundary), else torch's formulation."""
        if plan is None:
            plan = self._plan_for(args)
        launch, reason = plan.launch, plan.reason
        if launch is not None:
            accepts = plan.accepts
            for t in tensors:
                if not accepts(t) or t.data_ptr() % VECTOR_BYTES:
                    launch, reason = None, "non-contiguous or misaligned input"
                    break
        if launch is not None:
            try:
                outputs = launch(*tensors)
            except Exception as exc:  # a launch failure runs torch's formulation, once reported
                _warn_once(self.fn.name, f"our kernel failed to launch ({type(exc).__name__}: {exc})")
                plan.kernel, plan.launch, plan.reason = None, None, "kernel failed to launch"
                return self._run(args, tensors, plan)
            plan.launches += 1
            result = outputs if self._single else _pick(self.fn, outputs)
            recorder = _front_calls.recorder
            if recorder is not None and plan.pending is None:
                recorder.append((self, plan, tensors, result))
            return result
        record(self.fn.name, reason)
        return _pick(self.fn, plan.formulation(**dict(zip(plan.names, tensors))))

    def _complete(self, args: tuple, kwargs: dict) -> tuple:
        """The arguments in schema order, defaults filled in, lists as tuples."""
        if len(args) < self._tensor_count + len(self._defaults) or kwargs:
            names = self.fn.inputs + self._param_names
            unknown = set(kwargs) - set(names)
            if unknown:
                raise TypeError(f"{self.fn.name}() got an unexpected keyword argument {sorted(unknown)[0]!r}")
            if len(args) > len(names):
                raise TypeError(f"{self.fn.name}() takes {len(names)} arguments, got {len(args)}")
            missing = [n for n in self.fn.inputs[len(args):] if n not in kwargs]
            if missing:
                raise TypeError(f"{self.fn.name}() missing tensor argument {missing[0]!r}")
            given = dict(zip(names, args), **kwargs)
            args = tuple(given[n] for n in self.fn.inputs) + tuple(
                given.get(n, d) for n, d in zip(self._param_names, self._defaults))
        tensors = args[:self._tensor_count]
        for name, t in zip(self.fn.inputs, tensors):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{self.fn.name}: {name} must be a tensor, got {type(t).__name__}")
        return tensors + tuple(tuple(v) if isinstance(v, list) else v for v in args[self._tensor_count:])

    @staticmethod
    def _wants_grad(tensors: tuple) -> bool:
        return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)

    def _plan_for(self, args: tuple, traced: bool = False) -> _Plan:
        """The plan of calls like ``args``; ``traced``: of calls on fake tensors (the formulation
        alone: nothing is built while tracing)."""
        tensors = args[:self._tensor_count]
        if traced:
            key = (args[self._tensor_count:], *((tuple(int(s) for s in t.shape), t.dtype, _META) for t in tensors))
        else:  # as __call__ makes it; get_device() (the index, -1 on the CPU and meta) and the flags
            # cost less than .device
            key = (args[self._tensor_count:], *[(t.shape, t.dtype, t.is_cuda, t.is_meta, t.get_device()) for t in tensors])
        plan = self._plans.get(key)
        if plan is None or (plan.pending is not None and _builds.get(plan.pending) is not _PENDING):
            described = self._described(tensors)
            devices = tuple(_META if traced else t.device for t in tensors)
            plan = _plan(self.fn, described, devices, tuple(zip(self._param_names, args[self._tensor_count:])))
            self._plans[key] = plan
        return plan

    def workload(self, *args: Any, **kwargs: Any) -> Workload:
        """The workload a call with these arguments plans (tensors by shape and dtype alone: meta
        tensors do), for building its kernel ahead (:func:`warm`)."""
        args = self._complete(args, kwargs)
        return _workload(self.fn, _registry().op(self.fn.op), self._described(args[:self._tensor_count]),
                         tuple(zip(self._param_names, args[self._tensor_count:])))

    def _described(self, tensors: tuple) -> tuple:
        """(name, shape, dtype) of each tensor input: what a plan and its workload are made of."""
        return tuple((name, tuple(int(s) for s in t.shape), t.dtype) for name, t in zip(self.fn.inputs, tensors))

    def kernel_for(self, *args: Any, **kwargs: Any) -> Any:
        """The kernel an eager call with these arguments runs (None: torch's formulation)."""
        args = self._complete(args, kwargs)
        plan = self._plan_for(args)
        tensors = args[:self._tensor_count]
        if any(not plan.accepts(t) or t.data_ptr() % VECTOR_BYTES for t in tensors):  # as _run checks
            return None
        return plan.kernel

    # -- the traced and differentiated paths ------------------------------------------------------
    def _define_custom_op(self):
        fn = self.fn

        # The dispatcher hands over int[] arguments as lists and leaves trailing defaults out.
        def compute(*args):
            args = self._complete(args, {})
            tensors = args[:self._tensor_count]
            if self._state:
                return _unaliased(self._on_state_copies(args), tensors)
            return _unaliased(self._run(args, tensors), tensors)

        def fake(*args):
            args = self._complete(args, {})
            tensors = args[:self._tensor_count]
            # The workload needs concrete sizes (symbolic ones specialize here); the formulation
            # itself runs on the fake, possibly symbolic, tensors.
            plan = self._plan_for(args, traced=True)
            if self._state:
                copies = self._state_copies(tensors)
                outputs = _pick(fn, plan.formulation(**dict(zip(plan.names, copies))))
                return _unaliased((*_as_tuple(outputs), *(copies[i] for i in self._state)), tensors)
            return _unaliased(_pick(fn, plan.formulation(**dict(zip(plan.names, tensors)))), tensors)

        op = torch.library.custom_op(fn.qualname, compute, mutates_args=fn.mutates, schema=fn.schema)
        op.register_fake(fake)
        if self._differentiable:
            op.register_autograd(self._backward, setup_context=self._setup_context)
        return op

    def _state_copies(self, tensors: tuple) -> tuple:
        return tuple(t.clone() if i in self._state else t for i, t in enumerate(tensors))

    def _on_state_copies(self, args: tuple) -> tuple:
        """The op run on copies of its state: (the function's outputs, the updated copies)."""
        tensors = self._state_copies(args[:self._tensor_count])
        outputs = self._run((*tensors, *args[self._tensor_count:]), tensors)
        return (*_as_tuple(outputs), *(tensors[i] for i in self._state))

    def _setup_context(self, ctx, inputs, output):
        inputs = self._complete(tuple(inputs), {})
        tensors = inputs[:self._tensor_count]
        # State is copied back into its tensors as soon as the op returns: saved, it would fail
        # autograd's check that saved tensors are unchanged. Its values enter no gradient.
        ctx.state_like = {i: (tensors[i].shape, tensors[i].dtype, tensors[i].device) for i in self._state}
        outputs = _as_tuple(output) if self.fn.backward is not None else ()
        ctx.save_for_backward(*(None if i in self._state else t for i, t in enumerate(tensors)), *outputs)
        ctx.params = inputs[self._tensor_count:]

    def _backward(self, ctx, *grads):
        """The function's own backward (``OpFunction.backward``) where the call ran the op and it
        covers the call, else torch's derivative of the op's formulation, recomputed from the saved
        inputs."""
        saved = ctx.saved_tensors
        saved, outputs = list(saved[:self._tensor_count]), saved[self._tensor_count:]
        for i, (shape, dtype, device) in ctx.state_like.items():  # any values: the gradient reads none
            saved[i] = torch.zeros(shape, dtype=dtype, device=device)
        wanted = [i for i, needs in enumerate(ctx.needs_input_grad[:self._tensor_count]) if needs]
        plan = self._plan_for((*saved, *ctx.params), traced=True)
        result = [None] * (self._tensor_count + len(ctx.params))
        if self.fn.backward is not None and not plan.outside:
            needs = {"needs": tuple(ctx.needs_input_grad[:self._tensor_count])} if self._backward_needs else {}
            ours = self.fn.backward(dict(zip(self.fn.inputs, saved)), dict(zip(self._param_names, ctx.params)),
                                    outputs, grads, **needs)
            if ours is not None:
                for i in wanted:
                    result[i] = ours[i]
                return tuple(result)
        with torch.enable_grad():
            inputs = [t.detach().requires_grad_(i in wanted) for i, t in enumerate(saved)]
            outputs = _as_tuple(_pick(self.fn, plan.formulation(**dict(zip(plan.names, inputs)))))
            pairs = [(o, g) for o, g in zip(outputs, grads) if g is not None and o.requires_grad]
            found = torch.autograd.grad([o for o, _ in pairs], [inputs[i] for i in wanted],
                                        [g for _, g in pairs], allow_unused=True) if pairs else [None] * len(wanted)
        for i, g in zip(wanted, found):
            result[i] = g
        return tuple(result)


class _StatefulDropIn(DropIn):
    """A function whose op updates state in place (see the module's docstring): every call runs the
    functional form, eager calls without the custom op, and copies the updated state back."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        args = self._complete(args, kwargs)
        tensors = args[:self._tensor_count]
        if (torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active()
                or any(type(t) not in _PLAIN for t in tensors) or self._wants_grad(tensors)):
            outputs = self.custom_op(*args)
        else:
            outputs = self._on_state_copies(args)
        returned = len(outputs) - len(self._state)
        with torch.no_grad():
            for i, updated in zip(self._state, outputs[returned:]):
                tensors[i].copy_(updated)
        return outputs[0] if returned == 1 else tuple(outputs[:returned])


def define_function(fn: OpFunction) -> DropIn:
    if fn.state and (fn.mutates or not set(fn.state) <= set(fn.inputs)):
        raise ValueError(f"{fn.name}: state {list(fn.state)} must name tensor inputs {list(fn.inputs)}, and an op "
                         f"with state is defined functional (mutates=(), not {list(fn.mutates)})")
    return (_StatefulDropIn if fn.state else DropIn)(fn)


# -- fronts ---------------------------------------------------------------------------------------
class _FrontCalls(threading.local):
    # A class attribute, not getattr's default: a missing thread-local attribute raises inside
    # getattr, about 0.5 us on every call.
    recorder: list | None = None  # the kernel calls made by the front call running


_front_calls = _FrontCalls()


def _fast_launch(function: DropIn, plan: _Plan, positions: tuple[int, ...]) -> Callable[[tuple], Any]:
    """What a front call of one signature came down to, as a function of the front's values:
    ``function``'s ``plan`` run on those at ``positions`` (as they are) by ``DropIn._run``, which
    holds the layout checks, the launch and its fallbacks (a call the kernel cannot take runs the
    plan's formulation, counted with its reason). Where the plan's launch is a C call
    (:class:`~npuops.kernels.NativeLaunch`) of a kernel that takes contiguous tensors, the same in
    C (``npuops._fastpath.Launch``), which hands every call it does not take to the former."""
    take, run, several = operator.itemgetter(*positions), function._run, len(positions) > 1

    def fast(values: tuple) -> Any:
        return run(None, take(values) if several else (take(values),), plan)

    native = getattr(plan.launch, "native", None)
    if (_fastpath is None or native is None or plan.accepts is not torch.Tensor.is_contiguous
            or len(native.slots) + len(native.sizes) + 1 > _fastpath.MAX_ARGS):
        return fast
    returned = native.returns if function._single else tuple(native.returns[i] for i in function.fn.returns)
    single = len(returned) == 1
    launch = _fastpath.Launch(fast, plan, positions, native, returned, single)
    plan.natives.append(launch)
    return launch


def _front_again(front: Callable[..., Any], positional: int, names: tuple[str, ...]) -> Callable[[tuple], Any]:
    """A fast call that runs ``front`` as written on a call's values: its ``positional`` arguments
    (then a front's context, if any), then the values of its keyword arguments ``names``."""
    if not names:
        return lambda values: front(*values[:positional])
    return lambda values: front(*values[:positional], **dict(zip(names, values[-len(names):], strict=True)))


_fast_paths: list[dict] = []  # every front's and function's fast calls, for forget_fast_paths()


def forget_fast_paths() -> None:
    """Forget every front's fast calls (see :func:`drop_in`): the next call of each signature runs
    its front again and finds its plan anew. For code that replaces the functions' plans (tests that
    swap other kernels in), whose fast calls would otherwise keep running the plans they replaced."""
    for calls in _fast_paths:
        calls.clear()


def drop_in(front: Callable[..., Any] | None = None, *, by_layout: bool = False,
            context: Callable[[], Hashable] | None = None) -> Callable[..., Any]:
    """Decorate ``front``, a function with torch's signature that puts a call into the canonical
    form of a :class:`DropIn` and calls it, with an eager fast path: a call whose argument
    signature (tensor shapes, dtypes and devices; every other value) was seen before, and whose
    first call launched our kernel on the front's own tensors and returned its result as it was,
    launches that kernel at once, with none of the front's work or the DropIn's (model code calls
    one signature many times). Every other call runs ``front`` as written. ``by_layout``
    (``@drop_in(by_layout=True)``): the front's canonical form depends on its tensors' memory
    layouts too (a convolution returns the layout torch's returns for them), so their strides join
    the signature. ``context``: a global setting the front reads (a backend flag), whose value
    joins the signature too."""
    if front is None:
        return functools.partial(drop_in, by_layout=by_layout, context=context)
    fast_calls: dict[tuple, Callable[[tuple], Any]] = {}
    _fast_paths.append(fast_calls)

    @functools.wraps(front)
    def call(*args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active():
            return front(*args, **kwargs)
        keyed = args if context is None else (*args, context())
        result = fast_call(fast_calls, keyed, kwargs, by_layout)
        if result is not _MISS:
            return result
        key = signature(keyed, kwargs, by_layout)
        if key is None or not _hashable(key):
            return front(*args, **kwargs)
        values = (*keyed, *kwargs.values()) if kwargs else keyed
        outer = _front_calls.recorder
        _front_calls.recorder = recorded = []
        try:
            result = front(*args, **kwargs)
        finally:
            _front_calls.recorder = outer
        if len(recorded) == 1:
            function, plan, tensors, returned = recorded[0]
            positions = tuple(next((i for i, v in enumerate(values) if v is t), -1) for t in tensors)
            if -1 not in positions and _same(result, returned):
                fast_calls[key] = _fast_launch(function, plan, positions)
        elif not recorded and not any(isinstance(v, torch.Tensor) and type(v) not in _PLAIN for v in values):
            # Torch's function ran the call as it is (a form our ops do not take): later calls of
            # the signature run the front at once, without this path's Python work (F.normalize
            # over dims (0, 2): 5 us a call more than torch's, H100 host). Not for tensor
            # subclasses, which key by identity: one entry a tensor.
            fast_calls[key] = _front_again(front, len(args), tuple(kwargs))
        return result

    return call


def _hashable(key: tuple) -> bool:
    try:
        hash(key)
    except TypeError:  # an unhashable argument (a list): no fast path for it
        return False
    return True


# -- the front's fast path: the C one (npuops._fastpath) where it was built, else the same in Python
_MISS = object()  # no fast call filed for a call (or none can be: a gradient, an unhashable argument)


def _signature(args: tuple, kwargs: dict, by_layout: bool) -> tuple | None:
    """The key a front files a call's fast call under; None where a tensor needs a gradient.
    Tensors by shape, dtype and device (and strides, ``by_layout``); other values with their
    type, so that True is not 1 and a tuple holding a bool or a float (which torch refuses as
    int[]) not one of ints; a tuple of ints as it is (no other value's key is one); a list by its
    items (``dim=[0, 2]``), as they are at each call."""
    values = (*args, *kwargs.values()) if kwargs else args
    grad, key = torch.is_grad_enabled(), [tuple(kwargs)] if kwargs else []
    for value in values:
        kind = type(value)
        if kind in _PLAIN:
            if grad and value.requires_grad:
                return None
            key.append((value.shape, value.dtype, value.device, value.stride()) if by_layout
                       else (value.shape, value.dtype, value.device))
        elif kind is tuple:
            types = tuple(map(type, value))
            key.append(value if all(t is int for t in types) else (value, types))
        elif kind is list:  # hashable, and not the tuple of the same items
            key.append((list, tuple(value), tuple(map(type, value))))
        else:
            key.append((kind, value))
    return tuple(key)


def _fast_call(fast_calls: dict, args: tuple, kwargs: dict, by_layout: bool) -> Any:
    """The result of the fast call filed under the call's key, else ``_MISS``."""
    key = _signature(args, kwargs, by_layout)
    try:
        fast = None if key is None else fast_calls.get(key)
    except TypeError:
        fast = None
    return _MISS if fast is None else fast((*args, *kwargs.values()) if kwargs else args)


try:
    from . import _fastpath
except ImportError:  # installed without a C compiler
    _fastpath = None
    signature, fast_call = _signature, _fast_call
else:
    _fastpath.configure(_PLAIN, torch.is_grad_enabled, torch.empty_like, torch.empty, _front_calls, _MISS)
    signature, fast_call = _fastpath.signature, _fastpath.call


def _same(result: Any, returned: Any) -> bool:
    if isinstance(result, tuple):
        return isinstance(returned, tuple) and len(result) == len(returned) and all(
            a is b for a, b in zip(result, returned))
    return result is returned
