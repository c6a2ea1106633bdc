"""AvgPool1dFwd."""

import torch.nn.functional as F

from ._window import WindowPoolOp, avg_pool_params


class AvgPool1dFwd(WindowPoolOp):
    """``F.avg_pool1d`` on ``input: [N, C, L]``: out[n, c, i] = sum of input[n, c, l] over the
    window taps l = i*stride - padding + t (t < kernel_size) that fall inside the input, divided
    by the tap count: counting the padding taps (those in [-padding, L + padding)) if
    ``count_include_pad`` (taps a ceil-mode window runs past the padded input never count), else
    only the taps inside the input. L_out = floor((L + 2*padding - kernel_size) / stride) + 1
    (ceil in ``ceil_mode``, dropping a last window that would start in the right padding).
    Accumulates in fp32; output in the input dtype."""

    name = "AvgPool1dFwd"
    summary = "1-d average pooling (kernel, stride, padding, ceil_mode, count_include_pad)"
    spatial_dims = 1
    params = avg_pool_params(spatial_dims)
    torch_pool = staticmethod(F.avg_pool1d)
