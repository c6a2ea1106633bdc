"""The norms as functions to call from model code (see :mod:`npuops.functional`: our kernel on
CUDA where it covers the call, torch's formulation for every other call and for tracing).

``rms_norm``, ``layer_norm``, ``normalize``, ``batch_norm``, ``instance_norm`` and ``group_norm``
are drop-ins for ``torch.nn.functional``'s: the same arguments, the same results (running
statistics updated in place as torch updates them). The others are ops torch has no function for
(vLLM's fused residual norms, the quantizing norms, ...); their scalar defaults are their op's
parameter defaults, and a wrong input gets a ValueError that says what was expected.

Gradients: ``rms_norm``, ``layer_norm`` and the channel norms' backward runs the backward ops
(RMSNormBwd, LayerNormBwd, BatchNormBwd, InstanceNormBwd, GroupNormBwd) as functions too, so our
kernels where they cover the call and torch's formulation elsewhere; statistics the forward kernel
does not return (the row norms', instance norm's) are recomputed from x.
"""

import torch
import torch.nn.functional as F
from npuops import OpFunction, define_function, discover_op_classes, drop_in, torch_call

from .ops._stat_norm import mean_invstd
from .ops.rms_norm_bwd import rms_rstd

_OP_CLASSES = {cls.name: cls for cls in discover_op_classes("npuops_norm.ops")}


def _function(name, op, inputs, params=("eps",), outputs="Tensor", mutates=(), returns=(0,), fallback=None,
              state=(), backward=None, constants=None):
    """``op`` as a function of ``inputs`` and ``params`` (defaults: the op's); ``state``: inputs the op
    updates that the schema's ``outputs`` return after the function's ``returns``; ``constants``: the
    op's params every call of this function has."""
    defaults = tuple((p, _OP_CLASSES[op].params[p].default) for p in params)
    args = [f"Tensor{'(a!)' if n in mutates else ''} {n}" for n in inputs]
    args += [f"{'int' if isinstance(d, int) else 'float'} {p}={d!r}" for p, d in defaults]
    schema = f"({', '.join(args)}) -> {outputs}"
    return define_function(OpFunction("npuops_norm", name, op, schema, tuple(inputs), defaults,
                                      mutates=tuple(mutates), returns=returns, fallback=fallback,
                                      constants=tuple((constants or {}).items()), state=tuple(state),
                                      backward=backward))


def _tensors(n: int) -> str:
    return "Tensor" if n == 1 else f"({', '.join(['Tensor'] * n)})"


# The backward ops as functions (our kernel where it covers the call, the op's torch formulation
# elsewhere), called by the forward functions' backward below.
_rms_norm_grads = _function("rms_norm_backward", "RMSNormBwd", ["grad_out", "x", "weight", "rstd"], params=(),
                            outputs=_tensors(2), returns=(0, 1))
_layer_norm_grads = _function("layer_norm_backward", "LayerNormBwd", ["grad_out", "x", "weight", "bias", "mean", "rstd"],
                              params=(), outputs=_tensors(3), returns=(0, 1, 2))
_batch_norm_grads = _function("batch_norm_backward", "BatchNormBwd",
                              ["grad_out", "x", "weight", "save_mean", "save_invstd"], outputs=_tensors(3),
                              returns=(0, 1, 2))
_instance_norm_grads = {
    affine: _function(f"instance_norm{'_affine' if affine else ''}_backward", "InstanceNormBwd",
                      ["grad_out", "x", "save_mean", "save_invstd", *(["weight"] if affine else [])],
                      outputs=_tensors(3 if affine else 1), returns=(0, 1, 2) if affine else (0,),
                      constants={"affine": affine})
    for affine in (False, True)}
_group_norm_grads = {
    affine: _function(f"group_norm{'_affine' if affine else ''}_backward", "GroupNormBwd",
                      ["grad_out", "x", "mean", "rstd", *(["weight"] if affine else [])], params=("num_groups",),
                      outputs=_tensors(3 if affine else 1), returns=(0, 1, 2) if affine else (0,),
                      constants={"affine": affine})
    for affine in (False, True)}


# Each forward function's backward: backward(inputs, params, outputs, grads) -> a gradient per
# tensor input (see npuops.OpFunction.backward). Autograd may hand over a gradient with any strides
# (an expanded one from .sum()); our kernels take contiguous ones, as torch's backward kernels make
# them.
def _as_rows(x, grad_out):
    """x and grad_out as [rows, hidden] (the backward ops sum the affine's gradient over row dims,
    which a call over every dim of x has none of), or None for an empty x (torch's derivative)."""
    if x.numel() == 0:
        return None
    return x.reshape(-1, x.shape[-1]), grad_out.reshape(-1, x.shape[-1]).contiguous()


def _rms_norm_backward(inputs, params, outputs, grads):
    x, rows = inputs["x"], _as_rows(inputs["x"], grads[0])
    if rows is None:
        return None
    x_rows, grad_rows = rows  # the row kernel saves no statistic: rstd recomputed
    grad_x, grad_weight = _rms_norm_grads(grad_rows, x_rows, inputs["weight"], rms_rstd(x_rows, -1, params["eps"]))
    return grad_x.view(x.shape), grad_weight


def _layer_norm_backward(inputs, params, outputs, grads):
    x, rows = inputs["x"], _as_rows(inputs["x"], grads[0])
    if rows is None:
        return None
    x_rows, grad_rows = rows
    mean, rstd = mean_invstd(x_rows, -1, params["eps"], keepdim=True)
    grad_x, grad_weight, grad_bias = _layer_norm_grads(grad_rows, x_rows, inputs["weight"], inputs["bias"], mean, rstd)
    return grad_x.view(x.shape), grad_weight, grad_bias


# The ops behind the drop-ins: rows normalized over their last dim. Calls the op cannot express
# (mixed dtypes, say) go to torch's function as they are.
_rms_norm = _function("rms_norm", "RMSNormFwd", ["x", "weight"], backward=_rms_norm_backward,
                      fallback=lambda x, weight, eps: F.rms_norm(x, x.shape[-1:], weight, eps))
_layer_norm = _function("layer_norm", "LayerNormFwd", ["x", "weight", "bias"], backward=_layer_norm_backward,
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


def default_eps(dtype: torch.dtype) -> float:
    """rms_norm's eps where none is given: the dtype's machine epsilon (as torch's)."""
    return _EPSILONS.get(dtype) or torch.finfo(dtype).eps


@drop_in
def rms_norm(input, normalized_shape, weight=None, eps=None):
    """``torch.nn.functional.rms_norm``: y = x / sqrt(mean(x², normalized dims) + eps) * weight,
    eps by default the input dtype's machine epsilon (as torch's)."""
    shape = _trailing(input, normalized_shape, weight) if weight is not None else None
    if shape is None:
        return torch_call("rms_norm", "no weight or not the trailing dims", F.rms_norm, input, normalized_shape,
                          weight, eps)
    if eps is None:
        eps = default_eps(input.dtype)
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
    dims = _dims(dim)
    if out is not None or p not in (1, 2) or dims is None:
        return torch_call("normalize", "out given, p not 1 or 2, or dim not an int or a list of ints", F.normalize,
                          input, p, dim, eps, out)
    return (l2_norm if p == 2 else l1_norm)(input, float(eps), dims)


def _dims(dim) -> int | tuple[int, ...] | None:
    """``dim`` as the ops take it: an int, or several as a tuple (the norm over all of them, as
    ``Tensor.norm`` takes a list); None for anything else."""
    if _an_int(dim):
        return dim
    if type(dim) in (list, tuple) and dim and all(_an_int(d) for d in dim):
        return tuple(dim)
    return None


def _an_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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


# -- the channel norms ----------------------------------------------------------------------------
# x: [N, C, *spatial], statistics per channel (batch norm), per (n, c) (instance norm) or per
# (n, group) (group norm). Each function covers the forms our kernels take (an affine given whole
# or not at all, the dtypes torch's mixed precision uses) and passes every other call to torch's
# function as it is, which computes it or raises as torch does.
def _batch_norm_backward(inputs, params, outputs, grads):
    _, save_mean, save_invstd = outputs[:3]
    grad_x, grad_weight, grad_bias = _batch_norm_grads(grads[0].contiguous(), inputs["x"], inputs["weight"],
                                                       save_mean, save_invstd, params["eps"])
    return grad_x, grad_weight, grad_bias, None, None


def _instance_norm_backward(inputs, params, outputs, grads):
    x, weight = inputs["x"], inputs.get("weight")
    # The op returns no statistics (F.instance_norm exposes none): recomputed per (n, c).
    save_mean, save_invstd = mean_invstd(x.reshape(x.shape[0] * x.shape[1], -1), 1, params["eps"])
    affine = weight is not None
    found = _instance_norm_grads[affine](grads[0].contiguous(), x, save_mean, save_invstd,
                                         *([weight] if affine else []), params["eps"])
    running = (None, None) if "running_mean" in inputs else ()  # state: no gradient
    return (*(found if affine else (found,)), *running)


def _group_norm_backward(inputs, params, outputs, grads):
    _, mean, rstd = outputs
    weight = inputs.get("weight")
    affine = weight is not None
    found = _group_norm_grads[affine](grads[0].contiguous(), inputs["x"], mean, rstd, *([weight] if affine else []),
                                      params["num_groups"])
    return found if affine else (found,)


_AFFINE, _RUNNING = ["weight", "bias"], ["running_mean", "running_var"]
# Training: y and the saved statistics, the running statistics updated (state).
_batch_norm_train = _function("batch_norm_train", "BatchNormFwd", ["x", *_AFFINE, *_RUNNING], ("eps", "momentum"),
                              outputs=_tensors(5), returns=(0, 1, 2), state=_RUNNING, backward=_batch_norm_backward)
_batch_norm_eval = _function("batch_norm_eval", "BatchNormInferenceFwd", ["x", *_AFFINE, *_RUNNING])
_instance_norms = {
    (affine, running): _function(
        "instance_norm" + "_affine" * affine + "_running" * running, "InstanceNormFwd",
        ["x", *_AFFINE * affine, *_RUNNING * running], ("eps", "momentum"), outputs=_tensors(1 + 2 * running),
        state=_RUNNING * running, backward=_instance_norm_backward,
        constants={"affine": affine, "running_stats": running})
    for affine in (False, True) for running in (False, True)}
_group_norms = {
    affine: _function("group_norm" + "_affine" * affine, "GroupNormFwd", ["x", *_AFFINE * affine],
                      ("num_groups", "eps"), outputs=_tensors(3), returns=(0, 1, 2), backward=_group_norm_backward,
                      constants={"affine": affine})
    for affine in (False, True)}

_KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # x's, where a parameter may be f32 beside it


def _number(value) -> bool:
    return type(value) in (int, float)


def _channel_input(input, least_dims: int) -> bool:
    return (type(input) in (torch.Tensor, torch.nn.Parameter) and input.is_floating_point()
            and input.dim() >= least_dims and input.numel() > 0)


def _per_channel(input, *tensors, dtypes=None) -> bool:
    """Each of ``tensors`` a floating tensor of [C] on ``input``'s device, in one of ``dtypes``
    (default: any)."""
    c = input.shape[1]
    return all(isinstance(t, torch.Tensor) and t.shape == (c,) and t.device == input.device
               and t.is_floating_point() and (dtypes is None or t.dtype in dtypes) for t in tensors)


def _affine_of(input, weight, bias) -> bool | None:
    """Whether an affine is given (True), not given (False), or given in a form the op does not
    take (None: one of the two, or a dtype other than x's or f32 beside 16-bit x)."""
    if weight is None and bias is None:
        return False
    if weight is None or bias is None or not _per_channel(input, weight, bias) or weight.dtype != bias.dtype:
        return None
    return True if weight.dtype == input.dtype or (weight.dtype == torch.float32 and input.dtype in _KERNEL_DTYPES) \
        else None


def _running_of(input, running_mean, running_var) -> bool | None:
    if running_mean is None and running_var is None:
        return False
    if not _per_channel(input, running_mean, running_var) or running_mean.requires_grad or running_var.requires_grad:
        return None
    return True


def _values_per_unit(input, first: int) -> int:
    """Elements of x a statistic covers beside the spatial ones (``first``: N, 1, or C/groups x N)."""
    count = first
    for size in input.shape[2:]:
        count *= size
    return count


_UNIT_AFFINES: dict[tuple[int, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}


def _unit_affine(input) -> tuple[torch.Tensor, torch.Tensor] | None:
    """f32 ones and zeros of [C] on x's device, made once a (C, device): the weight and bias our
    batch norm kernels take where a call gives none (torch's: no weight is 1, no bias 0). None
    while a CUDA graph is captured and they are not made yet: made inside a capture, they would
    hold nothing until the graph replays."""
    key = (input.shape[1], input.device)
    unit = _UNIT_AFFINES.get(key)
    if unit is None and not (input.is_cuda and torch.cuda.is_current_stream_capturing()):
        unit = _UNIT_AFFINES[key] = (torch.ones(key[0], device=key[1]), torch.zeros(key[0], device=key[1]))
    return unit


@drop_in
def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    """``torch.nn.functional.batch_norm``: per channel (dim 1), y = (x - mean) / sqrt(var + eps) *
    weight + bias; in training the batch's statistics, the running ones updated with ``momentum``
    (the variance unbiased); in eval the running ones."""
    kernel_weight, kernel_bias = weight, bias
    if (weight is None or bias is None) and _channel_input(input, 2) and (unit := _unit_affine(input)):
        kernel_weight, kernel_bias = unit[0] if weight is None else weight, unit[1] if bias is None else bias
    ours = (_channel_input(input, 2) and input.dtype in _KERNEL_DTYPES and _number(eps) and type(training) is bool
            and _per_channel(input, kernel_weight, kernel_bias, running_mean, running_var, dtypes=(torch.float32,))
            and not (running_mean.requires_grad or running_var.requires_grad))
    if ours and training:  # torch raises on the rest of these (one value a channel, eps <= 0)
        ours = _number(momentum) and eps > 0 and _values_per_unit(input, input.shape[0]) > 1
    if not ours or eps < 0:
        return torch_call("batch_norm", "no running statistics, or a weight, bias or running statistics not f32 "
                          "beside f32, bf16 or f16 x", F.batch_norm, input, running_mean, running_var, weight, bias,
                          training, momentum, eps)
    if training:
        return _batch_norm_train(input, kernel_weight, kernel_bias, running_mean, running_var, float(eps),
                                 float(momentum))[0]
    return _batch_norm_eval(input, kernel_weight, kernel_bias, running_mean, running_var, float(eps))


@drop_in
def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats=True,
                  momentum=0.1, eps=1e-5):
    """``torch.nn.functional.instance_norm``: per (n, c), y = (x - mean) / sqrt(var + eps) * weight +
    bias with x[n, c]'s statistics (``use_input_stats``; the running ones, given, updated with the
    mean over n of them) or the running ones."""
    if use_input_stats is False and _channel_input(input, 3):  # the running statistics: batch norm's eval
        return batch_norm(input, running_mean, running_var, weight, bias, False, momentum, eps)
    affine, running = _affine_of(input, weight, bias), _running_of(input, running_mean, running_var)
    if (use_input_stats is not True or not _channel_input(input, 3) or affine is None or running is None
            or not _number(eps) or not _number(momentum) or _values_per_unit(input, 1) < 2):
        return torch_call("instance_norm", "a form our op does not take (half an affine or running statistics, "
                          "mixed dtypes, one spatial element)", F.instance_norm, input, running_mean, running_var,
                          weight, bias, use_input_stats, momentum, eps)
    tensors = (input, *((weight, bias) if affine else ()), *((running_mean, running_var) if running else ()))
    return _instance_norms[affine, running](*tensors, float(eps), float(momentum))


@drop_in
def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    """``torch.nn.functional.group_norm``: per (n, group of C/num_groups consecutive channels),
    y = (x - mean) / sqrt(var + eps), then * weight[c] + bias[c]."""
    affine = _affine_of(input, weight, bias) if isinstance(input, torch.Tensor) and input.dim() >= 2 else None
    if (affine is None or not _channel_input(input, 2) or type(num_groups) is not int or num_groups < 1
            or input.shape[1] % num_groups or not _number(eps)
            or _values_per_unit(input, input.shape[0] * input.shape[1] // num_groups) == 1):
        return torch_call("group_norm", "a form our op does not take (half an affine, mixed dtypes, groups not "
                          "dividing C)", F.group_norm, input, num_groups, weight, bias, eps)
    return _group_norms[affine](input, *((weight, bias) if affine else ()), num_groups, float(eps))[0]
