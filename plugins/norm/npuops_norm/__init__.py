"""npuops normalization family (plugin ``norm``): the ops, their workloads and our kernels, and
the functions to call from model code (``npuops_norm.rms_norm(x, (hidden,), weight, eps)``, as
``torch.nn.functional.rms_norm``, ``batch_norm``, ``instance_norm``, ``group_norm``, ...)."""

from .functional import (
    ada_layer_norm,
    batch_norm,
    fused_add_layer_norm,
    fused_add_rms_norm,
    gemma_rms_norm,
    group_norm,
    group_rms_norm,
    instance_norm,
    l1_norm,
    l2_norm,
    layer_norm,
    layer_norm_quant,
    normalize,
    qk_norm,
    rms_norm,
    rms_norm_quant,
    weight_norm,
)

__all__ = [
    "ada_layer_norm", "batch_norm", "fused_add_layer_norm", "fused_add_rms_norm", "gemma_rms_norm", "group_norm",
    "group_rms_norm", "instance_norm", "l1_norm", "l2_norm", "layer_norm", "layer_norm_quant", "normalize", "qk_norm",
    "rms_norm", "rms_norm_quant", "weight_norm",
]
