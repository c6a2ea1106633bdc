"""Conv3dFwd."""

from ._forward import ForwardConvOp
from ._geometry import LAYOUT_3D, conv_params


class Conv3dFwd(ForwardConvOp):
    """y = F.conv3d(input, weight, bias, stride, padding, dilation, groups): input
    [N, C_in, D, H, W], weight [C_out, C_in/groups, kD, kH, kW], optional bias [C_out], output
    [N, C_out, D_out, H_out, W_out] (each dim as in conv2d); output in the input dtype.

    The seed states no kernel size for most workloads: where a weight shape is given the kernel is
    its trailing dims (W3: 3x3x3, W4: 1x1x1); elsewhere the labels say k3 (and "3x3x3" for the
    ASPP one), recorded as ``chosen`` kD = kH = kW = 3 — with the stated padding 1 (or 6 at
    dilation 6) that keeps the spatial size at stride 1, as those networks do."""

    name = "Conv3dFwd"
    summary = "3-d convolution (PyTorch F.conv3d), NCDHW"
    layout = LAYOUT_3D
    params = conv_params(LAYOUT_3D)
