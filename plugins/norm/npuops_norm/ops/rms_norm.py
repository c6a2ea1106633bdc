"""RMSNormFwd."""

from ._rowwise import PlainNormOp, RMSKind


class RMSNormFwd(RMSKind, PlainNormOp):
    """y = x / sqrt(mean(x², last dim) + eps) * weight: ``torch.nn.functional.rms_norm`` over the
    last dim of x [rows, hidden] with an affine weight [hidden]; mean square accumulated in fp32 (f64
    for the f32 reference), output in the input dtype. eps 1e-6 (Llama's; PyTorch's own default is
    the dtype's machine epsilon)."""

    name = "RMSNormFwd"
    summary = "RMS normalization over the last dim with an affine weight"
