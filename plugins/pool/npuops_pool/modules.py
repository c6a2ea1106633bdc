"""Model pooling modules this family can run (for :func:`npuops.patch`): ``torch.nn``'s max, average
and adaptive pools, called with the module's own parameters. Subclasses that override ``forward``
compute something else and are left alone."""

import torch

from . import functional as P


def _max_pool_forward(pool, pool_with_indices):
    def forward(module, input):
        fn = pool_with_indices if module.return_indices else pool
        return fn(input, module.kernel_size, module.stride, module.padding, module.dilation, module.ceil_mode)

    forward.__name__ = forward.__qualname__ = f"{pool.__name__}_forward"
    return forward


def _avg_pool1d_forward(module, input):
    return P.avg_pool1d(input, module.kernel_size, module.stride, module.padding, module.ceil_mode,
                        module.count_include_pad)


def _avg_pool_forward(pool):
    def forward(module, input):
        return pool(input, module.kernel_size, module.stride, module.padding, module.ceil_mode,
                    module.count_include_pad, module.divisor_override)

    forward.__name__ = forward.__qualname__ = f"{pool.__name__}_forward"
    return forward


def _output_size(module, input):
    """The module's output size, a None entry meaning the input's size there (as torch's)."""
    size = module.output_size
    size = (size, size) if isinstance(size, int) else tuple(size)
    return tuple(input.shape[-2 + i] if s is None else s for i, s in enumerate(size))


def _adaptive_avg_pool2d_forward(module, input):
    return P.adaptive_avg_pool2d(input, _output_size(module, input))


def _adaptive_max_pool2d_forward(module, input):
    fn = P.adaptive_max_pool2d_with_indices if module.return_indices else P.adaptive_max_pool2d
    return fn(input, _output_size(module, input))


_FORWARDS = {
    torch.nn.MaxPool1d: _max_pool_forward(P.max_pool1d, P.max_pool1d_with_indices),
    torch.nn.MaxPool2d: _max_pool_forward(P.max_pool2d, P.max_pool2d_with_indices),
    torch.nn.MaxPool3d: _max_pool_forward(P.max_pool3d, P.max_pool3d_with_indices),
    torch.nn.AvgPool1d: _avg_pool1d_forward,
    torch.nn.AvgPool2d: _avg_pool_forward(P.avg_pool2d),
    torch.nn.AvgPool3d: _avg_pool_forward(P.avg_pool3d),
    torch.nn.AdaptiveAvgPool2d: _adaptive_avg_pool2d_forward,
    torch.nn.AdaptiveMaxPool2d: _adaptive_max_pool2d_forward,
}


def pool_forward(module):
    """Our forward for ``module`` if it is a pool this family runs, else None."""
    for cls, forward in _FORWARDS.items():
        if isinstance(module, cls) and type(module).forward is cls.forward:
            return forward
    return None
