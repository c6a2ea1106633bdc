"""Conv2dBiasRelu."""

import torch.nn.functional as F

from npuops import Param

from ._forward import ForwardConvOp
from ._geometry import LAYOUT_2D, conv_params


class Conv2dBiasRelu(ForwardConvOp):
    """y = relu(F.conv2d(input, weight, bias, stride, padding, dilation, groups)): the conv +
    bias + ReLU epilogue fusion (cuDNN's ConvBiasActivation). Shapes as Conv2dFwd; the bias
    [C_out] is always present. Output in the input dtype."""

    name = "Conv2dBiasRelu"
    summary = "relu(conv2d(x, w) + b), fused epilogue"
    layout = LAYOUT_2D
    params = {**conv_params(LAYOUT_2D), "bias": Param(True, "always true: the op adds a bias", choices=(True,))}
    fused_relu = True

    def torch_impl(self, w):
        conv = super().torch_impl(w)

        def conv_bias_relu(input, weight, bias):
            return F.relu(conv(input, weight, bias))

        return conv_bias_relu
