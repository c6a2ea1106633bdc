"""An independent convolution (strided windows + matmul, no torch conv kernel) and small workloads
covering every param path of every conv op, shared by the tests."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from npuops import Workload


def unfold_conv(x, weight, bias=None, stride=1, pad_before=0, pad_after=None, dilation=1, groups=1):
    """N-d convolution by gathering every kernel window (Tensor.unfold) and one matmul per group.

    x [N, C_in, *S], weight [C_out, C_in/groups, *K]; stride/pads/dilation: int or per-dim lists.
    Differentiable, so its autograd gives the input and weight gradients too.
    """
    ndim = x.dim() - 2
    stride, dilation, pad_before = (_per_dim(v, ndim) for v in (stride, dilation, pad_before))
    pad_after = pad_before if pad_after is None else _per_dim(pad_after, ndim)
    kernel = weight.shape[2:]
    pads = [p for before, after in zip(reversed(pad_before), reversed(pad_after)) for p in (before, after)]
    windows = F.pad(x, pads)
    for dim in range(ndim):
        span = dilation[dim] * (kernel[dim] - 1) + 1
        # unfold appends the window as the last dim; keep every dilation-th tap of it
        windows = windows.unfold(2 + dim, span, stride[dim])[..., :: dilation[dim]]
    n, c_in = x.shape[:2]
    out_size = windows.shape[2 : 2 + ndim]
    c_out = weight.shape[0]
    # [N, groups, C_in/g, *out, *K] -> [N, groups, pixels, C_in/g * K]
    windows = windows.reshape(n, groups, c_in // groups, *out_size, *kernel)
    perm = [0, 1, *range(3, 3 + ndim), 2, *range(3 + ndim, 3 + 2 * ndim)]
    patches = windows.permute(perm).reshape(n, groups, -1, weight[0].numel())
    filters = weight.reshape(groups, c_out // groups, -1)
    y = torch.einsum("ngpk,gok->ngop", patches, filters).reshape(n, c_out, *out_size)
    if bias is not None:
        y = y + bias.reshape(1, -1, *([1] * ndim))
    return y


def _per_dim(value, ndim):
    return [value] * ndim if isinstance(value, int) else list(value)


def small(op: str, dtype: str, shapes: dict, **params) -> Workload:
    return Workload(op=op, id=f"small-{dtype}", label="small", dtype=dtype, shapes=shapes, params=params)


# Per op: (case id, shapes, params) in the op's own seed naming; odd sizes, every param path.
SMALL_CASES = {
    "Conv1dFwd": [
        ("dil-groups", {"input": [2, 4, 17], "weight": [8, 2, 3]}, dict(dilation=2, groups=2, padding=2)),
        ("stride-bias", {"input": [1, 3, 20], "bias": [5]}, dict(C_out=5, kW=4, stride=3, padding=1, bias=True)),
    ],
    "Conv2dFwd": [
        ("stride-pad-bias", {"input": [2, 3, 9, 11], "weight": [6, 3, 3, 3], "bias": [6]},
         dict(stride=[2, 1], padding=[1, 2], bias=True)),
        ("groups", {"input": [1, 8, 7, 10], "weight": [8, 2, 3, 3]}, dict(groups=4, padding=1)),
        ("dilation-params", {"input": [1, 4, 10, 9]}, dict(C_out=4, kH=3, kW=2, dilation=[2, 3], padding=[2, 3])),
    ],
    "Conv3dFwd": [
        ("pad-bias", {"input": [1, 2, 5, 6, 7], "weight": [4, 2, 3, 3, 3], "bias": [4]}, dict(padding=1, bias=True)),
        ("stride-dil-groups", {"input": [2, 4, 5, 6, 5]},
         dict(C_out=6, kD=3, kH=2, kW=3, stride=[2, 1, 2], dilation=[1, 2, 1], groups=2)),
    ],
    "Conv2dBiasRelu": [
        ("stride", {"input": [2, 5, 9, 8], "bias": [6]}, dict(C_out=6, kH=3, kW=3, stride=[2, 2], padding=[1, 1], bias=True)),
        ("1x1", {"input": [1, 7, 5, 6], "bias": [3]}, dict(C_out=3, kH=1, kW=1, bias=True)),
    ],
    "Conv1dCausal": [
        ("bias", {"input": [2, 3, 23], "bias": [4]}, dict(C_out=4, kW=5, bias=True)),
        ("stride-dil", {"input": [1, 2, 31]}, dict(C_out=3, kW=4, stride=3, dilation=2)),
    ],
    "DepthwiseConv2d": [
        ("multiplier2-stride", {"input": [1, 6, 9, 10]}, dict(C_out=12, kH=3, kW=3, stride=[2, 2], padding=[1, 1])),
        ("5x5-bias", {"input": [2, 4, 7, 7], "bias": [4]}, dict(C_out=4, kH=5, kW=5, padding=[2, 2], bias=True)),
    ],
    "PointwiseConv2d": [
        ("bias", {"input": [2, 6, 5, 7], "bias": [10]}, dict(C_out=10, bias=True)),
        ("stride", {"input": [1, 4, 9, 8]}, dict(C_out=3, stride=[2, 2])),
    ],
    "GroupedConv2d": [
        ("groups4", {"input": [1, 8, 9, 10]}, dict(C_out=12, kH=3, kW=3, padding=[1, 1], groups=4)),
    ],
    "DilatedConv2d": [
        ("rate4x3", {"input": [1, 4, 13, 12]}, dict(C_out=6, kH=3, kW=3, padding=[4, 3], dilation=[4, 3])),
    ],
    "Conv2dFp8Fwd": [
        ("3x3-s2", {"input": [1, 8, 9, 10]}, dict(C_out=6, kH=3, kW=3, stride=[2, 2], padding=[1, 1])),
        ("1x1", {"input": [2, 16, 5, 5]}, dict(C_out=8, kH=1, kW=1)),
    ],
    "Conv2dDgrad": [
        ("stride2", {"input": [2, 4, 9, 10]}, dict(C_out=6, kH=3, kW=3, stride=[2, 2], padding=[1, 1])),
        ("dil-groups-bias", {"input": [1, 8, 11, 9], "bias": [8]},
         dict(C_out=8, kH=3, kW=3, dilation=[2, 2], padding=[2, 2], groups=4, bias=True)),
    ],
    "Conv2dWgrad": [
        ("stride2", {"input": [2, 4, 9, 10]}, dict(C_out=6, kH=3, kW=3, stride=[2, 2], padding=[1, 1])),
        ("dil-groups-bias", {"input": [1, 8, 11, 9], "bias": [8]},
         dict(C_out=8, kH=3, kW=3, dilation=[2, 2], padding=[2, 2], groups=4, bias=True)),
    ],
    "Conv2dTranspose": [
        ("stride2-bias", {"input": [2, 6, 5, 7], "bias": [4]},
         dict(C_in=4, kH=3, kW=3, stride=[2, 2], padding=[1, 1], bias=True)),
        ("groups-dil-outpad", {"input": [1, 8, 6, 6]},
         dict(C_in=12, kH=3, kW=3, groups=4, dilation=[2, 1], padding=[1, 1], output_padding=[1, 0], stride=[2, 2])),
    ],
}
