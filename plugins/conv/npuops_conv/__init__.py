"""npuops convolution family (plugin ``conv``): the functions for model code are importable from
here (``npuops_conv.conv2d``, ...); see :mod:`npuops_conv.functional`."""

from .functional import conv1d, conv1d_causal, conv2d, conv2d_bias_relu, conv2d_fp8, conv3d, conv_transpose2d

__all__ = ["conv1d", "conv1d_causal", "conv2d", "conv2d_bias_relu", "conv2d_fp8", "conv3d", "conv_transpose2d"]
