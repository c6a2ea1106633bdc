"""Entry point of the ``conv`` plugin: its ops with their catalog workloads, and the cuDNN
channels-last baseline."""

from npuops import hookimpl, package_ops

from .baselines import channels_last_implementations


@hookimpl
def npuops_ops():
    return package_ops(__package__)


@hookimpl
def npuops_implementations(ops):
    return channels_last_implementations(ops)
