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

    def _segments(self, w) -> int | None:
        """How many segments of the row kernel the dims make: 1 for the last dim alone, dim 0's
        size for (0, last) of a 3-D x; None where the kernel has no such view."""
        rank, dims = len(w.shapes["x"]), self._norm_dims(w)
        if dims == (rank - 1,):
            return 1
        if rank == 3 and dims == (0, 2):
            return w.shapes["x"][0]
        return None

    def row_norm(self, w):
        segments = self._segments(w)
        if segments is None:
            return None
        return RowNorm(f"l{self.p}", self.config(w)["eps"], segments=segments)

    def kernel_unsupported(self, w):
        if self._segments(w) is None:
            return (f"the row kernel normalizes over the last dim, or dims 0 and 2 of a 3-D x; dim "
                    f"{list(self._norm_dims(w))} of x {list(w.shapes['x'])} is neither")
        return super().kernel_unsupported(w)

    def torch_impl(self, w):
        cfg = self.config(w)
        p, dim, eps = self.p, cfg["dim"], cfg["eps"]

        # F.normalize's own body, which unlike F.normalize takes several dims too.
        def normalize(x):
            return x / torch.linalg.vector_norm(x, p, dim, keepdim=True).clamp_min(eps)

        return normalize
