"""FusedAddRMSNormFwd."""

from ._fused_add import FusedAddNormOp
from ._rowwise import RMSKind


class FusedAddRMSNormFwd(RMSKind, FusedAddNormOp):
    """residual += x, written back in place; y = residual / sqrt(mean(residual², last dim) + eps) *
    weight. vLLM's ``fused_add_rms_norm`` (one pass over memory). Inputs x, residual [rows, hidden],
    weight [hidden]; outputs (y, residual), both in the input dtype. The sum is stored in the input
    dtype; the reference adds and norms in fp32 (f64 for f32) without rounding the sum in between.
    Mean square accumulated in fp32; eps 1e-6."""

    name = "FusedAddRMSNormFwd"
    summary = "residual += x in place, then RMS norm of the sum (vLLM fused_add_rms_norm)"
