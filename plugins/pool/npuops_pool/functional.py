"""The pooling ops as functions for model code: drop-ins for ``torch.nn.functional``'s (see
:mod:`npuops.functional`: our kernel on CUDA where it covers the call, torch's formulation for
every other call and for tracing).

Each public function takes exactly the arguments of its ``F.*`` counterpart, in the same order and
with the same defaults, and returns what it returns: ``max_pool{1,2,3}d`` (``return_indices=True``:
values and int64 indices), ``max_pool{1,2,3}d_with_indices`` (always both, as
``F.max_pool2d_with_indices``), ``avg_pool{1,2,3}d``, ``adaptive_avg_pool2d``,
``adaptive_max_pool2d`` (and ``adaptive_max_pool2d_with_indices``).

A wrapper puts a call into the op's canonical form, in O(1): an unbatched input gets a batch dim
(removed from the results), an int or a single value becomes one per spatial dim, stride None or
``()`` the kernel size, an ``output_size`` entry None the input's size. Then it calls the op's
function (``_max_pool2d``, ...; the custom ops ``torch.ops.npuops_pool.*``), which runs our kernel
where it covers the call and passes what the op's workload validation refuses (integer dtypes,
zero output sizes, arguments torch refuses too) to torch's function, which computes or raises as
it does. Forms that have no canonical version (an empty input, a value that is not an int, a
tensor of a rank torch refuses, a sequence of the wrong length) go to torch's function as they are
(``npuops.functional.torch_call``, counted in ``coverage()`` under the same name).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from npuops import OpFunction, batched, define_function, drop_in, int_tuple, torch_call, unbatched


def _why(input: Any) -> str:
    """Why a call goes to torch's function as it is."""
    if isinstance(input, torch.Tensor) and input.numel() == 0:
        return "empty input"
    return "arguments with no canonical form (not ints, wrong lengths, input rank)"


def _op(name: str, op: str, signature: str, params: tuple, torch_function, outputs: str = "Tensor",
        returns: tuple[int, ...] = (0,)):
    """The op ``op`` as a function over its canonical arguments (int[N] geometry, batched input);
    calls the op cannot express go to ``torch_function`` with the same arguments by name."""
    def fallback(input, **params):
        return torch_function(input, **params)

    return define_function(OpFunction("npuops_pool", name, op, f"(Tensor input, {signature}) -> {outputs}",
                                      ("input",), params, shape_name="input", returns=returns, fallback=fallback))


def _window_params(dims: int, max_pool: bool) -> tuple[str, tuple]:
    if max_pool:
        signature = (f"int[{dims}] kernel_size, int[{dims}]? stride=None, int[{dims}] padding=0, "
                     f"int[{dims}] dilation=1, bool ceil_mode=False")
        params = (("kernel_size", None), ("stride", None), ("padding", 0), ("dilation", 1), ("ceil_mode", False))
    else:
        signature = (f"int[{dims}] kernel_size, int[{dims}]? stride=None, int[{dims}] padding=0, "
                     "bool ceil_mode=False, bool count_include_pad=True")
        params = (("kernel_size", None), ("stride", None), ("padding", 0), ("ceil_mode", False),
                  ("count_include_pad", True))
        if dims > 1:  # F.avg_pool1d has no divisor_override
            signature += ", int? divisor_override=None"
            params += (("divisor_override", None),)
    return signature, params


_TORCH_MAX_POOLS = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_TORCH_MAX_POOLS_WITH_INDICES = {1: F.max_pool1d_with_indices, 2: F.max_pool2d_with_indices,
                                 3: F.max_pool3d_with_indices}
_TORCH_AVG_POOLS = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}

# The op-level functions: canonical arguments only (the custom ops torch.ops.npuops_pool.<name>).
_MAX_POOLS = {dims: _op(f"max_pool{dims}d", f"MaxPool{dims}dFwd", *_window_params(dims, True), _TORCH_MAX_POOLS[dims])
              for dims in (1, 2, 3)}
_MAX_POOLS_WITH_INDICES = {
    dims: _op(f"max_pool{dims}d_with_indices", f"MaxPool{dims}dFwd",
              _window_params(dims, True)[0] + ", bool return_indices=True",
              (*_window_params(dims, True)[1], ("return_indices", True)), _TORCH_MAX_POOLS[dims],
              outputs="(Tensor, Tensor)", returns=(0, 1))
    for dims in (1, 2, 3)
}
_AVG_POOLS = {dims: _op(f"avg_pool{dims}d", f"AvgPool{dims}dFwd", *_window_params(dims, False),
                        _TORCH_AVG_POOLS[dims])
              for dims in (1, 2, 3)}
_adaptive_avg_pool2d = _op("adaptive_avg_pool2d", "AdaptiveAvgPool2dFwd", "int[2] output_size",
                           (("output_size", None),), F.adaptive_avg_pool2d)
_adaptive_max_pool2d = _op("adaptive_max_pool2d", "AdaptiveMaxPool2dFwd", "int[2] output_size",
                           (("output_size", None),), F.adaptive_max_pool2d)
_adaptive_max_pool2d_with_indices = _op(
    "adaptive_max_pool2d_with_indices", "AdaptiveMaxPool2dFwd", "int[2] output_size, bool return_indices=True",
    (("output_size", None), ("return_indices", True)), F.adaptive_max_pool2d, outputs="(Tensor, Tensor)",
    returns=(0, 1))


# -- canonical forms (each O(1); None where a call has none) ---------------------------------------
def _window(input, dims, kernel_size, stride, padding, *flags) -> tuple | None:
    """(batched input, whether the batch dim was added, kernel_size, stride, padding) in canonical
    form, or None; ``flags`` (ceil_mode, count_include_pad) must be bools."""
    with_batch = batched(input, dims)
    kernel = int_tuple(kernel_size, dims)
    step = kernel if stride is None or (isinstance(stride, tuple | list) and not stride) else int_tuple(stride, dims)
    pad = int_tuple(padding, dims)
    if with_batch is None or kernel is None or step is None or pad is None or any(type(f) is not bool for f in flags):
        return None
    return (*with_batch, kernel, step, pad)


def _max_pool(dims, input, kernel_size, stride, padding, dilation, ceil_mode, return_indices, torch_function):
    canonical = _window(input, dims, kernel_size, stride, padding, ceil_mode)
    dilated = int_tuple(dilation, dims)
    fn = _MAX_POOLS_WITH_INDICES[dims] if return_indices else _MAX_POOLS[dims]
    if canonical is None or dilated is None:
        return torch_call(fn.__name__, _why(input), torch_function, input, kernel_size, stride, padding, dilation,
                          ceil_mode, return_indices)
    x, added, kernel, step, pad = canonical
    return unbatched(fn(x, kernel, step, pad, dilated, ceil_mode), added)


def _avg_pool(dims, input, kernel_size, stride, padding, ceil_mode, count_include_pad, *divisor_override):
    canonical = _window(input, dims, kernel_size, stride, padding, ceil_mode, count_include_pad)
    fn = _AVG_POOLS[dims]
    if canonical is None or any(d is not None and type(d) is not int for d in divisor_override):
        return torch_call(fn.__name__, _why(input), _TORCH_AVG_POOLS[dims], input, kernel_size, stride, padding,
                          ceil_mode, count_include_pad, *divisor_override)
    x, added, kernel, step, pad = canonical
    return unbatched(fn(x, kernel, step, pad, ceil_mode, count_include_pad, *divisor_override), added)


def _adaptive(fn, torch_function, input, output_size, *return_indices):
    with_batch = batched(input, 2)
    sizes = None
    if with_batch is not None:
        if type(output_size) is int:
            sizes = (output_size, output_size)
        elif isinstance(output_size, tuple | list) and len(output_size) == 2 and all(
                s is None or type(s) is int for s in output_size):
            sizes = tuple(n if s is None else s for s, n in zip(output_size, input.shape[-2:], strict=True))
            if not all(type(s) is int for s in sizes):  # a symbolic input size: torch's to take
                sizes = None
    if sizes is None:
        return torch_call(fn.__name__, _why(input), torch_function, input, output_size, *return_indices)
    x, added = with_batch
    return unbatched(fn(x, sizes), added)


# -- the drop-ins ---------------------------------------------------------------------------------
@drop_in
def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """``torch.nn.functional.max_pool1d``: values, or (values, int64 indices) with ``return_indices``."""
    return _max_pool(1, input, kernel_size, stride, padding, dilation, ceil_mode, bool(return_indices), F.max_pool1d)


@drop_in
def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """``torch.nn.functional.max_pool2d``: values, or (values, int64 indices) with ``return_indices``."""
    return _max_pool(2, input, kernel_size, stride, padding, dilation, ceil_mode, bool(return_indices), F.max_pool2d)


@drop_in
def max_pool3d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """``torch.nn.functional.max_pool3d``: values, or (values, int64 indices) with ``return_indices``."""
    return _max_pool(3, input, kernel_size, stride, padding, dilation, ceil_mode, bool(return_indices), F.max_pool3d)


@drop_in
def max_pool1d_with_indices(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                            return_indices=False):
    """``torch.nn.functional.max_pool1d_with_indices``: (values, int64 indices), whatever
    ``return_indices`` says (as torch's)."""
    return _max_pool(1, input, kernel_size, stride, padding, dilation, ceil_mode, True, F.max_pool1d_with_indices)


@drop_in
def max_pool2d_with_indices(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                            return_indices=False):
    """``torch.nn.functional.max_pool2d_with_indices``: (values, int64 indices), whatever
    ``return_indices`` says (as torch's)."""
    return _max_pool(2, input, kernel_size, stride, padding, dilation, ceil_mode, True, F.max_pool2d_with_indices)


@drop_in
def max_pool3d_with_indices(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                            return_indices=False):
    """``torch.nn.functional.max_pool3d_with_indices``: (values, int64 indices), whatever
    ``return_indices`` says (as torch's)."""
    return _max_pool(3, input, kernel_size, stride, padding, dilation, ceil_mode, True, F.max_pool3d_with_indices)


@drop_in
def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    """``torch.nn.functional.avg_pool1d``."""
    return _avg_pool(1, input, kernel_size, stride, padding, ceil_mode, count_include_pad)


@drop_in
def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    """``torch.nn.functional.avg_pool2d``."""
    return _avg_pool(2, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


@drop_in
def avg_pool3d(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    """``torch.nn.functional.avg_pool3d``."""
    return _avg_pool(3, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


@drop_in
def adaptive_avg_pool2d(input, output_size):
    """``torch.nn.functional.adaptive_avg_pool2d``: ``output_size`` an int or two, None keeping
    that input size."""
    return _adaptive(_adaptive_avg_pool2d, F.adaptive_avg_pool2d, input, output_size)


@drop_in
def adaptive_max_pool2d(input, output_size, return_indices=False):
    """``torch.nn.functional.adaptive_max_pool2d``: values, or (values, int64 indices) with
    ``return_indices``."""
    if return_indices:
        return _adaptive(_adaptive_max_pool2d_with_indices, F.adaptive_max_pool2d, input, output_size, True)
    return _adaptive(_adaptive_max_pool2d, F.adaptive_max_pool2d, input, output_size)


@drop_in
def adaptive_max_pool2d_with_indices(input, output_size, return_indices=False):
    """``torch.nn.functional.adaptive_max_pool2d_with_indices``: (values, int64 indices), whatever
    ``return_indices`` says (as torch's)."""
    return _adaptive(_adaptive_max_pool2d_with_indices, F.adaptive_max_pool2d_with_indices, input, output_size)
