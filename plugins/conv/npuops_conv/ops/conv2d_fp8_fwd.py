"""Conv2dFp8Fwd."""

import torch
import torch.nn.functional as F

from npuops import reference_math

from ._conv_op import TensorSpec, kaiming_std
from ._forward import ForwardConvOp
from ._geometry import LAYOUT_2D, conv_params

# A per-tensor scale of a realistic spread; the weight's is further divided by sqrt(fan_in).
_SCALE_RANGE = (0.5, 2.0)


class Conv2dFp8Fwd(ForwardConvOp):
    """y = conv2d(input * x_scale, weight * w_scale) in bf16: ``input`` [N, C_in, H, W] and
    ``weight`` [C_out, C_in/groups, kH, kW] are float8_e4m3fn with per-tensor float32 scales
    ``x_scale`` and ``w_scale`` (0-dim), no bias; output [N, C_out, H_out, W_out] bfloat16.

    PyTorch has no fp8 convolution, so the formulation a user has is to dequantize to bf16 and
    call F.conv2d: ``F.conv2d(input.to(bf16) * x_scale, weight.to(bf16) * w_scale, ...)``. The
    reference dequantizes in float32 (exact: every fp8 value times a float32 scale) and convolves
    in float32. Inputs: fp8 values of N(0, 1), x_scale ~ U(0.5, 2), w_scale ~ U(0.5, 2)/sqrt(fan_in),
    so outputs are O(1). Costed as fp8 work: a native kernel reads the fp8 tensors once."""

    name = "Conv2dFp8Fwd"
    summary = "fp8 (e4m3) 2-d convolution with per-tensor scales, bf16 output"
    layout = LAYOUT_2D
    params = {k: v for k, v in conv_params(LAYOUT_2D).items() if k != "bias"}
    optional_tensors = ("weight",)

    def input_specs(self, w):
        g = self.geometry(w)
        fp8 = w.dtype_of("input")
        weight_scale = kaiming_std(g.fan_in)
        return {
            "input": TensorSpec(g.input_shape, fp8),
            "weight": TensorSpec(g.weight_shape, fp8),
            "x_scale": TensorSpec((), torch.float32, uniform=_SCALE_RANGE),
            "w_scale": TensorSpec((), torch.float32, uniform=tuple(s * weight_scale for s in _SCALE_RANGE)),
        }

    def output_specs(self, w):
        return (TensorSpec(self.geometry(w).output_shape, torch.bfloat16),)

    def _conv(self, w, dtype):
        g = self.geometry(w)
        stride, padding, dilation, groups = g.stride, g.padding, g.dilation, g.groups

        def dequantized_conv2d(input, weight, x_scale, w_scale):
            x = input.to(dtype) * x_scale
            k = weight.to(dtype) * w_scale
            return F.conv2d(x, k, None, stride, padding, dilation, groups)

        return dequantized_conv2d

    def torch_impl(self, w):
        return self._conv(w, torch.bfloat16)

    def reference(self, inputs, w):
        with reference_math():
            return self._conv(w, torch.float32)(**inputs)
