"""Entry point of the ``conv`` plugin: its ops with their catalog workloads, our TileLang kernels
(the forward convolutions), the cuDNN channels-last baseline and the modules npuops.patch swaps."""

from npuops import hookimpl, kernel_implementations, package_ops

from .baselines import channels_last_implementations


@hookimpl
def npuops_ops():
    return package_ops(__package__)


@hookimpl
def npuops_implementations(ops):
    return kernel_implementations(ops, __package__, "TileLang convolution") + channels_last_implementations(ops)


@hookimpl
def npuops_module_forwards():
    from .modules import conv_forward  # imported on use: it defines the functions' custom ops

    return [conv_forward]
