"""LayerNormBwd."""

import torch
from npuops import Param

from ._rowwise_backward import RowwiseBackwardOp
from ._stat_norm import affine_bias, mean_invstd, stats_for_aten


class LayerNormBwd(RowwiseBackwardOp):
    """Backward of ``F.layer_norm(x, normalized_shape, weight, bias, eps)``, as autograd runs it
    (``aten::native_layer_norm_backward``).

    Inputs: grad_out and x: [*rows, *normalized_shape] (16-bit or f32), the mean and rstd the
    forward saved: [*rows, 1...] f32 (biased mean and 1/sqrt(var + eps) over the normalized dims;
    CUDA's native_layer_norm saves them in f32), weight and bias: normalized_shape in x's dtype.
    The bias is not read: autograd passes it only to ask for its gradient. With
    x_hat = (x - mean) * rstd, g = grad_out * weight and means over the normalized dims:
    grad_input = rstd * (g - mean(g) - x_hat * mean(g * x_hat)) in x's dtype;
    grad_weight = sum over rows of grad_out * x_hat, grad_bias = sum over rows of grad_out, in the
    weight's dtype.

    Returns (grad_input, grad_weight, grad_bias). On CPU, whose kernel takes the statistics in the
    weight's dtype, the formulation casts them first.

    FLOPs: 13 per element: x_hat (2), the weight and bias gradient sums (3), g (1), the row sums of
    g and g * x_hat (3), grad_input = rstd * g + a * x_hat + b (4).
    """

    name = "LayerNormBwd"
    summary = "Backward of LayerNorm: grad input, weight and bias"
    params = {
        **RowwiseBackwardOp.params,
        "eps": Param(1e-5, "added to the variance before the square root (PyTorch's default)", types=(float,)),
    }
    stat = "meanvar"
    flops_per_element = 13
    unread_inputs = ("bias",)

    def make_inputs(self, w, rng):
        inputs = self.grad_x_weight(w, rng)
        mean, rstd = mean_invstd(inputs["x"], self.normalized_dims(w), self.config(w)["eps"], keepdim=True)
        bias = affine_bias(rng, self.normalized_shape(w), w.dtype_of("x"))
        return {**inputs, "bias": bias, "mean": mean, "rstd": rstd}

    def torch_impl(self, w):
        normalized_shape = self.normalized_shape(w)

        def layer_norm_backward(grad_out, x, weight, bias, mean, rstd):
            mean, rstd = stats_for_aten(x, weight, mean, rstd)
            return torch.ops.aten.native_layer_norm_backward(
                grad_out, x, normalized_shape, mean, rstd, weight, bias, [True, True, True]
            )

        return layer_norm_backward
