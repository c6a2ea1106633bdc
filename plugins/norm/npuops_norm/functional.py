"""The norms as functions to call from model code: ``torch.library`` custom ops in the namespace
``npuops_norm`` (see :mod:`npuops.functional`: our kernel on CUDA, the torch formulation elsewhere
and for tracing, inputs checked). Each function's scalar defaults are its op's parameter defaults.
"""

from npuops import discover_op_classes
from npuops.functional import OpFunction, define_function

_OP_CLASSES = {cls.name: cls for cls in discover_op_classes("npuops_norm.ops")}


def _function(name, op, inputs, params=("eps",), outputs="Tensor", mutates=(), returns=(0,)):
    defaults = tuple((p, _OP_CLASSES[op].params[p].default) for p in params)
    args = [f"Tensor{'(a!)' if n in mutates else ''} {n}" for n in inputs]
    args += [f"{'int' if isinstance(d, int) else 'float'} {p}={d!r}" for p, d in defaults]
    schema = f"({', '.join(args)}) -> {outputs}"
    return define_function(OpFunction("npuops_norm", name, op, schema, tuple(inputs), defaults,
                                      mutates=tuple(mutates), returns=returns))


rms_norm = _function("rms_norm", "RMSNormFwd", ["x", "weight"])
layer_norm = _function("layer_norm", "LayerNormFwd", ["x", "weight", "bias"])
gemma_rms_norm = _function("gemma_rms_norm", "GemmaRMSNormFwd", ["x", "weight"])
group_rms_norm = _function("group_rms_norm", "GroupRMSNormFwd", ["x", "weight"], ["eps", "groups"])
# residual += x in place; the function returns the norm (vLLM's fused_add_rms_norm)
fused_add_rms_norm = _function("fused_add_rms_norm", "FusedAddRMSNormFwd", ["x", "residual", "weight"],
                               mutates=["residual"])
fused_add_layer_norm = _function("fused_add_layer_norm", "FusedAddLayerNormFwd", ["x", "residual", "weight", "bias"],
                                 mutates=["residual"])
rms_norm_quant = _function("rms_norm_quant", "RMSNormQuantFwd", ["x", "weight"], outputs="(Tensor, Tensor)",
                           returns=(0, 1))
layer_norm_quant = _function("layer_norm_quant", "LayerNormQuantFwd", ["x", "weight", "bias"],
                             outputs="(Tensor, Tensor)", returns=(0, 1))
qk_norm = _function("qk_norm", "QKNormFwd", ["q", "k", "q_weight", "k_weight"], outputs="(Tensor, Tensor)",
                    returns=(0, 1))
ada_layer_norm = _function("ada_layer_norm", "AdaLayerNormFwd", ["x", "shift", "scale"], ["eps", "batch"])
weight_norm = _function("weight_norm", "WeightNormFwd", ["v", "g"], params=())
l2_norm = _function("l2_norm", "L2NormFwd", ["x"])
l1_norm = _function("l1_norm", "L1NormFwd", ["x"])
