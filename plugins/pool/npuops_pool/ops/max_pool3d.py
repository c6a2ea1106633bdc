"""MaxPool3dFwd."""

import torch.nn.functional as F

from ._window import MaxPoolOp, max_pool_params


class MaxPool3dFwd(MaxPoolOp):
    """``F.max_pool3d`` on ``input: [N, C, D, H, W]``: the max over each window, as MaxPool1dFwd per
    spatial dim, the window being the product of the per-dim tap sets (padding acts as -inf). A NaN
    in a window makes its output NaN. With ``return_indices`` also the int64 flat index
    (d*H + h)*W + w of the maximum within its (n, c) plane (the first in window order on ties). Exact:
    the output is one of the inputs."""

    name = "MaxPool3dFwd"
    summary = "3-d max pooling (kernel, stride, padding, dilation, ceil_mode)"
    spatial_dims = 3
    params = max_pool_params(spatial_dims)
    torch_pool = staticmethod(F.max_pool3d)
