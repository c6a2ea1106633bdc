"""SpectralNormPowerIterFwd."""

import torch
import torch.nn.functional as F
from npuops import Param, WorkloadError

from ._rowwise import NORMALIZED_SHAPE, RowwiseNormOp


class SpectralNormPowerIterFwd(RowwiseNormOp):
    """One power iteration and the normalized weight, as ``torch.nn.utils.spectral_norm`` in training
    mode (n_power_iterations=1): with W = x [rows, cols] and the current u [rows], v [cols],

        v' = normalize(Wᵀ u), u' = normalize(W v'), sigma = u'ᵀ W v', out = W / sigma,

    normalize(a) = a / max(||a||₂, eps). Outputs (out [rows, cols], u', v'), all in the input dtype.
    PyTorch does the matvecs in the weight's dtype; the reference in fp32 (f64 for f32). u and v
    are inputs: random normal, normalized (as spectral_norm initializes them). eps 1e-12."""

    name = "SpectralNormPowerIterFwd"
    summary = "one spectral-norm power iteration: new u, v and W / sigma"
    params = {
        "eps": Param(1e-12, "lower bound of the norms of u and v (F.normalize's)", types=(float,)),
        "normalized_shape": NORMALIZED_SHAPE,
    }
    flops_per_element = 5  # Wᵀu and Wv (2 each), W / sigma

    def check_workload(self, w, cfg):
        super().check_workload(w, cfg)
        if len(w.shapes["x"]) != 2:
            raise WorkloadError(f"{self.name} {w.id}: 'x' (W) must be 2-D [rows, cols], got {list(w.shapes['x'])}")

    def make_inputs(self, w, rng):
        (rows, cols), dtype = w.shapes["x"], w.dtype_of("x")
        eps = self.config(w)["eps"]
        return {
            "weight": rng.normal((rows, cols), dtype),
            "u": F.normalize(rng.normal((rows,), dtype), dim=0, eps=eps),
            "v": F.normalize(rng.normal((cols,), dtype), dim=0, eps=eps),
        }

    kernel_description = ("TileLang: Wᵀu, W t, the norms and W / sigma in one cooperative launch over slabs of columns "
                          "(two grid barriers, slabs held in shared memory and registers), else of rows, else 5 launches; "
                          "1 for a single row")

    def kernel_unsupported(self, w):
        from ..spectral_kernel import unsupported

        return unsupported(*w.shapes["x"])

    def tilelang_variants(self, w):
        from ..spectral_kernel import launch_variants

        return launch_variants(*w.shapes["x"], w.dtype_of("x"))

    def kernel_key(self, w):
        return w.fingerprint  # its kernels are built for one shape

    def tilelang_build(self, w, device, config=None):
        from ..spectral_kernel import build_power_iteration

        return build_power_iteration(w.shapes["x"], w.dtype_of("x"), self.config(w)["eps"], device, **(config or {}))

    def torch_impl(self, w):
        eps = self.config(w)["eps"]

        def spectral_norm_power_iter(weight, u, v):
            v = F.normalize(torch.mv(weight.t(), u), dim=0, eps=eps)
            u = F.normalize(torch.mv(weight, v), dim=0, eps=eps)
            sigma = torch.dot(u, torch.mv(weight, v))
            return weight / sigma, u, v

        return spectral_norm_power_iter
