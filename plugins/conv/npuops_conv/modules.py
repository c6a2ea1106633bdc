"""Model convolution modules this family can run (for :func:`npuops.patch`): ``torch.nn``'s
``Conv1d``, ``Conv2d`` and ``Conv3d`` with zero padding, called with the module's own weight, bias
and geometry. Other padding modes (reflect, replicate, circular), which pad the input before the
convolution, and subclasses that override ``forward`` are left alone."""

import torch

from . import functional as C

_CONVS = {torch.nn.Conv1d: C.conv1d, torch.nn.Conv2d: C.conv2d, torch.nn.Conv3d: C.conv3d}


def _forward(conv):
    def forward(module, input):
        return conv(input, module.weight, module.bias, module.stride, module.padding, module.dilation, module.groups)

    forward.__name__ = forward.__qualname__ = f"{conv.__name__}_forward"
    return forward


_FORWARDS = {cls: _forward(conv) for cls, conv in _CONVS.items()}


def conv_forward(module):
    """Our forward for ``module`` if it is a convolution this family runs, else None."""
    for cls, forward in _FORWARDS.items():
        if isinstance(module, cls) and type(module).forward is cls.forward and module.padding_mode == "zeros":
            return forward
    return None
