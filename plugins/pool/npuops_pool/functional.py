"""The pooling ops as functions for model code, with ``torch.nn.functional``'s signatures:
``torch.library`` custom ops in the namespace ``npuops_pool`` (see :mod:`npuops.functional`: our
kernel on CUDA, the torch formulation elsewhere and for tracing, arguments checked as the op's
workloads are). Max pooling returns values only; ``F.max_pool*d(..., return_indices=True)``
remains the way to get indices."""

from npuops.functional import OpFunction, define_function

_WINDOW = (("kernel_size", None), ("stride", None), ("padding", 0))


def _function(name, op, signature, params):
    return define_function(OpFunction("npuops_pool", name, op, f"(Tensor input, {signature}) -> Tensor",
                                      ("input",), params, shape_name="input"))


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
max_pool1d = _function("max_pool1d", "MaxPool1dFwd",
                       "int[1] kernel_size, int[1]? stride=None, int[1] padding=0, int[1] dilation=1, bool ceil_mode=False",
                       (*_WINDOW, ("dilation", 1), ("ceil_mode", False)))
max_pool2d = _function("max_pool2d", "MaxPool2dFwd",
                       "int[2] kernel_size, int[2]? stride=None, int[2] padding=0, int[2] dilation=1, bool ceil_mode=False",
                       (*_WINDOW, ("dilation", 1), ("ceil_mode", False)))
max_pool3d = _function("max_pool3d", "MaxPool3dFwd",
                       "int[3] kernel_size, int[3]? stride=None, int[3] padding=0, int[3] dilation=1, bool ceil_mode=False",
                       (*_WINDOW, ("dilation", 1), ("ceil_mode", False)))
adaptive_avg_pool2d = _function("adaptive_avg_pool2d", "AdaptiveAvgPool2dFwd", "int[2] output_size",
                                (("output_size", None),))
adaptive_max_pool2d = _function("adaptive_max_pool2d", "AdaptiveMaxPool2dFwd", "int[2] output_size",
                                (("output_size", None),))
