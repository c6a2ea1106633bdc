"""Conv2dDgrad."""

from npuops import KernelOp

from ._backward import (
    ConvGradientOp,
    DataGradientKernel,
    convolution_backward,
    shape_only,
)
from ._conv_op import TensorSpec, kaiming_std
from ._forward import OUTPUT_LAYOUT


class Conv2dDgrad(DataGradientKernel, ConvGradientOp, KernelOp):
    """Gradient of y = conv2d(x, weight) with respect to x: grad_input [N, C_in, H, W] from
    ``grad_output`` [N, C_out, H_out, W_out] and ``weight`` [C_out, C_in/groups, kH, kW]; output in
    the input dtype. PyTorch formulation: ``aten.convolution_backward`` with output_mask
    [True, False, False], what autograd runs for conv2d (= ``torch.nn.grad.conv2d_input``).

    The workload describes the forward conv: its ``input`` shape is the forward input (the shape of
    grad_input), the params are the forward conv's. A bias does not change the input gradient:
    bias workloads are kept as stated (their bias shape is checked) and compute the same thing.
    Inputs: grad_output ~ N(0, 1), weight ~ N(0, 1/fan_out) (Kaiming fan-out, torchvision's ResNet
    init), so grad_input is O(1).

    Our kernel: ``conv_grad_kernel.dgrad_kernel`` (channels-last grad_output and weight). Param
    ``output_layout``: see ``_forward.OUTPUT_LAYOUT`` (conv2d's backward passes torch's: grad_input
    in the layout torch's autograd gives it)."""

    name = "Conv2dDgrad"
    summary = "conv2d backward: gradient w.r.t. the input"
    params = {**ConvGradientOp.params, "output_layout": OUTPUT_LAYOUT}

    def input_specs(self, w):
        g = self.geometry(w)
        dtype = w.dtype_of("input")
        return {
            "grad_output": TensorSpec(g.output_shape, dtype),
            "weight": TensorSpec(g.weight_shape, dtype, std=kaiming_std(g.fan_out)),
        }

    def output_specs(self, w):
        return (TensorSpec(self.geometry(w).input_shape, w.dtype_of("input")),)

    def torch_impl(self, w):
        g = self.geometry(w)
        backward = convolution_backward(g, (True, False, False))
        input_shape = g.input_shape

        def conv2d_dgrad(grad_output, weight):
            return backward(grad_output, shape_only(grad_output, input_shape), weight)[0]

        return conv2d_dgrad
