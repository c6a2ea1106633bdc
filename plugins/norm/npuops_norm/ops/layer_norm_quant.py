"""LayerNormQuantFwd."""

from ._quant import QUANT_PARAMS, NormQuantOp
from ._rowwise import LayerKind


class LayerNormQuantFwd(LayerKind, NormQuantOp):
    """LayerNorm then per-token dynamic symmetric int8 quantization (the LayerNorm analogue of
    vLLM's ``rms_norm_dynamic_per_token_quant``):

    y = (x - mean) / sqrt(var + eps) * weight + bias over the last dim (biased variance), in fp32
    (f64 for the f32 reference), not rounded to the input dtype; per row scale = max(max|y| / 127,
    min_scale) (fp32, [rows, 1]) and q = clamp(round(y / scale), -128, 127) as int8, rounding half
    to even. Outputs (q, scale). eps 1e-5; min_scale = fp32 epsilon (vLLM's floor for int8)."""

    name = "LayerNormQuantFwd"
    summary = "LayerNorm + per-token dynamic int8 quantization (q int8, scale f32 per row)"
    params = {**LayerKind.params, **QUANT_PARAMS}
