"""RMSNormBwd."""

import torch
from npuops import Param

from ._rowwise import at_least_f32
from ._rowwise_backward import RowwiseBackwardOp


def rms_rstd(x, dims, eps):
    """1/sqrt(mean(x², dims) + eps), kept dims, in f32 (f64 for f64 x): the statistic RMSNormBwd takes."""
    return torch.rsqrt(at_least_f32(x).square().mean(dims, keepdim=True) + eps)


def rms_norm_backward_formula(grad_out, x, rstd, weight, dims):
    """The backward written out, in f32 (f64 for f64 inputs) as ATen's decomposition computes it."""
    dy = at_least_f32(grad_out)
    x_hat = at_least_f32(x) * rstd
    grad_x_hat = dy * weight.to(dy.dtype)
    grad_x = (grad_x_hat - x_hat * (grad_x_hat * x_hat).mean(dims, keepdim=True)) * rstd
    row_dims = tuple(range(x.dim() - len(dims)))
    grad_weight = (dy * x_hat).sum(row_dims)
    return grad_x.to(x.dtype), grad_weight.to(weight.dtype)


class RMSNormBwd(RowwiseBackwardOp):
    """Backward of ``F.rms_norm(x, normalized_shape, weight, eps)`` (RMSNormFwd), as autograd runs it.

    Inputs: grad_out and x: [*rows, *normalized_shape] (16-bit or f32), weight: normalized_shape in
    x's dtype, and the rstd the forward saved: [*rows, 1...] f32, rstd = 1/sqrt(mean(x²) + eps)
    over the normalized dims (``aten::_fused_rms_norm`` saves it so on CUDA). With x_hat = x * rstd,
    g = grad_out * weight and means over the normalized dims:
    grad_x = rstd * (g - x_hat * mean(g * x_hat)) in x's dtype;
    grad_weight = sum over rows of grad_out * x_hat, in the weight's dtype. Math in f32.

    Returns (grad_x, grad_weight). On CUDA the formulation is ``aten::_fused_rms_norm_backward``,
    what autograd of F.rms_norm runs there; elsewhere (no such kernel) the same math in torch ops,
    as ATen's decomposition writes it.

    FLOPs: 9 per element: grad_out * x (1) reused by the row sum of g * x_hat (2) and the weight
    gradient's column sum scaled by rstd (2); grad_x = (grad_out * weight) * rstd + x * c_row (4).
    """

    name = "RMSNormBwd"
    summary = "Backward of RMSNorm with an affine weight: grad x and grad weight"
    params = {
        **RowwiseBackwardOp.params,
        "eps": Param(1e-6, "added to the mean square before the square root (as RMSNormFwd)", types=(float,)),
    }
    stat = "rms"
    flops_per_element = 9

    def make_inputs(self, w, rng):
        inputs = self.grad_x_weight(w, rng)
        return {**inputs, "rstd": rms_rstd(inputs["x"], self.normalized_dims(w), self.config(w)["eps"])}

    def torch_impl(self, w):
        normalized_shape, dims = self.normalized_shape(w), self.normalized_dims(w)

        def rms_norm_backward(grad_out, x, weight, rstd):
            if x.is_cuda:
                return torch.ops.aten._fused_rms_norm_backward(
                    grad_out, x, normalized_shape, rstd, weight, [True, True]
                )
            return rms_norm_backward_formula(grad_out, x, rstd, weight, dims)

        return rms_norm_backward
