"""Entry point of the ``conv`` plugin: its ops with their catalog workloads, our TileLang kernels
(the forward convolutions) and the cuDNN channels-last baseline."""

from npuops import hookimpl, package_ops
from npuops.kernels import kernel_implementations

from .baselines import channels_last_implementations


@hookimpl
def npuops_ops():
    return package_ops(__package__)


@hookimpl
def npuops_implementations(ops):
    return kernel_implementations(ops, __package__, "TileLang convolution") + channels_last_implementations(ops)
