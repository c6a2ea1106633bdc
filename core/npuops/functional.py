"""Ops as functions for model code, shared by the family plugins.

:func:`define_function` registers a ``torch.library`` custom op that computes an npuops op: our
kernel (tier ``ours``) on CUDA where it covers the call, the op's torch formulation anywhere else,
and — as the fake implementation that lets ``torch.compile`` trace it — the torch formulation
again, run on fake tensors, so output shapes always agree with PyTorch's. Inputs are checked against
what the op expects for the call's shapes (``make_inputs`` on the meta device): a wrong dtype,
shape or device raises a ValueError that says what was expected, and a bad parameter the op's own
workload validation message.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .data import InputRNG
from .errors import WorkloadError
from .kernels import layout_problem
from .workload import Workload, dtype_name

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@functools.cache
def _registry():
    from .registry import load_registry

    return load_registry()


@dataclass(frozen=True)
class OpFunction:
    """One function: ``schema`` is the custom op's (``"(Tensor x, Tensor weight, float eps=1e-06)
    -> Tensor"``); ``inputs`` its tensor arguments in order, the first filling the workload shape
    ``shape_name``; ``params`` the other arguments with their defaults, in order (they become the
    workload's params); ``returns`` which of the op's outputs the function returns."""

    namespace: str
    name: str
    op: str
    schema: str
    inputs: tuple[str, ...]
    params: tuple[tuple[str, Any], ...] = ()
    shape_name: str = "x"
    mutates: tuple[str, ...] = ()
    returns: tuple[int, ...] = (0,)

    @property
    def qualname(self) -> str:
        return f"{self.namespace}::{self.name}"


def _frozen(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


@functools.lru_cache(maxsize=512)
def _signature(fn: OpFunction, device: torch.device, tensors: tuple, params: tuple):
    """(our kernel or None, the torch formulation, expected (shape, dtype) per input) for one call
    signature, given (name, shape, dtype) per tensor argument; built once, then cached."""
    registry = _registry()
    op = registry.op(fn.op)
    (_, shape, dtype), *others = tensors
    # The first tensor fills the workload's main shape; others the op names as workload tensors
    # (top-k's starts and ends) too, with their dtype where it differs.
    named = {name: (s, d) for name, s, d in others if name in op.required_tensors + op.optional_tensors}
    w = Workload(fn.op, "call", "call", dtype_name(dtype), {fn.shape_name: shape, **{n: s for n, (s, _) in named.items()}},
                 params={k: v for k, v in params if v is not None},
                 shape_dtypes={n: dtype_name(d) for n, (_, d) in named.items() if d != dtype})
    try:
        op.validate(w)
    except WorkloadError as exc:
        raise ValueError(f"{fn.name}: {exc}") from None
    expected = {name: (tuple(t.shape), t.dtype) for name, t in op.make_inputs(w, InputRNG("meta")).items()}
    kernel = None
    if device.type == "cuda":
        ours = [i for i in registry.impls_for(fn.op) if i.tier == "ours"]
        if ours and ours[0].why_not(op, w, registry.device("cuda")) is None:
            kernel = ours[0].build(op, w, device)
    return kernel, op.torch_impl(w), expected


def _bind(fn: OpFunction, args: tuple, kwargs: dict) -> tuple[dict[str, torch.Tensor], tuple]:
    tensors = dict(zip(fn.inputs, args[: len(fn.inputs)], strict=True))
    given = dict(zip((p for p, _ in fn.params), args[len(fn.inputs):]), **kwargs)
    params = tuple((p, _frozen(given.get(p, default))) for p, default in fn.params)
    first = tensors[fn.inputs[0]]
    if first.dtype not in FLOAT_DTYPES or first.dim() < 1:
        raise ValueError(f"{fn.name}: {fn.inputs[0]} must be a bf16, f16 or f32 tensor with at least one dim, "
                         f"got {first.dtype} of shape {list(first.shape)}")
    return tensors, params


def _described(tensors: dict[str, torch.Tensor]) -> tuple:
    return tuple((name, tuple(int(size) for size in t.shape), t.dtype) for name, t in tensors.items())


def _check(fn: OpFunction, tensors: dict[str, torch.Tensor], expected: dict[str, tuple]) -> None:
    first_name = fn.inputs[0]
    first = tensors[first_name]
    for name, t in tensors.items():
        shape, dtype = expected[name]
        if t.device != first.device:
            raise ValueError(f"{fn.name}: {name} is on {t.device} but {first_name} is on {first.device}; use one device")
        if tuple(t.shape) != shape:
            raise ValueError(f"{fn.name}: {name} must have shape {list(shape)} (given {first_name} "
                             f"{list(first.shape)}), got {list(t.shape)}")
        if t.dtype != dtype:
            raise ValueError(f"{fn.name}: {name} must be {dtype} (as {first_name}), got {t.dtype}")


def _pick(fn: OpFunction, outputs: Any, tensors: dict[str, torch.Tensor]) -> Any:
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    picked = tuple(outputs[i] for i in fn.returns)
    # A custom op's outputs may not alias its inputs; kernels allocate theirs, a torch formulation
    # may hand back a view, so copy only in that case.
    picked = tuple(o.clone() if any(torch._C._is_alias_of(o, t) for t in tensors.values()) else o for o in picked)
    return picked[0] if len(picked) == 1 else picked


def define_function(fn: OpFunction) -> Callable[..., Any]:
    def resolve(args, kwargs):
        """(tensors, the kernel this call runs or None, the torch formulation), inputs checked."""
        tensors, params = _bind(fn, args, kwargs)
        first = tensors[fn.inputs[0]]
        kernel, formulation, expected = _signature(fn, first.device, _described(tensors), params)
        _check(fn, tensors, expected)
        # Strided or misaligned views take the torch path rather than a copy.
        if any(layout_problem(t) for t in tensors.values()):
            kernel = None
        return tensors, kernel, formulation

    def compute(*args, **kwargs):
        tensors, kernel, formulation = resolve(args, kwargs)
        return _pick(fn, (kernel or formulation)(**tensors), tensors)

    def kernel_for(*args, **kwargs):
        """The kernel a call with these arguments runs (None: the torch formulation)."""
        return resolve(args, kwargs)[1]

    def fake(*args, **kwargs):
        tensors, params = _bind(fn, args, kwargs)
        # The workload needs concrete sizes (symbolic ones specialize here); the formulation
        # itself runs on the fake, possibly symbolic, tensors.
        _, formulation, _ = _signature(fn, torch.device("meta"), _described(tensors), params)
        return _pick(fn, formulation(**tensors), tensors)

    op = torch.library.custom_op(fn.qualname, compute, mutates_args=fn.mutates, schema=fn.schema)
    op.register_fake(fake)
    op.kernel_for = kernel_for
    return op
