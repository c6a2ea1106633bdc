"""AdaptiveAvgPool2dFwd."""

import torch.nn.functional as F

from ._adaptive import AdaptivePoolOp, adaptive_params


class AdaptiveAvgPool2dFwd(AdaptivePoolOp):
    """``F.adaptive_avg_pool2d`` on ``input: [N, C, H, W]`` to ``output_size`` (H_out, W_out):
    out[n, c, i, j] = mean of input[n, c, h, w] over h in [floor(i*H/H_out), ceil((i+1)*H/H_out))
    and w in [floor(j*W/W_out), ceil((j+1)*W/W_out)) (uneven, possibly overlapping windows).
    Accumulates in fp32; output in the input dtype."""

    name = "AdaptiveAvgPool2dFwd"
    summary = "2-d adaptive average pooling to a fixed output size"
    spatial_dims = 2
    params = adaptive_params(spatial_dims)
    torch_pool = staticmethod(F.adaptive_avg_pool2d)
