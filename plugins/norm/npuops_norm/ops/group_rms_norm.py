"""GroupRMSNormFwd."""

from npuops import Param, WorkloadError

from ..rowwise_kernel import RowNorm
from ._rowwise import NORMALIZED_SHAPE, RowwiseNormOp, at_least_f32, eps_param


class GroupRMSNormFwd(RowwiseNormOp):
    """RMS normalization within ``groups`` equal contiguous groups of the last dim, then a
    per-hidden weight: with x [rows, hidden] viewed as [rows, groups, hidden/groups],
    y = x / sqrt(mean(x², within the group) + eps) * weight. mamba_ssm's ``RMSNorm(group_size=
    hidden/groups)`` without the gate (``rms_norm_ref`` with upcast): computed in fp32 (f64 for the
    f32 reference), output in the input dtype. groups defaults to 8, the n_groups of Mamba-2 hybrids
    (Codestral Mamba 7B, Nemotron-H): it divides every catalog hidden size (4096/8192/16384 give
    groups of 512/1024/2048). eps 1e-6."""

    name = "GroupRMSNormFwd"
    summary = "RMS norm within equal groups of the hidden dim (Mamba-2 gated-norm style), with weight"
    params = {
        "eps": eps_param(1e-6),
        "normalized_shape": NORMALIZED_SHAPE,
        "groups": Param(8, "number of equal groups the last dim is split into", types=(int,)),
    }

    def check_workload(self, w, cfg):
        super().check_workload(w, cfg)
        groups, hidden = cfg["groups"], w.shapes["x"][-1]
        if groups < 1 or hidden % groups:
            raise WorkloadError(f"{self.name} {w.id}: param 'groups' = {groups} must be >= 1 and divide x's last dim {hidden}")

    def row_norm(self, w):
        cfg = self.config(w)
        return RowNorm("rms", cfg["eps"], groups=cfg["groups"], weight="w")

    def torch_impl(self, w):
        cfg = self.config(w)
        eps, groups = cfg["eps"], cfg["groups"]

        def group_rms_norm(x, weight):
            grouped = at_least_f32(x).unflatten(-1, (groups, -1))
            y = grouped * (grouped.square().mean(-1, keepdim=True) + eps).rsqrt()
            return (y.flatten(-2) * weight.to(y.dtype)).to(x.dtype)

        return group_rms_norm
