"""Forward convolutions: ``output = conv(input, weight) (+ bias)`` in the input dtype."""

from __future__ import annotations

from npuops import KernelOp, Param

from ..layouts import CHANNELS_FIRST, CHANNELS_LAST
from ._conv_op import BIAS_STD, ConvOp, TensorSpec, kaiming_std
from ._geometry import forward_geometry

OUTPUT_LAYOUT = Param(CHANNELS_LAST, "the layout our kernel writes the output in: channels_last (the NC[D]HW view of "
                      "[N, *spatial, C_out] rows, as cuDNN's channels-last convolutions write it) or channels_first "
                      "(NC[D]HW-contiguous, what torch returns for NC[D]HW-contiguous tensors: the functions ask for "
                      "it then)", choices=(CHANNELS_LAST, CHANNELS_FIRST))


class ForwardConvOp(ConvOp, KernelOp):
    """``F.conv{1,2,3}d(input, weight, bias, stride, padding, dilation, groups)``, NC[D]HW
    contiguous inputs, weight [C_out, C_in/groups, *kernel], output in the input dtype.

    Inputs: ``input`` ~ N(0, 1), ``weight`` ~ N(0, 1/fan_in) (Kaiming, so outputs are O(1)),
    ``bias`` ~ N(0, 0.1²) when the workload has one. A weight shape in the workload is used as
    given; otherwise C_out comes from the params or the bias and the kernel from the params.
    Param ``output_layout`` (every forward op's): see ``OUTPUT_LAYOUT``.
    """

    required_tensors = ("input",)
    optional_tensors = ("weight", "bias")
    fused_relu = False  # the kernel's epilogue applies a ReLU after the bias
    kernel_description = ("TileLang implicit GEMM on tensor cores (split-K where K is deep), direct convolution for "
                          "depthwise; channels-last inputs, converted untimed")

    def __init_subclass__(cls, **kwargs):
        # Each op states its own params (its rank's sizes, its epilogue's); every kernel of ours
        # writes either output layout.
        super().__init_subclass__(**kwargs)
        cls.params = {**cls.params, "output_layout": OUTPUT_LAYOUT}

    def resolve_geometry(self, where, w, cfg):
        return forward_geometry(where, w, cfg, self.layout)

    def input_specs(self, w):
        g = self.geometry(w)
        dtype = w.dtype_of("input")
        specs = {
            "input": TensorSpec(g.input_shape, dtype),
            "weight": TensorSpec(g.weight_shape, dtype, std=kaiming_std(g.fan_in)),
        }
        if g.bias:
            specs["bias"] = TensorSpec((g.out_channels,), dtype, std=BIAS_STD)
        return specs

    def output_specs(self, w):
        return (TensorSpec(self.geometry(w).output_shape, w.dtype_of("input")),)

    def torch_impl(self, w):
        g = self.geometry(w)
        conv = self.layout.conv
        stride, padding, dilation, groups = g.stride, g.padding, g.dilation, g.groups

        def convolution(input, weight, bias=None):
            return conv(input, weight, bias, stride, padding, dilation, groups)

        return convolution

    # -- our kernels (npuops_conv.conv_kernel) -----------------------------------------------------
    def kernel_unsupported(self, w):
        from ..conv_kernel import unsupported

        return unsupported(self.geometry(w), w.dtype_of("input"))

    def kernel_key(self, w):
        from ..conv_kernel import kernel_key

        return kernel_key(self.geometry(w), w.dtype_of("input"), self.fused_relu, self.output_layout(w))

    def tilelang_variants(self, w):
        from ..conv_kernel import Problem, launch_variants

        return launch_variants(Problem(self.geometry(w), w.dtype_of("input"), self.fused_relu))

    def tilelang_build(self, w, device, config=None):
        from ..conv_kernel import conv_kernel
        from ..layouts import channels_last_kernel

        layout = self.output_layout(w)
        spec = conv_kernel(self.geometry(w), w.dtype_of("input"), self.fused_relu, output_layout=layout,
                           **(config or {}))
        return channels_last_kernel(spec.compile(device), layout)
