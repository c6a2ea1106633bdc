"""RMSNormQuantFwd."""

from ._quant import QUANT_PARAMS, NormQuantOp
from ._rowwise import RMSKind


class RMSNormQuantFwd(RMSKind, NormQuantOp):
    """RMSNorm then per-token dynamic symmetric int8 quantization (vLLM's
    ``rms_norm_dynamic_per_token_quant`` without residual or scale upper bound):

    y = x / sqrt(mean(x², last dim) + eps) * weight, in fp32 (f64 for the f32 reference), not
    rounded to the input dtype; per row scale = max(max|y| / 127, min_scale) (fp32, [rows, 1]) and
    q = clamp(round(y / scale), -128, 127) as int8, rounding half to even (CUDA's cvt.rni, as vLLM).
    Outputs (q, scale). eps 1e-6; min_scale = fp32 epsilon (vLLM's floor for int8)."""

    name = "RMSNormQuantFwd"
    summary = "RMS norm + per-token dynamic int8 quantization (q int8, scale f32 per row)"
    params = {**RMSKind.params, **QUANT_PARAMS}
