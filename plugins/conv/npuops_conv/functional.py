"""The forward convolutions as functions for model code (see :mod:`npuops.functional`: our kernel on
CUDA where it covers the call, torch's formulation for every other call and for tracing).

``conv1d``, ``conv2d``, ``conv3d`` and ``conv_transpose2d`` are drop-ins for
``torch.nn.functional``'s: the same arguments (an int or one per spatial dim for stride, padding and dilation; ``padding="valid"`` or
``"same"``; unbatched inputs), the same results. ``conv1d_causal`` (left padding only),
``conv2d_bias_relu`` (the fused epilogue) and ``conv2d_fp8`` (e4m3 operands with per-tensor
scales, bf16 output) are ops torch has no function for.

A front puts a call into its op's canonical form (batched input, one int per spatial dim, numeric
padding) and calls the op's function, one per op and bias or none (``torch.ops.npuops_conv.*``);
what the op cannot express (integer or float64 inputs, a weight of the wrong shape) goes to torch's
function, which computes or raises as it does. Our kernels compute channels last ([N, *spatial, C]
rows; see :func:`npuops_conv.layouts.channels_last_kernel`). They take channels-last inputs
(``torch.channels_last``, ``channels_last_3d``; for conv1d, NLC storage such as
``x.transpose(1, 2)`` of a [N, L, C] tensor) as they are, with no conversion; NC[D]HW-contiguous
inputs are converted each call (the weight once, while it is unchanged). Inputs in neither layout
run torch's function. The forward functions return the layout torch's returns for the call
(:func:`npuops_conv.layouts.torch_output_layout`: channels last where the input or the weight is;
conv1d's NLC where its weight is), which the front passes as the op function's ``output_layout``:
the NC[D]HW view of the kernel's channels-last output, or an NC[D]HW-contiguous output the kernel
writes itself. ``conv_transpose2d`` likewise (torch's rule is the same for it; its kernel, the data
gradient's, writes each stride phase's rows to their input positions).

Float32: our kernels run TF32, as cuDNN does by default; with TF32 off for convolutions
(:func:`tf32_allowed`), the drop-ins' eager float32 calls and their backward run torch's function
(a call torch.compile traces does not read the setting: it runs our op).

Gradients: ``conv2d``'s and ``conv_transpose2d``'s backward runs our gradient ops as functions
(Conv2dDgrad, Conv2dWgrad; Conv2dFwd for a transposed conv's input), computing only the gradients
autograd asks for; the other functions differentiate through torch's derivative of their op's
formulation.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from npuops import OpFunction, batched, define_function, drop_in, int_tuple, torch_call, unbatched

from .layouts import CHANNELS_LAST, accepts, channels_last, torch_output_layout

_TORCH_CONVS = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_IEEE = "float32 with TF32 off (torch.backends.cudnn.conv.fp32_precision)"


def tf32_allowed() -> bool:
    """Whether torch's float32 convolutions may run in TF32 (cuDNN's default, which our float32
    kernels follow: their GEMMs take TF32 operands). Where a user turns it off, float32 calls run
    torch's IEEE convolution, as ``F.conv2d`` does then. Read per call (the fronts' fast paths key
    on it): the C getter, not the ``torch.backends`` property (5x the host time)."""
    precision = getattr(torch._C, "_get_fp32_precision_getter", None)
    if precision is not None:  # torch >= 2.9: "tf32", "ieee" or "none" (the legacy flag turned off)
        return precision("cuda", "conv") == "tf32"
    return torch._C._get_cudnn_allow_tf32()


def _ieee(x: Any) -> bool:
    """Whether ``x`` is float32 with TF32 off: not read while torch.compile traces (dynamo does not
    trace the getter), where the traced call runs our op."""
    return (isinstance(x, torch.Tensor) and x.dtype == torch.float32 and not torch.compiler.is_compiling()
            and not tf32_allowed())


_INTS = ("groups", "C_out", "kH", "kW")  # params that are one int (the others: see _declared)


def _declared(param: str, default: Any, dims: int) -> str:
    """``param`` in the custom op's schema: one int, the output layout (a str), or int[dims]."""
    if param in _INTS:
        return f"int {param}={default}"
    if param == "output_layout":
        return f'str {param}="{default}"'
    return f"int[{dims}] {param}={default}"


def _function(name: str, op: str, dims: int, inputs: tuple[str, ...], params: tuple[str, ...], *,
              bias: bool | None, outputs: int = 1, fallback=None, backward=None, shape_only: tuple[str, ...] = ()):
    """The op ``op`` as a function of the tensors ``inputs`` (the first fills the workload's
    ``input``) and then ``params`` in order (``_INTS`` one int each, ``output_layout`` the layout
    our kernel writes the output in, the others int[dims]), with ``outputs`` tensors; ``bias``: the
    workload's bias param (None: the op has none)."""
    params = tuple((p, CHANNELS_LAST if p == "output_layout" else 0 if "padding" in p else 1) for p in params)
    signature = ", ".join([*(f"Tensor {t}" for t in inputs), *(_declared(p, d, dims) for p, d in params)])
    returned = "Tensor" if outputs == 1 else f"({', '.join(['Tensor'] * outputs)})"
    return define_function(OpFunction("npuops_conv", name, op, f"({signature}) -> {returned}", inputs, params,
                                      shape_name="input", returns=tuple(range(outputs)),
                                      constants=() if bias is None else (("bias", bias),), fallback=fallback,
                                      backward=backward, shape_only=shape_only))


def _op(name: str, op: str, dims: int, *, bias: bool | None, tensors: tuple[str, ...] = (), padding: bool = True,
        fallback=None, params: tuple[str, ...] | None = None, backward=None):
    """The op ``op`` as a function of its canonical arguments: ``input``, ``weight``, ``tensors``
    (fp8 scales), ``bias`` when given (None: the op has no bias); then ``params`` in order, each
    int[dims] but ``groups`` (default: a forward convolution's stride, padding unless not
    ``padding``, dilation, groups and output_layout, which its front sets to torch's)."""
    inputs = ("input", "weight", *tensors, *(("bias",) if bias else ()))
    names = params or ("stride", *(("padding",) if padding else ()), "dilation", "groups", "output_layout")
    return _function(name, op, dims, inputs, names, bias=bias, fallback=fallback, backward=backward)


# -- gradients ------------------------------------------------------------------------------------
# conv2d's and conv_transpose2d's backward run our gradient ops as functions (our kernels where
# they cover the call, the op's torch formulation elsewhere): Conv2dDgrad (the input's gradient,
# from grad_output and the weight) and Conv2dWgrad (the weight's, and the bias's, from the input and
# grad_output). Their workloads describe the forward conv: the data gradient's function takes the
# forward input too, for its shape alone (a strided conv drops trailing rows, which grad_output's
# shape does not tell); the weight gradient's takes the weight's sizes (C_out, kH, kW) as ints.
_GEOMETRY = ("stride", "padding", "dilation", "groups")


def _grad_fallback(mask):
    """torch's gradient (``aten.convolution_backward``) for calls the op cannot express."""
    # output_layout: what our kernel would write; torch's gradient comes in its own layout (the same)
    def fallback(input, grad_output, weight=None, stride=1, padding=0, dilation=1, groups=1, C_out=None, kH=None,
                 kW=None, output_layout=CHANNELS_LAST):
        if weight is None:  # the weight gradient: its shape from the sizes given
            weight = grad_output.new_empty(1).expand(C_out, input.shape[1] // groups, kH, kW)
        found = torch.ops.aten.convolution_backward(
            grad_output, input, weight, [C_out] if mask[2] else None, list(stride), list(padding), list(dilation),
            False, [0, 0], groups, list(mask))
        picked = tuple(t for t, wanted in zip(found, mask) if wanted)
        return picked[0] if len(picked) == 1 else picked

    return fallback


_DGRAD = _function("conv2d_dgrad", "Conv2dDgrad", 2, ("input", "grad_output", "weight"), (*_GEOMETRY, "output_layout"),
                   bias=False, shape_only=("input",), fallback=_grad_fallback((True, False, False)))
_WGRAD = {has_bias: _function(f"conv2d_wgrad{'_bias' if has_bias else ''}", "Conv2dWgrad", 2, ("input", "grad_output"),
                              ("C_out", "kH", "kW", *_GEOMETRY), bias=has_bias, outputs=1 + has_bias,
                              fallback=_grad_fallback((False, True, has_bias)))
          for has_bias in (False, True)}


def _weight_grads(x, grad_out, weight, stride, padding, dilation, groups, wants_weight, wants_bias):
    """(grad_weight, grad_bias) of the conv of ``x`` by ``weight`` whose output gradient is
    ``grad_out``, each None where not wanted."""
    grad_weight = grad_bias = None
    if wants_weight:
        found = _WGRAD[wants_bias](x, grad_out, weight.shape[0], weight.shape[2], weight.shape[3], stride, padding,
                                   dilation, groups)
        grad_weight, grad_bias = found if wants_bias else (found, None)
    elif wants_bias:  # the bias's alone: a sum over grad_output's batch and positions
        grad_bias = grad_out.sum((0, 2, 3))
    return grad_weight, grad_bias


def _laid_out(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as our kernels take it: as it is where they do (NC[D]HW-contiguous, or channels
    last, a channels-last model's activations and their gradients: no copy), else copied channels
    last, the layout they read (one copy, not a contiguous one the kernel converts again)."""
    return tensor if accepts(tensor) else channels_last(tensor)


# Each function's backward (see npuops.OpFunction.backward): autograd may hand over a gradient with
# any strides (an expanded one from .sum()); our kernels take the layouts _laid_out gives.
def _conv2d_backward(inputs, params, outputs, grads, needs):
    if _ieee(inputs["input"]):
        return None
    x, weight, grad_out = _laid_out(inputs["input"]), inputs["weight"], _laid_out(grads[0])
    stride, padding, dilation, groups = (params[p] for p in _GEOMETRY)
    grad_input = _DGRAD(x, grad_out, weight, stride, padding, dilation, groups,
                        torch_output_layout(inputs["input"], weight)) if needs[0] else None
    has_bias = len(needs) == 3
    grad_weight, grad_bias = _weight_grads(x, grad_out, weight, stride, padding, dilation, groups, needs[1],
                                           has_bias and needs[2])
    return (grad_input, grad_weight, *((grad_bias,) if has_bias else ()))


def _conv_transpose2d_backward(inputs, params, outputs, grads, needs):
    """y = conv_transpose2d(x, weight) is the adjoint of the conv of y's space by ``weight`` into
    x's: x's gradient is that conv of grad_y (Conv2dFwd), the weight's that conv's weight gradient
    with grad_y its input and x its output's gradient."""
    if _ieee(inputs["input"]):
        return None
    x, weight, grad_out = inputs["input"], inputs["weight"], _laid_out(grads[0])
    stride, padding, output_padding, dilation, groups = (params[p] for p in (
        "stride", "padding", "output_padding", "dilation", "groups"))
    if any(p >= s for p, s in zip(output_padding, stride)):  # not the adjoint of a conv: torch's derivative
        return None
    grad_input = _CONVS[2, False](grad_out, weight, stride, padding, dilation, groups,
                                  torch_output_layout(grad_out, weight)) if needs[0] else None
    has_bias = len(needs) == 3
    grad_weight, grad_bias = _weight_grads(grad_out, _laid_out(x), weight, stride, padding, dilation, groups,
                                           needs[1], False)
    if has_bias and needs[2]:
        grad_bias = grad_out.sum((0, 2, 3))
    return (grad_input, grad_weight, *((grad_bias,) if has_bias else ()))


def _torch_conv(dims: int):
    conv = _TORCH_CONVS[dims]

    # output_layout: what our kernel would write; torch's function returns its own (the same)
    def fallback(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, output_layout=CHANNELS_LAST):
        return conv(input, weight, bias, stride, padding, dilation, groups)

    return fallback


_CONVS = {(dims, has_bias): _op(f"conv{dims}d{'_bias' if has_bias else ''}", f"Conv{dims}dFwd", dims, bias=has_bias,
                                fallback=_torch_conv(dims), backward=_conv2d_backward if dims == 2 else None)
          for dims in (1, 2, 3) for has_bias in (False, True)}
_CAUSAL = {has_bias: _op(f"conv1d_causal{'_bias' if has_bias else ''}", "Conv1dCausal", 1, bias=has_bias,
                         padding=False)
           for has_bias in (False, True)}
_BIAS_RELU = _op("conv2d_bias_relu", "Conv2dBiasRelu", 2, bias=True)


def _torch_conv_transpose2d(input, weight, bias=None, output_layout=CHANNELS_LAST, **given):
    """torch's function for calls the op cannot express (``output_layout``: as for _torch_conv)."""
    return F.conv_transpose2d(input, weight, bias, **given)


_TRANSPOSE = {has_bias: _op(f"conv_transpose2d{'_bias' if has_bias else ''}", "Conv2dTranspose", 2, bias=has_bias,
                            params=("stride", "padding", "output_padding", "groups", "dilation", "output_layout"),
                            fallback=_torch_conv_transpose2d, backward=_conv_transpose2d_backward)
              for has_bias in (False, True)}
_FP8 = _op("conv2d_fp8", "Conv2dFp8Fwd", 2, bias=None, tensors=("x_scale", "w_scale"))


def _padding(padding: Any, weight: Any, dims: int, stride: tuple[int, ...] | None,
             dilation: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """``padding`` as one int per spatial dim: "valid" is none, "same" (stride 1) the symmetric
    padding that keeps the size where the dilated kernel is odd; None where there is no such form."""
    if padding == "valid":
        return (0,) * dims
    if padding == "same":
        if stride != (1,) * dims or dilation is None or not isinstance(weight, torch.Tensor) or weight.dim() != dims + 2:
            return None
        spans = [d * (k - 1) for d, k in zip(dilation, weight.shape[2:], strict=True)]
        return tuple(s // 2 for s in spans) if all(s % 2 == 0 for s in spans) else None
    return int_tuple(padding, dims)


def _conv(dims: int, input, weight, bias, stride, padding, dilation, groups):
    with_batch = batched(input, dims)
    step, dilated = int_tuple(stride, dims), int_tuple(dilation, dims)
    pad = _padding(padding, weight, dims, step, dilated)
    fn = _CONVS[dims, bias is not None]
    if with_batch is None or step is None or dilated is None or pad is None or type(groups) is not int \
            or not isinstance(weight, torch.Tensor) or not (bias is None or isinstance(bias, torch.Tensor)):
        return torch_call(fn.__name__, "arguments with no canonical form (empty input, asymmetric 'same', "
                          "not ints, input rank)", _TORCH_CONVS[dims], input, weight, bias, stride, padding,
                          dilation, groups)
    x, added = with_batch
    if _ieee(x):
        return torch_call(fn.__name__, _IEEE, _TORCH_CONVS[dims], input, weight, bias, stride, padding, dilation, groups)
    tensors = (x, weight) if bias is None else (x, weight, bias)
    return unbatched(fn(*tensors, step, pad, dilated, groups, torch_output_layout(x, weight)), added)


# -- the drop-ins ---------------------------------------------------------------------------------
# The convolutions' fronts (conv_transpose2d's too) return the layout torch's function returns for
# their tensors' (torch_output_layout), so that layout joins their fast path's signature (by_layout),
# and run torch's for float32 where TF32 is off, so that flag joins it too (context).
@drop_in(by_layout=True, context=tf32_allowed)
def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """``torch.nn.functional.conv1d``."""
    return _conv(1, input, weight, bias, stride, padding, dilation, groups)


@drop_in(by_layout=True, context=tf32_allowed)
def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """``torch.nn.functional.conv2d``."""
    return _conv(2, input, weight, bias, stride, padding, dilation, groups)


@drop_in(by_layout=True, context=tf32_allowed)
def conv3d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """``torch.nn.functional.conv3d``."""
    return _conv(3, input, weight, bias, stride, padding, dilation, groups)


@drop_in(by_layout=True, context=tf32_allowed)
def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """``torch.nn.functional.conv_transpose2d`` (our kernel: the data gradient of the conv it
    transposes, by stride phases; the output in torch's layout, as the forward functions')."""
    with_batch = batched(input, 2)
    geometry = [int_tuple(v, 2) for v in (stride, padding, output_padding, dilation)]
    fn = _TRANSPOSE[bias is not None]
    if with_batch is None or None in geometry or type(groups) is not int or not isinstance(weight, torch.Tensor) \
            or not (bias is None or isinstance(bias, torch.Tensor)):
        return torch_call(fn.__name__, "arguments with no canonical form (empty input, not ints, input rank)",
                          F.conv_transpose2d, input, weight, bias, stride, padding, output_padding, groups, dilation)
    x, added = with_batch
    if _ieee(x):
        return torch_call(fn.__name__, _IEEE, F.conv_transpose2d, input, weight, bias, stride, padding, output_padding,
                          groups, dilation)
    step, pad, out_pad, dilated = geometry
    tensors = (x, weight) if bias is None else (x, weight, bias)
    return unbatched(fn(*tensors, step, pad, out_pad, groups, dilated, torch_output_layout(x, weight)), added)


# -- the ops torch has no function for ------------------------------------------------------------
@drop_in(by_layout=True)
def conv1d_causal(input, weight, bias=None, stride=1, dilation=1, groups=1):
    """Causal 1-d convolution: ``F.conv1d(F.pad(input, ((kW-1)*dilation, 0)), weight, bias, stride,
    0, dilation, groups)``: output t sees inputs up to t*stride only (``Conv1dCausal``)."""
    tensors = (input, weight) if bias is None else (input, weight, bias)
    return _CAUSAL[bias is not None](*tensors, int_tuple(stride, 1) or stride, int_tuple(dilation, 1) or dilation,
                                     groups, torch_output_layout(input, weight))


@drop_in(by_layout=True)
def conv2d_bias_relu(input, weight, bias, stride=1, padding=0, dilation=1, groups=1):
    """``relu(F.conv2d(input, weight, bias, ...))`` with the bias and ReLU in the kernel's epilogue."""
    return _BIAS_RELU(input, weight, bias, *(int_tuple(v, 2) or v for v in (stride, padding, dilation)), groups,
                      torch_output_layout(input, weight))


@drop_in(by_layout=True)
def conv2d_fp8(input, weight, x_scale, w_scale, stride=1, padding=0, dilation=1, groups=1):
    """``conv2d(input * x_scale, weight * w_scale)`` in bf16 of float8_e4m3fn ``input`` and ``weight``
    with 0-dim float32 scales, accumulated in fp32 (torch has no fp8 convolution: its formulation
    dequantizes to bf16 first)."""
    return _FP8(input, weight, x_scale, w_scale, *(int_tuple(v, 2) or v for v in (stride, padding, dilation)), groups,
                torch_output_layout(input, weight))


__all__ = ["conv1d", "conv1d_causal", "conv2d", "conv2d_bias_relu", "conv2d_fp8", "conv3d", "conv_transpose2d"]
