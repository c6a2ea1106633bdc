"""MaxPool1dFwd."""

import torch.nn.functional as F

from ._window import MaxPoolOp, max_pool_params


class MaxPool1dFwd(MaxPoolOp):
    """``F.max_pool1d`` on ``input: [N, C, L]``: out[n, c, i] = max of input[n, c, l] over the taps
    l = i*stride - padding + t*dilation (t < kernel_size) inside the input (padding acts as -inf).
    L_out = floor((L + 2*padding - dilation*(kernel_size-1) - 1) / stride) + 1 (ceil in
    ``ceil_mode``, dropping a last window that would start in the right padding). A NaN in a
    window makes its output NaN. With ``return_indices`` also the int64 position l of the
    maximum (the first on ties). Exact: the output is one of the inputs."""

    name = "MaxPool1dFwd"
    summary = "1-d max pooling (kernel, stride, padding, dilation, ceil_mode)"
    spatial_dims = 1
    params = max_pool_params(spatial_dims)
    torch_pool = staticmethod(F.max_pool1d)
