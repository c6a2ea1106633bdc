"""The pooling ops as functions for model code, with ``torch.nn.functional``'s signatures:
``torch.library`` custom ops in the namespace ``npuops_pool`` (see :mod:`npuops.functional`: our
kernel on CUDA, the torch formulation elsewhere and for tracing, arguments checked as the op's
workloads are). The max pools also come ``*_with_indices``, as ``F.max_pool2d_with_indices``:
values and the int64 argmax indices (PyTorch's ``return_indices=True``)."""

from npuops.functional import OpFunction, define_function

_WINDOW = (("kernel_size", None), ("stride", None), ("padding", 0))


def _function(name, op, signature, params):
    return define_function(OpFunction("npuops_pool", name, op, f"(Tensor input, {signature}) -> Tensor",
                                      ("input",), params, shape_name="input"))


def _with_indices(name, op, signature, params):
    """The max pool ``name`` returning (values, indices): the op with ``return_indices`` set."""
    return define_function(OpFunction("npuops_pool", f"{name}_with_indices", op,
                                      f"(Tensor input, {signature}) -> (Tensor, Tensor)", ("input",),
                                      (*params, ("return_indices", True)), shape_name="input", returns=(0, 1)))


avg_pool1d = _function("avg_pool1d", "AvgPool1dFwd",
                       "int[1] kernel_size, int[1]? stride=None, int[1] padding=0, bool ceil_mode=False, "
                       "bool count_include_pad=True",
                       (*_WINDOW, ("ceil_mode", False), ("count_include_pad", True)))
avg_pool2d = _function("avg_pool2d", "AvgPool2dFwd",
                       "int[2] kernel_size, int[2]? stride=None, int[2] padding=0, bool ceil_mode=False, "
                       "bool count_include_pad=True, int? divisor_override=None",
                       (*_WINDOW, ("ceil_mode", False), ("count_include_pad", True), ("divisor_override", None)))
avg_pool3d = _function("avg_pool3d", "AvgPool3dFwd",
                       "int[3] kernel_size, int[3]? stride=None, int[3] padding=0, bool ceil_mode=False, "
                       "bool count_include_pad=True, int? divisor_override=None",
                       (*_WINDOW, ("ceil_mode", False), ("count_include_pad", True), ("divisor_override", None)))
_MAX_POOLS = {
    dims: (f"max_pool{dims}d", f"MaxPool{dims}dFwd",
           (f"int[{dims}] kernel_size, int[{dims}]? stride=None, int[{dims}] padding=0, int[{dims}] dilation=1, "
            "bool ceil_mode=False"), (*_WINDOW, ("dilation", 1), ("ceil_mode", False)))
    for dims in (1, 2, 3)
}
max_pool1d, max_pool2d, max_pool3d = (_function(*_MAX_POOLS[dims]) for dims in (1, 2, 3))
max_pool1d_with_indices, max_pool2d_with_indices, max_pool3d_with_indices = (
    _with_indices(*_MAX_POOLS[dims]) for dims in (1, 2, 3))
adaptive_avg_pool2d = _function("adaptive_avg_pool2d", "AdaptiveAvgPool2dFwd", "int[2] output_size",
                                (("output_size", None),))
_ADAPTIVE_MAX_POOL = ("adaptive_max_pool2d", "AdaptiveMaxPool2dFwd", "int[2] output_size", (("output_size", None),))
adaptive_max_pool2d = _function(*_ADAPTIVE_MAX_POOL)
adaptive_max_pool2d_with_indices = _with_indices(*_ADAPTIVE_MAX_POOL)
