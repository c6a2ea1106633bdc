"""The norms as functions to call from model code, registered as ``torch.library`` custom ops
(namespace ``npuops_norm``) with fake implementations, so they trace through ``torch.compile``.

On a CUDA tensor with TileLang available they run our kernel (compiled once per shape, dtype and
parameters, then cached); anywhere else, where the kernel does not cover a case, or for a strided
or misaligned view, the op's torch formulation. Inputs are checked first: a wrong dtype, shape or device raises a ValueError that
says what was expected.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from npuops import InputRNG, Workload, WorkloadError, discover_op_classes
from npuops.kernels import layout_problem
from npuops.workload import dtype_name

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@functools.cache
def _registry():
    from npuops.registry import load_registry

    return load_registry()


@dataclass(frozen=True)
class _Api:
    name: str  # the function's name, also the custom op's
    op: str  # the npuops op it computes
    inputs: tuple[str, ...]  # tensor arguments, in order; the first gives the workload's x
    params: tuple[tuple[str, float | int], ...]  # scalar arguments with their defaults, in order
    schema: str
    mutates: tuple[str, ...] = ()
    # Which of the op's outputs the function returns (fused adds update residual in place instead).
    returns: tuple[int, ...] = (0,)


def _check_inputs(api: _Api, tensors: dict[str, torch.Tensor], expected: dict[str, tuple]) -> None:
    x_name = api.inputs[0]
    x = tensors[x_name]
    for name, t in tensors.items():
        shape, dtype = expected[name]
        if t.device != x.device:
            raise ValueError(f"{api.name}: {name} is on {t.device} but {x_name} is on {x.device}; use one device")
        if tuple(t.shape) != shape:
            raise ValueError(f"{api.name}: {name} must have shape {list(shape)} (given {x_name} "
                             f"{list(x.shape)}), got {list(t.shape)}")
        if t.dtype != dtype:
            raise ValueError(f"{api.name}: {name} must be {dtype} (as {x_name}), got {t.dtype}")


@functools.lru_cache(maxsize=256)
def _signature(api: _Api, device: torch.device, x_shape: tuple, dtype: torch.dtype, params: tuple):
    """(kernel or None, torch formulation, expected input shapes and dtypes) for one signature."""
    registry = _registry()
    op = registry.op(api.op)
    w = Workload(api.op, "api", "api", dtype_name(dtype), {"x": x_shape}, params=dict(params))
    try:
        op.validate(w)
    except WorkloadError as exc:
        raise ValueError(f"{api.name}: {exc}") from None
    expected = {name: (tuple(t.shape), t.dtype) for name, t in op.make_inputs(w, InputRNG("meta")).items()}
    kernel = None
    if device.type == "cuda":
        impl = registry.implementation(api.op, "tilelang")
        if impl.why_not(op, w, registry.device("cuda")) is None:
            kernel = impl.build(op, w, device)
    return kernel, op.torch_impl(w), expected


def _define(api: _Api, fake: Callable) -> Callable:
    def compute(*args, **kwargs):
        tensors = dict(zip(api.inputs, args[: len(api.inputs)], strict=True))
        given = dict(zip((p for p, _ in api.params), args[len(api.inputs):]), **kwargs)
        params = tuple((p, given.get(p, default)) for p, default in api.params)
        x = tensors[api.inputs[0]]
        if x.dtype not in FLOAT_DTYPES or x.dim() < 1:
            raise ValueError(f"{api.name}: {api.inputs[0]} must be a bf16, f16 or f32 tensor with at least one "
                             f"dim, got {x.dtype} of shape {list(x.shape)}")
        kernel, formulation, expected = _signature(api, x.device, tuple(x.shape), x.dtype, params)
        _check_inputs(api, tensors, expected)
        # Strided or misaligned views take the torch path rather than a copy.
        takes = kernel is not None and not any(layout_problem(t) for t in tensors.values())
        outputs = (kernel if takes else formulation)(**tensors)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        picked = tuple(outputs[i] for i in api.returns)
        # A custom op's outputs may not alias its inputs; kernels allocate theirs, torch's
        # formulation may hand back a view, so copy only in that case.
        picked = tuple(o.clone() if any(o.data_ptr() == t.data_ptr() for t in tensors.values()) else o for o in picked)
        return picked[0] if len(picked) == 1 else picked

    op = torch.library.custom_op(f"npuops_norm::{api.name}", compute, mutates_args=api.mutates, schema=api.schema)
    op.register_fake(fake)
    return op


def _like_first(*args):
    return torch.empty_like(args[0])


def _like_first_two(a, b, *rest):
    return torch.empty_like(a), torch.empty_like(b)


def _quant_fake(x, *rest):
    return torch.empty_like(x, dtype=torch.int8), x.new_empty((*x.shape[:-1], 1), dtype=torch.float32)


_OP_CLASSES = {cls.name: cls for cls in discover_op_classes("npuops_norm.ops")}


def _api(name, op, inputs, params, outputs="Tensor", mutates=(), returns=(0,)):
    """The function's schema, its scalar defaults taken from the op's own parameters."""
    args = [f"Tensor{'(a!)' if n in mutates else ''} {n}" for n in inputs]
    defaults = tuple((p, _OP_CLASSES[op].params[p].default) for p in params)
    args += [f"{'int' if isinstance(d, int) else 'float'} {p}={d!r}" for p, d in defaults]
    return _Api(name, op, tuple(inputs), defaults, f"({', '.join(args)}) -> {outputs}", tuple(mutates), returns)


rms_norm = _define(_api("rms_norm", "RMSNormFwd", ["x", "weight"], ["eps"]), _like_first)
layer_norm = _define(_api("layer_norm", "LayerNormFwd", ["x", "weight", "bias"], ["eps"]), _like_first)
gemma_rms_norm = _define(_api("gemma_rms_norm", "GemmaRMSNormFwd", ["x", "weight"], ["eps"]), _like_first)
group_rms_norm = _define(_api("group_rms_norm", "GroupRMSNormFwd", ["x", "weight"], ["eps", "groups"]), _like_first)
fused_add_rms_norm = _define(_api("fused_add_rms_norm", "FusedAddRMSNormFwd", ["x", "residual", "weight"], ["eps"],
                                  mutates=("residual",)), _like_first)
fused_add_layer_norm = _define(_api("fused_add_layer_norm", "FusedAddLayerNormFwd", ["x", "residual", "weight", "bias"],
                                    ["eps"], mutates=("residual",)), _like_first)
rms_norm_quant = _define(_api("rms_norm_quant", "RMSNormQuantFwd", ["x", "weight"], ["eps"], "(Tensor, Tensor)",
                              returns=(0, 1)), _quant_fake)
layer_norm_quant = _define(_api("layer_norm_quant", "LayerNormQuantFwd", ["x", "weight", "bias"], ["eps"],
                                "(Tensor, Tensor)", returns=(0, 1)), _quant_fake)
qk_norm = _define(_api("qk_norm", "QKNormFwd", ["q", "k", "q_weight", "k_weight"], ["eps"], "(Tensor, Tensor)",
                       returns=(0, 1)), _like_first_two)
ada_layer_norm = _define(_api("ada_layer_norm", "AdaLayerNormFwd", ["x", "shift", "scale"], ["eps", "batch"]), _like_first)
weight_norm = _define(_api("weight_norm", "WeightNormFwd", ["v", "g"], []), _like_first)
l2_norm = _define(_api("l2_norm", "L2NormFwd", ["x"], ["eps"]), _like_first)
l1_norm = _define(_api("l1_norm", "L1NormFwd", ["x"], ["eps"]), _like_first)

