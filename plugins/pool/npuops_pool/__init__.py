"""npuops pooling family (plugin ``pool``): the ops, their workloads and our kernels, and the
functions to call from model code, drop-ins for ``torch.nn.functional``'s
(``npuops_pool.max_pool2d(x, 3, 2, 1)``, ...)."""

from .functional import (
    adaptive_avg_pool2d,
    adaptive_max_pool2d,
    adaptive_max_pool2d_with_indices,
    avg_pool1d,
    avg_pool2d,
    avg_pool3d,
    max_pool1d,
    max_pool1d_with_indices,
    max_pool2d,
    max_pool2d_with_indices,
    max_pool3d,
    max_pool3d_with_indices,
)

__all__ = [
    "adaptive_avg_pool2d", "adaptive_max_pool2d", "adaptive_max_pool2d_with_indices", "avg_pool1d", "avg_pool2d",
    "avg_pool3d", "max_pool1d", "max_pool1d_with_indices", "max_pool2d", "max_pool2d_with_indices", "max_pool3d",
    "max_pool3d_with_indices",
]
