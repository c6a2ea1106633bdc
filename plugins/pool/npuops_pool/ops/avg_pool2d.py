"""AvgPool2dFwd."""

import torch.nn.functional as F

from ._window import WindowPoolOp, avg_pool_params


class AvgPool2dFwd(WindowPoolOp):
    """``F.avg_pool2d`` on ``input: [N, C, H, W]``: the mean over each window, as AvgPool1dFwd per
    spatial dim, the window being the product of the per-dim tap sets (and the tap count the
    product of the per-dim counts). With ``divisor_override`` every window sum is divided by it
    instead. Accumulates in fp32; output in the input dtype.

    Catalog W1 ("ceil-divisor") leaves the divisor open; it is chosen as 16, the power of two above
    its 3x5 window: unlike the window size (15) and every partial-window count of its ceil-mode
    border windows (all below 15) it shows whether an implementation honours the override, and
    dividing by it is exact in every float format."""

    name = "AvgPool2dFwd"
    summary = "2-d average pooling (kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)"
    spatial_dims = 2
    params = avg_pool_params(spatial_dims)
    torch_pool = staticmethod(F.avg_pool2d)
