"""GemmaRMSNormFwd."""

import torch

from ._rowwise import PlainNormOp, RMSKind, at_least_f32


class GemmaRMSNormFwd(RMSKind, PlainNormOp):
    """y = x / sqrt(mean(x², last dim) + eps) * (1 + weight), all in fp32 (f64 for the f32
    reference) and cast to the input dtype once at the end: Gemma's RMSNorm (HF transformers
    ``GemmaRMSNorm``), whose checkpoint weight is the offset from 1 (so inputs draw it around 0).
    Inputs x [rows, hidden], weight [hidden]. eps 1e-6 (Gemma's)."""

    name = "GemmaRMSNormFwd"
    summary = "Gemma RMS norm: x / rms(x) * (1 + weight) in fp32"
    weight_mean = 0.0
    weight_form = "1+w"
    flops_per_element = 5  # RMS norm plus the 1 + weight

    @staticmethod
    def normalize(x, weight, bias, eps):
        wide = at_least_f32(x)
        y = wide * torch.rsqrt(wide.square().mean(-1, keepdim=True) + eps)
        return (y * (1.0 + weight.to(wide.dtype))).to(x.dtype)
