"""An npuops plugin that adds one implementation to an op another plugin defines.

``hf_llama_rms_norm`` is RMSNorm as Hugging Face transformers writes it (``LlamaRMSNorm``): upcast
to fp32, scale by the reciprocal root mean square, cast back, multiply by the weight. Many models
run exactly this, so it is an alternative users would otherwise have.
"""

import torch
from npuops import Implementation, hookimpl


def build_hf_llama_rms_norm(op, workload, device):
    eps = op.config(workload)["eps"]

    def hf_llama_rms_norm(x, weight):
        hidden = x.to(torch.float32)
        variance = hidden.pow(2).mean(-1, keepdim=True)
        hidden = hidden * torch.rsqrt(variance + eps)
        return weight * hidden.to(x.dtype)

    return hf_llama_rms_norm


@hookimpl
def npuops_implementations(ops):
    if "RMSNormFwd" not in ops:  # the norm plugin is not installed or is disabled
        return []
    return [
        Implementation(
            op="RMSNormFwd",
            name="hf_llama_rms_norm",
            tier="open-source",
            build=build_hf_llama_rms_norm,
            description="transformers' LlamaRMSNorm formulation",
        )
    ]
