"""Our conv kernels built for TileLang's CPU target in place of the GPU's, through the functions:
the functions' wiring of the kernels (plans, layout checks, channels-last binding, backward),
checked without a GPU. Shared by the tests."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator

import torch

# The kernels the CPU target builds (no tensor cores): the GEMM with its tile product as loops
# (``portable``) for the forward convs, the direct kernels for the gradients.
_FORWARD = {"kernel": "gemm", "block_M": 16, "block_N": 8, "block_K": 8, "num_stages": 1, "threads": 128}


def forward_spec(op, w, **launch):
    """The forward kernel of ``w`` in the output layout the op is asked for, of ``launch`` (a
    ConvLaunch's fields; by default the GEMM above)."""
    from npuops_conv.conv_kernel import conv_kernel

    return conv_kernel(op.geometry(w), w.dtype_of("input"), op.fused_relu, portable=True,
                       output_layout=op.output_layout(w), **(launch or _FORWARD))


def dgrad_spec(op, w):
    """The direct data gradient of ``w`` in the output layout the op is asked for."""
    from npuops_conv.conv_grad_kernel import dgrad_kernel

    return dgrad_kernel(op.geometry(w), w.dtype_of("input"), op.kernel_bias(w), op.kernel_inputs, kernel="direct",
                        block_M=16, block_N=4, block_K=0, num_stages=0, threads=64, splits=1,
                        output_layout=op.output_layout(w))


def wgrad_spec(op, w):
    from npuops_conv.conv_grad_kernel import Grad, _wgrad, wgrad_direct_launch
    from npuops_conv.conv_kernel import Problem

    g = op.geometry(w)
    q = Grad(Problem(g, w.dtype_of("input")), g.bias)
    return _wgrad(q, wgrad_direct_launch(q, outputs=16, threads=16))


def fp8_stand_in(op, w):
    """Not a build: the CPU target builds no GEMM of 8- or 16-bit tiles (fp8 operands, a bf16
    output), so for Conv2dFp8Fwd a callable of the kernel's channels-last tensors computing the op's
    torch formulation (dequantized to bf16), returning [N, *spatial_out, C_out] (or, channels first,
    [N, C_out, *spatial_out]) as the kernel does: the functions' routing of the call (layouts,
    binding, output) checked, not the kernel's arithmetic."""
    from npuops_conv.layouts import CHANNELS_LAST

    conv = op.torch_impl(w)
    channels_last_output = op.output_layout(w) == CHANNELS_LAST

    def kernel(input, weight, x_scale, w_scale):
        y = conv(input.movedim(-1, 1), weight.movedim(-1, 1), x_scale, w_scale)
        return (y.movedim(1, -1) if channels_last_output else y).contiguous()

    return kernel


GRADIENTS = {"Conv2dDgrad": dgrad_spec, "Conv2dWgrad": wgrad_spec}
# The forward functions' ops (conv_transpose2d's kernel: the data gradient of the conv it transposes)
FORWARD = {**{name: forward_spec for name in ("Conv1dFwd", "Conv2dFwd", "Conv3dFwd", "Conv1dCausal", "Conv2dBiasRelu")},
           "Conv2dTranspose": dgrad_spec}


@contextlib.contextmanager
def use_cpu_target_kernels(monkeypatch, specs: dict[str, Callable],
                           received: Callable[[str, dict[str, torch.Tensor]], None] | None = None) -> Iterator[None]:
    """Within: plans of CPU calls of the functions whose op ``specs`` names (op name -> ``spec(op,
    w)``, a KernelSpec, or a callable of the kernel's tensors standing in for a build, such as
    :func:`fp8_stand_in`) run that kernel built for TileLang's CPU target and bound as the op's build
    binds it (``layouts.channels_last_kernel``), as CUDA calls run theirs built for the GPU (plans
    made before, the fronts' fast calls too, are forgotten on entry and on exit). ``received(op
    name, tensors)``: told what each launch hands the kernel itself (the channels-last tensors by
    name) and, as ``"output"`` among them, what the kernel returned."""
    import pytest

    pytest.importorskip("tilelang")
    from npuops import functional as core
    from npuops.kernels import CPU_TARGET, compile_kernel
    from npuops.registry import load_registry
    from npuops_conv.layouts import channels_last_kernel

    registry = load_registry()
    make_plan = core._plan
    cpu = torch.device("cpu")

    def plan(fn, described, devices, params):
        made = make_plan(fn, described, devices, params)
        if made.reason != "cpu device" or fn.op not in specs:
            return made
        op = registry.op(fn.op)
        w = core._workload(fn, op, described, params)
        if op.kernel_unsupported(w) is not None:
            return made
        spec = specs[fn.op](op, w)
        is_spec = hasattr(spec, "prim_func")
        bound = spec.bind(compile_kernel(spec.prim_func, target=CPU_TARGET), cpu) if is_spec else spec

        def seen(**tensors):
            output = bound(**tensors)
            received(fn.op, {**tensors, "output": output})
            return output

        # the output layout the op is asked for, as its build binds it
        kernel = channels_last_kernel(bound if received is None else seen, op.output_layout(w))
        read = [name not in fn.shape_only for name in made.names]

        def launch(*tensors):
            return kernel(**{n: t for n, t, r in zip(made.names, tensors, read) if r})

        return dataclasses.replace(made, kernel=kernel, launch=launch, reason=None)

    monkeypatch.setattr(core, "_plan", plan)
    for function in core._functions:
        monkeypatch.setattr(function, "_plans", {})
    core.forget_fast_paths()
    try:
        yield
    finally:
        core.forget_fast_paths()  # they run this plan's kernels
