"""InstanceNormFwd."""

import torch.nn.functional as F
from npuops import Tolerance

from ._instance_norm import InstanceNormOp
from ._stat_norm import MOMENTUM, activations, affine_bias, affine_weight, channels, running_stats


class InstanceNormFwd(InstanceNormOp):
    """``F.instance_norm(x, running_mean, running_var, weight, bias, use_input_stats=True, momentum,
    eps)``: instance norm as a training step (or a model without running statistics) runs it.

    x: [N, C, *spatial]. Per (n, c), over the m = prod(spatial) elements of x[n, c]: mean, biased
    variance var; y = (x - mean) / sqrt(var + eps), then * weight[c] + bias[c] when ``affine``
    (weight, bias: [C] in the workload's dtype); y in x's dtype.
    With ``running_stats`` (running_mean, running_var: [C], f32 in the catalog) both are updated in
    place with the mean over n of the per-instance statistics, the variance unbiased:
    running_mean = (1 - momentum) * running_mean + momentum * mean_n(mean),
    running_var = (1 - momentum) * running_var + momentum * mean_n(var * m / (m - 1)).

    Returns y, or (y, running_mean, running_var) with ``running_stats``. The statistics its autograd
    saves are not returned: F.instance_norm exposes none, and their dtype depends on the device
    (f32 on CUDA, x's dtype on CPU when weights or running statistics are given); InstanceNormBwd
    takes them as f32 inputs, as CUDA saves them.

    FLOPs: 5 per element: 3 for the statistics, 2 for y = x * scale + shift per (n, c).
    """

    name = "InstanceNormFwd"
    summary = "Instance norm with input statistics, optional affine and running statistics"
    params = {**InstanceNormOp.params, "momentum": MOMENTUM}
    flops_per_element = 5

    def kernel_outputs(self, w, run):
        def instance_norm(x, weight=None, bias=None, running_mean=None, running_var=None):
            y = run(x, weight, bias, running_mean, running_var)[0]
            return y if running_mean is None else (y, running_mean, running_var)

        instance_norm.config = run.config
        return instance_norm
    # The f32 outputs of 16-bit workloads are the running statistics, which aten::instance_norm
    # updates through copies in x's dtype (bf16 rounds them to ~0.4%).
    tolerances = {"f32": Tolerance(1e-2, 1e-2)}

    def make_inputs(self, w, rng):
        cfg = self.config(w)
        c = channels(w)
        inputs = {"x": activations(rng, w.shapes["x"], w.dtype_of("x"))}
        if cfg["affine"]:
            inputs["weight"] = affine_weight(rng, (c,), w.dtype_of("weight"))
            inputs["bias"] = affine_bias(rng, (c,), w.dtype_of("bias"))
        if cfg["running_stats"]:
            inputs.update(running_stats(rng, c, w.dtype_of("running_mean")))
        return inputs

    def torch_impl(self, w):
        cfg = self.config(w)
        momentum, eps = cfg["momentum"], cfg["eps"]

        def instance_norm(x, weight=None, bias=None, running_mean=None, running_var=None):
            y = F.instance_norm(x, running_mean, running_var, weight, bias, True, momentum, eps)
            return y if running_mean is None else (y, running_mean, running_var)

        return instance_norm
