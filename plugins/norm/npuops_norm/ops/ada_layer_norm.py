"""AdaLayerNormFwd."""

import math

import torch
from npuops import Param, WorkloadError

from ..rowwise_kernel import RowNorm
from ._rowwise import NORMALIZED_SHAPE, RowwiseNormOp, eps_param


class AdaLayerNormFwd(RowwiseNormOp):
    """DiT's adaLN ``modulate(norm(x), shift, scale)``: x [rows, hidden] is ``batch`` samples of
    rows/batch consecutive tokens; y = layer_norm(x) * (1 + scale[b]) + shift[b] for the tokens of
    sample b, the LayerNorm over the last dim without affine (biased variance). shift and scale
    [batch, hidden] are per-sample conditioning vectors broadcast over that sample's tokens.
    Statistics accumulated in fp32 (f64 for the f32 reference), output in the input dtype.

    eps 1e-6: DiT's ``nn.LayerNorm(hidden, elementwise_affine=False, eps=1e-6)``. batch defaults to 1
    (one sequence, one conditioning vector: the decode row and the 2048-token prefill); the DiT-XL/2
    workloads choose 4 (256x256 images: a 32x32 latent in 2x2 patches is 256 tokens per image, so
    1024 rows are 4 images)."""

    name = "AdaLayerNormFwd"
    summary = "DiT adaLN: LayerNorm without affine, then * (1 + scale) + shift per sample"
    params = {
        "eps": eps_param(1e-6),
        "normalized_shape": NORMALIZED_SHAPE,
        "batch": Param(1, "samples the rows split into (equal runs of consecutive rows)", types=(int,)),
    }
    flops_per_element = 8  # mean, centered square-accumulate, center, scale, modulate

    def check_workload(self, w, cfg):
        super().check_workload(w, cfg)
        batch, rows = cfg["batch"], math.prod(w.shapes["x"][:-1])
        if batch < 1 or rows % batch:
            raise WorkloadError(f"{self.name} {w.id}: param 'batch' = {batch} must be >= 1 and divide the {rows} rows of x")

    def make_inputs(self, w, rng):
        x_shape, dtype = w.shapes["x"], w.dtype_of("x")
        conditioning = (self.config(w)["batch"], x_shape[-1])
        return {
            "x": rng.normal(x_shape, dtype),
            "shift": rng.normal(conditioning, dtype, std=0.2),
            "scale": rng.normal(conditioning, dtype, std=0.2),
        }

    def row_norm(self, w):
        return RowNorm("meanvar", self.config(w)["eps"], modulated=True)

    def kernel_samples(self, w):
        return self.config(w)["batch"]

    def torch_impl(self, w):
        eps = self.config(w)["eps"]

        def ada_layer_norm(x, shift, scale):
            hidden = x.shape[-1]
            tokens = torch.nn.functional.layer_norm(x, (hidden,), eps=eps).view(shift.shape[0], -1, hidden)
            return (tokens * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)).view(x.shape)

        return ada_layer_norm
