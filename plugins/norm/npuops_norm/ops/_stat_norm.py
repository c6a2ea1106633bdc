"""Shared spec pieces of the norms whose statistics feed a backward: batch, instance and group norm
(forward and backward) and the row-wise norms' backward ops.

Their inputs mix dtypes (f32 running or saved statistics beside 16-bit activations); the core's
reference upcasts every floating input to one dtype, and bytes and output dtypes are read off the
torch formulation run on the ``meta`` device, so that they always agree with what it returns.
"""

import math
from typing import ClassVar

import torch
from npuops import Cost, InputRNG, KernelOp, Op, Param, WorkloadError

from ._rowwise import at_least_f32

# Activations off-centre and wider than unit: the mean and variance a norm removes must matter.
ACTIVATION_MEAN = 0.5
ACTIVATION_STD = 1.5

EPS = Param(1e-5, "added to the variance before the square root (PyTorch's default)", types=(float,))
MOMENTUM = Param(
    0.1, "running statistic = (1 - momentum) * running statistic + momentum * batch statistic", types=(float,)
)


def activations(rng: InputRNG, shape, dtype: torch.dtype) -> torch.Tensor:
    return rng.normal(shape, dtype, mean=ACTIVATION_MEAN, std=ACTIVATION_STD)


def gradients(rng: InputRNG, shape, dtype: torch.dtype) -> torch.Tensor:
    return rng.normal(shape, dtype)


def affine_weight(rng: InputRNG, shape, dtype: torch.dtype) -> torch.Tensor:
    return rng.normal(shape, dtype, mean=1.0, std=0.1)


def affine_bias(rng: InputRNG, shape, dtype: torch.dtype) -> torch.Tensor:
    return rng.normal(shape, dtype, mean=0.0, std=0.1)


def running_stats(rng: InputRNG, channels: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Running statistics close to those of :func:`activations`, as after some training."""
    var = ACTIVATION_STD**2
    return {
        "running_mean": rng.normal((channels,), dtype, mean=ACTIVATION_MEAN, std=0.1),
        "running_var": rng.uniform((channels,), dtype, low=0.8 * var, high=1.2 * var),
    }


def mean_invstd(x: torch.Tensor, dim, eps: float, keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Biased mean and 1/sqrt(var + eps) of ``x`` over ``dim``: the statistics a forward saves."""
    var, mean = torch.var_mean(at_least_f32(x), dim=dim, correction=0, keepdim=keepdim)
    return mean, torch.rsqrt(var + eps)


def stats_for_aten(x: torch.Tensor, weight: torch.Tensor | None, *stats: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """ATen's CPU norm backward kernels take saved statistics in the weight's dtype, while CUDA's take
    them in f32 as its forward saved them; cast only where the kernel demands it."""
    if x.device.type != "cpu" or weight is None:
        return stats
    return tuple(s.to(weight.dtype) for s in stats)


def _as_tuple(out) -> tuple[torch.Tensor, ...]:
    return tuple(out) if isinstance(out, tuple | list) else (out,)


class StatNormOp(KernelOp):
    """Base: reference, output dtypes and memory from the core; bytes from its meta run. Each op
    says what our TileLang kernels take of its workloads (``kernel_unsupported``) and builds them
    (``tilelang_build``): the row-wise backward ops through backward_kernel, the channel norms
    through channel_kernel."""

    family = "norm"
    # Useful FLOPs per element of x (each subclass states how it counts them).
    flops_per_element: ClassVar[int]
    # Inputs the formulation takes but no implementation needs to read (e.g. a bias whose only
    # role is to ask for its gradient).
    unread_inputs: ClassVar[tuple[str, ...]] = ()

    def cost(self, w):
        return Cost(bytes=self.io_bytes(w, self.unread_inputs), flops=self.flops_per_element * math.prod(w.shapes["x"]))

    def kernel_unsupported(self, w):
        return f"{self.name} has no TileLang kernel yet"


def channels(w) -> int:
    return w.shapes["x"][1]


def check_x_rank(op: Op, w, least: int, layout: str) -> None:
    if len(w.shapes["x"]) < least:
        raise WorkloadError(f"{op.name} {w.id}: shape of 'x' {list(w.shapes['x'])} must be {layout}")


def check_optional_pair(op: Op, w, names: tuple[str, str], flag: str, enabled: bool,
                        needed: tuple[str, ...] | None = None) -> None:
    """``names`` appear in ``shapes`` only when param ``flag`` is true, each shaped [C], and those
    ``needed`` (default: all) then must."""
    c = channels(w)
    for name in names:
        if enabled and name not in w.shapes and name in (names if needed is None else needed):
            raise WorkloadError(f"{op.name} {w.id}: param {flag!r} is true, so 'shapes' needs {name!r} = [{c}]")
        if not enabled and name in w.shapes:
            raise WorkloadError(f"{op.name} {w.id}: 'shapes' has {name!r} but param {flag!r} is false; drop it")
        if enabled and name in w.shapes and tuple(w.shapes[name]) != (c,):
            raise WorkloadError(
                f"{op.name} {w.id}: shape of {name!r} {list(w.shapes[name])} must be [{c}] (x's channels)"
            )


class ChannelKernelOp(StatNormOp):
    """A channel norm (batch, instance or group norm) with our kernels (channel_kernel): the op
    says what its workload is as a :class:`~npuops_norm.channel_kernel.ChannelNorm` and how the
    kernels' results make its outputs (``kernel_outputs``)."""

    # The affine tensors an affine workload must name: a backward reads no bias (its workloads may
    # name one to describe the forward; a gradient function has none to give).
    affine_needed: ClassVar[tuple[str, ...]] = ("weight", "bias")

    kernel_description = ("TileLang channel-norm kernels: a block per unit where a unit fits its registers, "
                          "else per-block partial sums, a fixed-order combine, an elementwise pass")

    def channel_norm(self, w):
        raise NotImplementedError

    def kernel_unsupported(self, w):
        from ..channel_kernel import unsupported

        return unsupported(self.channel_norm(w))

    def kernel_key(self, w):
        return self.channel_norm(w)

    def tilelang_variants(self, w):
        from ..channel_kernel import launch_variants

        return launch_variants(self.channel_norm(w))

    def kernel_callable(self, w, device, config=None, target=None):
        """fn(**inputs) -> the op's outputs, from the kernels built for ``target`` (the GPU's by default)."""
        from ..channel_kernel import build_channel_norm

        return self.kernel_outputs(w, build_channel_norm(self.channel_norm(w), device, target=target,
                                                         **(config or {})))

    def kernel_outputs(self, w, run):
        return run

    def tilelang_build(self, w, device, config=None):
        return self.kernel_callable(w, device, config)


def spatial_size(w) -> int:
    return math.prod(w.shapes["x"][2:])


def optional_dtype(w, name: str, default: torch.dtype) -> torch.dtype:
    return w.dtype_of(name) if name in w.shapes else default
