"""The norms as functions to call from model code (see :mod:`npuops.functional`: our kernel on
CUDA where it covers the call, torch's formulation for every other call and for tracing).

``rms_norm``, ``layer_norm`` and ``normalize`` are drop-ins for ``torch.nn.functional``'s: the same
arguments, the same results. The others are ops torch has no function for (vLLM's fused residual
norms, the quantizing norms, ...); their scalar defaults are their op's parameter defaults, and a
wrong input gets a ValueError that says what was expected.
"""

import torch
import torch.nn.functional as F
from npuops import OpFunction, define_function, discover_op_classes, drop_in, torch_call

_OP_CLASSES = {cls.name: cls for cls in discover_op_classes("npuops_norm.ops")}


def _function(name, op, inputs, params=("eps",), outputs="Tensor", mutates=(), returns=(0,), fallback=None):
    defaults = tuple((p, _OP_CLASSES[op].params[p].default) for p in params)
    args = [f"Tensor{'(a!)' if n in mutates else ''} {n}" for n in inputs]
    args += [f"{'int' if isinstance(d, int) else 'float'} {p}={d!r}" for p, d in defaults]
    schema = f"({', '.join(args)}) -> {outputs}"
    return define_function(OpFunction("npuops_norm", name, op, schema, tuple(inputs), defaults,
                                      mutates=tuple(mutates), returns=returns, fallback=fallback))


# The ops behind the drop-ins: rows normalized over their last dim. Calls the op cannot express
# (mixed dtypes, say) go to torch's function as they are.
_rms_norm = _function("rms_norm", "RMSNormFwd", ["x", "weight"],
                      fallback=lambda x, weight, eps: F.rms_norm(x, x.shape[-1:], weight, eps))
_layer_norm = _function("layer_norm", "LayerNormFwd", ["x", "weight", "bias"],
                        fallback=lambda x, weight, bias, eps: F.layer_norm(x, x.shape[-1:], weight, bias, eps))
l2_norm = _function("l2_norm", "L2NormFwd", ["x"], params=("eps", "dim"),
                    fallback=lambda x, eps, dim: F.normalize(x, 2.0, dim, eps))
l1_norm = _function("l1_norm", "L1NormFwd", ["x"], params=("eps", "dim"),
                    fallback=lambda x, eps, dim: F.normalize(x, 1.0, dim, eps))


def _trailing(input, normalized_shape, *affine) -> tuple[int, ...] | None:
    """``normalized_shape`` as a tuple where the op takes it (the input's trailing dims of a floating
    input, with an affine of that shape and dtype); None where it does not. On every call of model
    code: a few attribute reads."""
    shape = (normalized_shape,) if type(normalized_shape) is int else tuple(normalized_shape)
    if not shape or not isinstance(input, torch.Tensor) or not input.is_floating_point() \
            or input.shape[-len(shape):] != shape:
        return None
    for t in affine:
        if not isinstance(t, torch.Tensor) or t.shape != shape or t.dtype != input.dtype:
            return None
    return shape


def _over_trailing(op, input, shape, *args):
    """``op`` over the trailing ``shape`` of ``input`` as one row dim (affines flattened alike)."""
    if len(shape) == 1:
        return op(input, *args)
    flat = [a.flatten() if isinstance(a, torch.Tensor) else a for a in args]
    return op(input.flatten(-len(shape)), *flat).view(input.shape)


_EPSILONS = {dtype: torch.finfo(dtype).eps for dtype in (torch.float64, torch.float32, torch.float16, torch.bfloat16)}


@drop_in
def rms_norm(input, normalized_shape, weight=None, eps=None):
    """``torch.nn.functional.rms_norm``: y = x / sqrt(mean(x², normalized dims) + eps) * weight,
    eps by default the input dtype's machine epsilon (as torch's)."""
    shape = _trailing(input, normalized_shape, weight) if weight is not None else None
    if shape is None:
        return torch_call("rms_norm", "no weight or not the trailing dims", F.rms_norm, input, normalized_shape,
                          weight, eps)
    if eps is None:
        eps = _EPSILONS.get(input.dtype) or torch.finfo(input.dtype).eps
    if len(shape) == 1:
        return _rms_norm(input, weight, float(eps))
    return _over_trailing(_rms_norm, input, shape, weight, float(eps))


@drop_in
def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """``torch.nn.functional.layer_norm``: y = (x - mean) / sqrt(var + eps) * weight + bias over the
    normalized dims."""
    shape = _trailing(input, normalized_shape, weight, bias) if weight is not None and bias is not None else None
    if shape is None:
        return torch_call("layer_norm", "no weight or bias, or not the trailing dims", F.layer_norm, input,
                          normalized_shape, weight, bias, eps)
    if len(shape) == 1:
        return _layer_norm(input, weight, bias, float(eps))
    return _over_trailing(_layer_norm, input, shape, weight, bias, float(eps))


@drop_in
def normalize(input, p=2.0, dim=1, eps=1e-12, out=None):
    """``torch.nn.functional.normalize``: x / max(||x||_p, eps) over ``dim``."""
    if out is not None or p not in (1, 2) or not isinstance(dim, int) or isinstance(dim, bool):
        return torch_call("normalize", "out given, or p not 1 or 2", F.normalize, input, p, dim, eps, out)
    return (l2_norm if p == 2 else l1_norm)(input, float(eps), dim)


gemma_rms_norm = _function("gemma_rms_norm", "GemmaRMSNormFwd", ["x", "weight"])
group_rms_norm = _function("group_rms_norm", "GroupRMSNormFwd", ["x", "weight"], ["eps", "groups"])
# residual += x in place; the function returns the norm (vLLM's fused_add_rms_norm)
fused_add_rms_norm = _function("fused_add_rms_norm", "FusedAddRMSNormFwd", ["x", "residual", "weight"],
                               mutates=["residual"])
fused_add_layer_norm = _function("fused_add_layer_norm", "FusedAddLayerNormFwd", ["x", "residual", "weight", "bias"],
                                 mutates=["residual"])
rms_norm_quant = _function("rms_norm_quant", "RMSNormQuantFwd", ["x", "weight"], outputs="(Tensor, Tensor)",
                           returns=(0, 1))
layer_norm_quant = _function("layer_norm_quant", "LayerNormQuantFwd", ["x", "weight", "bias"],
                             outputs="(Tensor, Tensor)", returns=(0, 1))
qk_norm = _function("qk_norm", "QKNormFwd", ["q", "k", "q_weight", "k_weight"], outputs="(Tensor, Tensor)",
                    returns=(0, 1))
ada_layer_norm = _function("ada_layer_norm", "AdaLayerNormFwd", ["x", "shift", "scale"], ["eps", "batch"])
weight_norm = _function("weight_norm", "WeightNormFwd", ["v", "g"], params=())
