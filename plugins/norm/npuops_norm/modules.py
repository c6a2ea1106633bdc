"""Model norm modules this family can run (for :func:`npuops.patch`): ``torch.nn.LayerNorm`` and
``torch.nn.RMSNorm`` with their weights, ``torch.nn.BatchNorm1d/2d/3d``, ``InstanceNorm1d/2d/3d``
and ``GroupNorm`` (their running statistics kept as the modules keep them), and Hugging Face's
RMSNorm modules, recognized without importing transformers. Subclasses that override ``forward``
compute something else and are left alone.

Hugging Face defines one RMSNorm class per model (``LlamaRMSNorm``, ``Qwen2RMSNorm``,
``GemmaRMSNorm``, ...). A module is a candidate when its class name ends in ``RMSNorm`` and it has a
1-D ``weight`` parameter and a float ``variance_epsilon`` (Llama, Mistral, Qwen2/3, ...) or ``eps``
(Gemma, Qwen3-Next, ...). The name does not say which formula the class computes — Gemma's and
Qwen3-Next's scale by ``1 + weight``, Llama's by ``weight`` — so the module's own forward is run
once on a random fp32 input and compared with both: it becomes :func:`rms_norm` or
:func:`gemma_rms_norm`, or is left alone if it matches neither.

Rounding differs slightly from Llama's: ``LlamaRMSNorm`` normalizes in fp32, casts to the input
dtype, then multiplies by the weight in that dtype (two roundings in bf16); ``rms_norm`` multiplies
in fp32 and casts once, so its output is as close or closer to the fp32 model's. Gemma's forward
already multiplies in fp32, as ``gemma_rms_norm`` does.
"""

import torch

from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm
from torch.nn.parameter import is_lazy

from .functional import (_layer_norm, _rms_norm, batch_norm, default_eps, gemma_rms_norm, group_norm, instance_norm,
                         layer_norm, rms_norm)


def _layer_norm_forward(module, input):
    return layer_norm(input, module.normalized_shape, module.weight, module.bias, module.eps)


def _rms_norm_forward(module, input):
    return rms_norm(input, module.normalized_shape, module.weight, module.eps)


def _batch_norm_forward(module, input):
    """``_BatchNorm.forward`` with our ``batch_norm``: the same momentum (a cumulative average where
    it is None), batch-count update and choice of statistics."""
    module._check_input_dim(input)
    factor = 0.0 if module.momentum is None else module.momentum
    if module.training and module.track_running_stats and module.num_batches_tracked is not None:
        module.num_batches_tracked.add_(1)
        factor = 1.0 / float(module.num_batches_tracked) if module.momentum is None else module.momentum
    use_batch = module.training or (module.running_mean is None and module.running_var is None)
    tracked = not module.training or module.track_running_stats
    return batch_norm(input, module.running_mean if tracked else None, module.running_var if tracked else None,
                      module.weight, module.bias, use_batch, factor, module.eps)


def _instance_norm_forward(module, input):
    """``_InstanceNorm.forward`` with our ``instance_norm``; an input whose channels differ from
    ``num_features`` goes to the class's forward, which raises or warns as it does."""
    module._check_input_dim(input)
    unbatched = input.dim() == module._get_no_batch_dim()
    if input.size(0 if unbatched else 1) != module.num_features:
        return type(module).forward(module, input)
    x = input.unsqueeze(0) if unbatched else input
    y = instance_norm(x, module.running_mean, module.running_var, module.weight, module.bias,
                      module.training or not module.track_running_stats,
                      module.momentum if module.momentum is not None else 0.0, module.eps)
    return y.squeeze(0) if unbatched else y


def _group_norm_forward(module, input):
    return group_norm(input, module.num_groups, module.weight, module.bias, module.eps)


def _hf_forward(form, norm, eps_attribute):
    def forward(module, hidden_states):
        weight = module.weight
        if hidden_states.dtype != weight.dtype:  # mixed dtypes: the class decides its output dtype
            return type(module).forward(module, hidden_states)
        return norm(hidden_states, weight, getattr(module, eps_attribute))

    forward.__name__ = forward.__qualname__ = f"{form}_forward"
    return forward


_HF_NORMS = {
    "rms_norm": lambda x, weight, eps: rms_norm(x, weight.shape, weight, eps),
    "gemma_rms_norm": gemma_rms_norm,
}
_HF_FORWARDS = {(form, attribute): _hf_forward(form, norm, attribute)
                for form, norm in _HF_NORMS.items() for attribute in ("variance_epsilon", "eps")}


def _hf_formula(module, weight, eps):
    """Which of our norms the module's own forward computes, from one call on a random fp32 input
    (None: neither, or the call failed)."""
    if weight.device.type == "meta":
        return None
    x = torch.randn(4, weight.shape[0], generator=torch.Generator().manual_seed(0)).to(weight.device)
    try:
        with torch.no_grad():
            got = type(module).forward(module, x)
    except Exception:
        return None
    if not isinstance(got, torch.Tensor) or got.shape != x.shape:
        return None
    w = weight.detach().float()
    normalized = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    for form, scale in (("rms_norm", w), ("gemma_rms_norm", 1 + w)):
        if torch.allclose(got.float(), normalized * scale, rtol=1e-3, atol=1e-4):
            return form
    return None


def norm_forward(module):
    """Our forward for ``module`` if it is a norm this family runs, else None."""
    cls = type(module)
    if isinstance(module, torch.nn.LayerNorm):
        # subclasses that override forward (an fp32 upcast, say) compute something else
        ok = cls.forward is torch.nn.LayerNorm.forward and module.weight is not None and module.bias is not None
        return _layer_norm_forward if ok else None
    if isinstance(module, torch.nn.RMSNorm):
        ok = cls.forward is torch.nn.RMSNorm.forward and module.weight is not None
        return _rms_norm_forward if ok else None
    if any(is_lazy(t) for t in (getattr(module, "weight", None), getattr(module, "running_mean", None))):
        return None  # a lazy module before its first call: no shape yet
    if isinstance(module, _BatchNorm):  # SyncBatchNorm overrides forward: left alone
        return _batch_norm_forward if cls.forward is _BatchNorm.forward else None
    if isinstance(module, _InstanceNorm):
        return _instance_norm_forward if cls.forward is _InstanceNorm.forward else None
    if isinstance(module, torch.nn.GroupNorm):
        return _group_norm_forward if cls.forward is torch.nn.GroupNorm.forward else None
    if not cls.__name__.endswith("RMSNorm"):
        return None
    weight = getattr(module, "weight", None)
    attribute = next((a for a in ("variance_epsilon", "eps") if isinstance(getattr(module, a, None), float)), None)
    if not isinstance(weight, torch.nn.Parameter) or weight.dim() != 1 or attribute is None:
        return None
    form = _hf_formula(module, weight, getattr(module, attribute))
    return _HF_FORWARDS[form, attribute] if form else None


def norm_workloads(module):
    """The workload of the row-norm kernel ``module``'s patched forward calls, for
    ``npuops.patch(model, warm=True)``: one row of its hidden size in its weight's dtype (the
    kernel key; every row count's launch class is built with it). None for the channel norms, whose
    calls' spatial sizes are not known ahead, and for modules this plugin did not patch."""
    forward = getattr(module.__dict__.get("forward"), "__func__", None)
    weight = getattr(module, "weight", None)
    if forward is None or not isinstance(weight, torch.Tensor) or weight.dim() != 1:
        return None
    x = torch.empty(1, weight.shape[0], dtype=weight.dtype, device="meta")
    if forward is _layer_norm_forward:
        return [_layer_norm.workload(x, weight, module.bias, float(module.eps))]
    if forward is _rms_norm_forward:
        eps = module.eps if module.eps is not None else default_eps(weight.dtype)
        return [_rms_norm.workload(x, weight, float(eps))]
    hf = next((key for key, hf in _HF_FORWARDS.items() if forward is hf), None)
    if hf is None:
        return None
    form, attribute = hf
    return [(_rms_norm if form == "rms_norm" else gemma_rms_norm).workload(x, weight, float(getattr(module, attribute)))]
