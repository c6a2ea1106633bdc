"""L1NormFwd."""

from ._vector_norm import VectorNormalizeOp


class L1NormFwd(VectorNormalizeOp):
    """y = x / max(sum |x| over dim, eps): ``torch.nn.functional.normalize(x, p=1, dim, eps)``, where
    dim is one dim (default -1) or a list of dims (the norm over all of them, e.g. [0, 2] of
    [4, 128, 4096] gives 128 norms). The sum accumulated in fp32 (f64 for the f32 reference), output
    in the input dtype. eps 1e-12."""

    name = "L1NormFwd"
    summary = "x / max(||x||_1, eps) over one or several dims (F.normalize p=1)"
    p = 1
