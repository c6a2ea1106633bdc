"""AdaptiveMaxPool2dFwd."""

import torch.nn.functional as F

from ._adaptive import AdaptivePoolOp, adaptive_params
from ._pooling import EXACT, RETURN_INDICES


class AdaptiveMaxPool2dFwd(AdaptivePoolOp):
    """``F.adaptive_max_pool2d`` on ``input: [N, C, H, W]`` to ``output_size`` (H_out, W_out):
    out[n, c, i, j] = max of input[n, c, h, w] over h in [floor(i*H/H_out), ceil((i+1)*H/H_out))
    and w in [floor(j*W/W_out), ceil((j+1)*W/W_out)). A NaN in a window makes its output NaN.
    With ``return_indices`` also the int64 flat index h*W + w of the maximum within its (n, c)
    plane (the first in window order on ties). Exact: the output is one of the inputs."""

    name = "AdaptiveMaxPool2dFwd"
    summary = "2-d adaptive max pooling to a fixed output size"
    spatial_dims = 2
    params = {**adaptive_params(spatial_dims), "return_indices": RETURN_INDICES}
    torch_pool = staticmethod(F.adaptive_max_pool2d)
    tolerances = EXACT
    reduction = "max"
