"""AvgPool3dFwd."""

import torch
import torch.nn.functional as F

from ._window import WindowPoolOp, avg_pool_params


class AvgPool3dFwd(WindowPoolOp):
    """``F.avg_pool3d`` on ``input: [N, C, D, H, W]``: the mean over each window, as AvgPool1dFwd
    per spatial dim, the window being the product of the per-dim tap sets (and the tap count the
    product of the per-dim counts). With ``divisor_override`` every window sum is divided by it
    instead. Accumulates in fp32; output in the input dtype.

    Catalog W2 ("divisor") leaves the divisor open; it is chosen as 16, the power of two above its
    2x2x3 window: unlike the window size (12) and the smaller counts of its border windows it
    shows whether an implementation honours the override, and dividing by it is exact in every
    float format."""

    name = "AvgPool3dFwd"
    summary = "3-d average pooling (kernel, stride, padding, ceil_mode, count_include_pad, divisor_override)"
    spatial_dims = 3
    params = avg_pool_params(spatial_dims)
    torch_pool = staticmethod(F.avg_pool3d)

    def torch_impl(self, w):
        pool = super().torch_impl(w)

        def avg_pool3d(input):
            # PyTorch's CPU avg_pool3d has no 16-bit kernel; there a PyTorch user pools in fp32.
            if input.device.type == "cpu" and input.dtype in (torch.float16, torch.bfloat16):
                return pool(input.float()).to(input.dtype)
            return pool(input)

        return avg_pool3d
