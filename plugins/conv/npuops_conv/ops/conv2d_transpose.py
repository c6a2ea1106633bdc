"""Conv2dTranspose."""

import torch.nn.functional as F
from npuops import KernelOp, Param

from ._backward import DataGradientKernel
from ._conv_op import BIAS_STD, ConvOp, TensorSpec, kaiming_std
from ._forward import OUTPUT_LAYOUT
from ._geometry import (
    BIAS,
    DILATION,
    GROUPS,
    LAYOUT_2D,
    PADDING,
    STRIDE,
    kernel_params,
    transpose_geometry,
)

_INT = (int,)


class Conv2dTranspose(DataGradientKernel, ConvOp, KernelOp):
    """y = F.conv_transpose2d(input, weight, bias, stride, padding, output_padding, groups,
    dilation): the adjoint of a forward conv2d (plus bias), output in the input dtype.

    The seed names sizes from the side of the forward conv being transposed, which maps C_in
    channels to C_out: ``input`` [N, C_out, out_H, out_W] is that conv's output side and is this
    op's input; ``weight`` [C_out, C_in/groups, kH, kW] (PyTorch's transposed-weight layout, the
    same tensor as the forward conv's weight); the output [N, C_in, H, W] has C_in = bias length
    channels and H = (out_H-1)*stride - 2*padding + dilation*(kH-1) + output_padding + 1
    (output_padding < stride, default 0 as in PyTorch; e.g. 56 -> 111 at 3x3 stride 2 padding 1).

    The seed gives C_in only with a bias. For the others ``chosen`` C_in is the value of the
    sibling "-bias" workload with the same label stem, which equals the C_out of the Conv2dFwd
    workload of the same label (the seed built each transpose from that forward layer); the three
    labels without a "-bias" sibling take that C_out directly: deeplabv3-aspp 256,
    mobilenetv2-depthwise 32 (groups 32), resnext-grouped 256. Inputs: input ~ N(0, 1), weight
    ~ N(0, 1/(C_out/groups*kH*kW)) (Kaiming over the products an output sums at stride 1),
    bias ~ N(0, 0.1²), so outputs are O(1).

    Our kernel: the data gradient of the forward conv (``conv_grad_kernel.dgrad_kernel``, the same
    computation), plus the bias over C_in in its epilogue; channels-last input and weight. Param
    ``output_layout``: see ``_forward.OUTPUT_LAYOUT`` (the function passes torch's)."""

    name = "Conv2dTranspose"
    summary = "2-d transposed convolution (PyTorch F.conv_transpose2d)"
    layout = LAYOUT_2D
    params = {
        "N": Param(None, "batch size; must equal input dim 0", types=_INT),
        "C_out": Param(
            None, "channels of the input (the transposed forward conv's outputs); must equal input dim 1", types=_INT
        ),
        "out_H": Param(None, "input height; must equal input dim 2", types=_INT),
        "out_W": Param(None, "input width; must equal input dim 3", types=_INT),
        "C_in": Param(
            None, "channels of the output (the transposed forward conv's inputs); = bias length", types=_INT
        ),
        **kernel_params(LAYOUT_2D),
        "stride": STRIDE, "padding": PADDING, "dilation": DILATION, "groups": GROUPS, "bias": BIAS,
        "output_padding": Param(
            0, "extra rows/columns on the output's bottom/right; below the stride", types=(int, tuple)
        ),
        "output_layout": OUTPUT_LAYOUT,
    }
    required_tensors = ("input",)
    optional_tensors = ("weight", "bias")
    kernel_inputs = ("input", "weight")

    def kernel_bias(self, w):
        return self.geometry(w).bias

    def resolve_geometry(self, where, w, cfg):
        return transpose_geometry(where, w, cfg, self.layout)

    def input_specs(self, w):
        g = self.geometry(w)
        dtype = w.dtype_of("input")
        specs = {
            "input": TensorSpec(g.output_shape, dtype),
            "weight": TensorSpec(g.weight_shape, dtype, std=kaiming_std(g.fan_out)),
        }
        if g.bias:
            specs["bias"] = TensorSpec((g.in_channels,), dtype, std=BIAS_STD)
        return specs

    def output_specs(self, w):
        return (TensorSpec(self.geometry(w).input_shape, w.dtype_of("input")),)

    def torch_impl(self, w):
        g = self.geometry(w)
        stride, padding, output_padding = g.stride, g.padding, g.transpose_output_padding
        dilation, groups = g.dilation, g.groups

        def conv_transpose2d(input, weight, bias=None):
            return F.conv_transpose2d(input, weight, bias, stride, padding, output_padding, groups, dilation)

        return conv_transpose2d
