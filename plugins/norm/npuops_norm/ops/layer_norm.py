"""LayerNormFwd."""

from ._rowwise import LayerKind, PlainNormOp


class LayerNormFwd(LayerKind, PlainNormOp):
    """y = (x - mean) / sqrt(var + eps) * weight + bias: ``torch.nn.functional.layer_norm`` over the
    last dim of x [rows, hidden] with affine weight and bias [hidden]; mean and biased variance
    accumulated in fp32 (f64 for the f32 reference), output in the input dtype. eps 1e-5 (PyTorch's
    default)."""

    name = "LayerNormFwd"
    summary = "Layer normalization over the last dim with affine weight and bias"
