"""FusedAddLayerNormFwd."""

from ._fused_add import FusedAddNormOp
from ._rowwise import LayerKind


class FusedAddLayerNormFwd(LayerKind, FusedAddNormOp):
    """residual += x, written back in place; y = layer_norm(residual) * weight + bias over the last
    dim (biased variance), the LayerNorm analogue of vLLM's ``fused_add_rms_norm``. Inputs x, residual
    [rows, hidden], weight, bias [hidden]; outputs (y, residual), both in the input dtype. The sum is
    stored in the input dtype; the reference adds and norms in fp32 (f64 for f32). Statistics
    accumulated in fp32; eps 1e-5."""

    name = "FusedAddLayerNormFwd"
    summary = "residual += x in place, then LayerNorm of the sum"
