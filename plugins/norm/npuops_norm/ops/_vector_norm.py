"""x / max(||x||_p, eps) over one or several dims: ``torch.nn.functional.normalize`` semantics."""

from typing import ClassVar

import torch
from npuops import Param, WorkloadError

from ..rowwise_kernel import RowNorm
from ._single_pass import SinglePassNormOp


class VectorNormalizeOp(SinglePassNormOp):
    """y = x / max(||x||_p, eps), the norm taken over ``dim`` (an int or a list of dims) with the
    other dims kept; output in the input dtype."""

    p: ClassVar[int]
    required_tensors = ("x",)
    params = {
        "dim": Param(-1, "the dim, or list of dims, the norm is taken over", types=(int, tuple)),
        "eps": Param(1e-12, "lower bound of the norm (F.normalize's default)", types=(float,)),
    }
    flops_per_element = 3  # |x| or x², accumulate, divide

    def check_workload(self, w, cfg):
        rank, dims = len(w.shapes["x"]), cfg["dim"]
        dims = (dims,) if isinstance(dims, int) else dims
        in_range = bool(dims) and all(-rank <= d < rank for d in dims)
        if not in_range or len({d % rank for d in dims}) != len(dims):
            raise WorkloadError(
                f"{self.name} {w.id}: param 'dim' = {cfg['dim']!r} must be one dim or distinct dims "
                f"in [-{rank}, {rank}) (x has shape {list(w.shapes['x'])})"
            )

    def _norm_dims(self, w) -> tuple[int, ...]:
        rank, dims = len(w.shapes["x"]), self.config(w)["dim"]
        return tuple(sorted(d % rank for d in ((dims,) if isinstance(dims, int) else dims)))

    def row_norm(self, w):
        if self._norm_dims(w) != (len(w.shapes["x"]) - 1,):
            return None
        return RowNorm(f"l{self.p}", self.config(w)["eps"])

    def kernel_unsupported(self, w):
        if self.row_norm(w) is None:
            return (f"the row kernel normalizes over the last dim only; dim {list(self._norm_dims(w))} "
                    "spans other dims too (a strided reduction kernel is still to be written)")
        return None

    def torch_impl(self, w):
        cfg = self.config(w)
        p, dim, eps = self.p, cfg["dim"], cfg["eps"]

        # F.normalize's own body, which unlike F.normalize takes several dims too.
        def normalize(x):
            return x / torch.linalg.vector_norm(x, p, dim, keepdim=True).clamp_min(eps)

        return normalize
