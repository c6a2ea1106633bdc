"""QKNormFwd."""

import dataclasses

from ._rowwise import RMSKind, RowwiseNormOp


class QKNormFwd(RMSKind, RowwiseNormOp):
    """q_out = rms_norm(q) * q_weight and k_out = rms_norm(k) * k_weight over the last dim, in one
    launch (QK-norm over the whole projection, as OLMo 2). The workload's x gives the shape of both
    q and k [rows, hidden]; q_weight, k_weight [hidden]. Each as RMSNormFwd: fp32 accumulation,
    outputs (q_out, k_out) in the input dtype, eps 1e-6."""

    name = "QKNormFwd"
    summary = "RMS norm of a query and a key tensor, each with its own weight"
    flops_per_element = 2 * RMSKind.flops_per_element

    def make_inputs(self, w, rng):
        q = super().make_inputs(w, rng)
        k = super().make_inputs(w, rng)
        return {"q": q["x"], "k": k["x"], "q_weight": q["weight"], "k_weight": k["weight"]}

    def row_norm(self, w):
        return dataclasses.replace(super().row_norm(w), pair=True)

    def torch_impl(self, w):
        eps, normalize = self.config(w)["eps"], self.normalize

        def qk_norm(q, k, q_weight, k_weight):
            return normalize(q, q_weight, None, eps), normalize(k, k_weight, None, eps)

        return qk_norm
