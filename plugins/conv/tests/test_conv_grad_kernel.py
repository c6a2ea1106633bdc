"""Our TileLang convolution-gradient kernels (npuops_conv.conv_grad_kernel): the stride-phase
arithmetic against brute force; the launch rules; representative kernels compile for sm_90a anywhere
(CPU CI); the index arithmetic of every kernel runs on TileLang's CPU target (the direct kernels as
they are, the GEMMs with T.gemm replaced by a scalar loop); on a GPU (marker ``gpu``) every kernel
of every catalog workload of Conv2dDgrad, Conv2dWgrad and Conv2dTranspose matches an fp32 torch
reference, outputs pre-filled with NaN so that unwritten elements fail, and the weight gradient
gives the same bits twice."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from npuops.kernels import CPU_TARGET, compile_kernel
from npuops_conv.conv_grad_kernel import (
    DimPhases,
    Grad,
    _dgrad_gemm,
    _wgrad,
    dgrad_default,
    dgrad_kernel,
    dgrad_variants,
    unsupported,
    wgrad_default,
    wgrad_direct_launch,
    wgrad_kernel,
    wgrad_variants,
)
from npuops_conv.conv_kernel import ConvLaunch, Problem
from npuops_conv.layouts import CHANNELS_FIRST, CHANNELS_LAST
from npuops_conv.ops._geometry import ConvGeometry

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
GRAD_OPS = ("Conv2dDgrad", "Conv2dWgrad", "Conv2dTranspose")


def geo(batch, c_in, c_out, size, kernel, stride=1, pad=0, dilation=1, groups=1, bias=False):
    """A ConvGeometry (the forward convolution); ints stand for every spatial dim."""
    rank = len(size)

    def dims(v):
        return (v,) * rank if isinstance(v, int) else tuple(v)

    return ConvGeometry(batch, c_in, c_out, tuple(size), dims(kernel), dims(stride), dims(pad), dims(pad),
                        dims(dilation), groups, bias)


def grad(g, dtype=F16, bias=False, output_layout=CHANNELS_LAST):
    return Grad(Problem(g, dtype), bias, output_layout)


LAYOUTS = pytest.mark.parametrize("output_layout", [CHANNELS_LAST, CHANNELS_FIRST])


def catalog():
    """(op, workload) of every catalog workload of the three gradient ops."""
    from npuops_conv.plugin import npuops_ops

    return [(op, w) for op in npuops_ops() if op.name in GRAD_OPS for w in op.workloads]


# -- the stride phases (no compiler) ---------------------------------------------------------------

@pytest.mark.parametrize("size,kernel,stride,pad,dilation", [
    (56, 3, 2, 1, 1), (111, 3, 2, 1, 1), (56, 5, 2, 2, 1), (223, 3, 2, 1, 1), (8, 1, 2, 0, 1), (9, 3, 3, 2, 2),
    (10, 2, 3, 0, 2), (32, 3, 1, 12, 12), (13, 4, 2, 3, 3), (7, 3, 4, 1, 2),
])
def test_phases_visit_exactly_the_taps_that_hit_each_row(size, kernel, stride, pad, dilation):
    out = (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1
    d = DimPhases(size, out, kernel, stride, pad, dilation)
    seen = {}
    for r in range(stride):
        assert d.count[r] == len(d.taps[r])
        for j in range(d.q):
            i = d.i0[r] + stride * j
            for u in range(d.count[r]):
                k, o = d.first[r] + d.step * u, j + d.base[r] - u * d.delta
                assert (o * stride == i + pad - k * dilation), (r, j, u)
                if i < size and 0 <= o < out:
                    seen.setdefault(i, set()).add((k, o))
                assert d.row_check or i < size
                assert d.low_check or o >= 0
                assert d.high_check or o < out
    for i in range(size):  # every (tap, output row) reading input row i, and nothing else
        brute = {(k, o) for k in range(kernel) for o in range(out) if o * stride - pad + k * dilation == i}
        assert seen.get(i, set()) == brute, i


# -- launch rules (no compiler) ------------------------------------------------------------------

def test_each_catalog_workload_takes_its_kernel():
    kinds = {}
    for op, w in catalog():
        q = grad(op.geometry(w), w.dtype_of("input"))
        launch = wgrad_default(q) if op.name == "Conv2dWgrad" else dgrad_default(q)
        kinds[op.name, w.id] = launch.kernel
        assert op.kernel_unsupported(w) is None
        if launch.kernel == "split_k":
            k_tiles = (-(-q.positions // launch.block_K) if op.name == "Conv2dWgrad"
                       else q.max_taps * -(-q.problem.og // launch.block_K))
            assert (launch.splits - 1) * -(-k_tiles // launch.splits) < k_tiles  # no empty split
    assert len(kinds) == 93
    for name in GRAD_OPS:  # depthwise and thin groups: direct
        assert kinds[name, "W14"] == kinds[name, "W23"] == "direct"
    assert kinds["Conv2dDgrad", "W28"] == "direct"  # 3 input channels: N_gemm = 3
    assert kinds["Conv2dTranspose", "W28"] == "direct"  # 3 channels per tap: K = taps * 3
    assert kinds["Conv2dTranspose", "W7"] == "split_k"  # K = 9 * 2048 over 1024 rows
    assert kinds["Conv2dDgrad", "W24"] == kinds["Conv2dTranspose", "W26"] == "gemm"  # stride 2: phases
    assert kinds["Conv2dWgrad", "W15"] == "split_k"  # 6272 positions, two output tiles


@pytest.mark.parametrize("g", [geo(1, 128, 256, (56, 56), 3, stride=2, pad=1), geo(1, 256, 2048, (32, 32), 3, pad=12,
                                                                                  dilation=12)])
def test_launch_variants_are_valid_configs_default_first(g):
    for q, variants, default in ((grad(g), dgrad_variants, dgrad_default), (grad(g), wgrad_variants, wgrad_default)):
        configs = variants(q)
        assert configs[0] == default(q).as_dict()
        assert len(configs) == len({tuple(sorted(c.items())) for c in configs})
        for c in configs:
            launch = ConvLaunch(**c)
            assert launch.kernel in ("gemm", "split_k", "direct")
            if launch.kernel != "direct":
                assert launch.num_stages >= 1 and launch.block_K % 8 == 0


def test_specs_describe_channels_last_tensors():
    g = geo(2, 64, 32, (10, 12), 3, stride=2, pad=1, bias=True)
    m, rows_in = 2 * math.prod(g.out_size), 2 * 120
    spec = dgrad_kernel(g, F16, True, ("input", "weight"))
    assert dict(spec.params) == {"input": (m, 32), "weight": (32, 9 * 64), "bias": (64,), "output": (rows_in, 64)}
    assert spec.returns == (("output", (2, 10, 12, 64)),)
    spec = wgrad_kernel(g, BF16, kernel="split_k", block_M=64, block_N=64, block_K=64, num_stages=2, threads=128,
                        splits=3)
    params = dict(spec.params)
    assert [name for name, _ in spec.params] == ["input", "grad_output", "grad_weight", "grad_bias", "workspace",
                                                 "bias_workspace"]
    assert params["grad_weight"] == (32, 9 * 64) and params["workspace"] == (3, 32, 9 * 64)
    assert spec.returns == (("grad_weight", (32, 3, 3, 64)), ("grad_bias", (32,)))
    assert spec.outputs["workspace"] == spec.outputs["bias_workspace"] == F32


def test_a_channels_first_dgrad_output_is_declared_and_returned_nchw():
    g = geo(2, 64, 32, (10, 12), 3, stride=2, pad=1, bias=True)
    for launch in ({}, {"kernel": "direct", "block_M": 16, "block_N": 64, "block_K": 0, "num_stages": 0,
                        "threads": 256, "splits": 1}):
        spec = dgrad_kernel(g, F16, True, ("input", "weight"), output_layout=CHANNELS_FIRST, **launch)
        assert dict(spec.params)["output"] == (2, 64, 120)
        assert spec.returns == (("output", (2, 64, 10, 12)),)
        assert spec.config["output_layout"] == CHANNELS_FIRST
    split = dgrad_kernel(geo(1, 256, 2048, (8, 8), 3, pad=1), F16, output_layout=CHANNELS_FIRST,
                         kernel="split_k", block_M=64, block_N=64, block_K=64, num_stages=3, threads=128, splits=4)
    assert dict(split.params)["output"] == (1, 256, 64) and dict(split.params)["workspace"] == (4, 64, 256)
    assert dgrad_kernel(g, F16).config["output_layout"] == CHANNELS_LAST


def test_unsupported_dtypes_and_sizes_are_named():
    assert "float8" in unsupported(geo(1, 4, 4, (5, 5), 3), torch.float8_e4m3fn)
    assert "2^31" in unsupported(geo(1, 1024, 8, (2048, 2048), 1), F16)
    assert unsupported(geo(1, 4, 4, (5, 5), 3), BF16) is None


# -- compiles for sm_90a (no GPU needed) ----------------------------------------------------------

COMPILED = [
    ("dgrad-3x3", lambda: dgrad_kernel(geo(2, 64, 64, (56, 56), 3, pad=1), F16)),
    ("dgrad-stride2-phases", lambda: dgrad_kernel(geo(1, 128, 256, (56, 56), 5, stride=2, pad=2), F16)),
    ("transpose-split-k-bias", lambda: dgrad_kernel(geo(1, 256, 2048, (32, 32), 3, pad=12, dilation=12, bias=True),
                                                    F16, True, ("input", "weight"))),
    ("dgrad-depthwise-direct", lambda: dgrad_kernel(geo(1, 32, 32, (56, 56), 3, pad=1, groups=32), F16)),
    ("wgrad-split-k-bias", lambda: wgrad_kernel(geo(2, 64, 64, (56, 56), 3, pad=1, bias=True), BF16)),
    ("wgrad-depthwise-direct", lambda: wgrad_kernel(geo(1, 32, 32, (56, 56), 3, pad=1, groups=32), F16)),
]


# The data gradient's channels-first epilogue: the phase GEMM's (stride 2, bias), split-K's sum's,
# the direct kernel's.
COMPILED_CHANNELS_FIRST = [
    ("dgrad-stride2-phases-bias", lambda: dgrad_kernel(geo(1, 128, 256, (56, 56), 5, stride=2, pad=2, bias=True),
                                                       F16, True, ("input", "weight"), output_layout=CHANNELS_FIRST)),
    ("transpose-split-k-bias", lambda: dgrad_kernel(geo(1, 256, 2048, (32, 32), 3, pad=12, dilation=12, bias=True),
                                                    F16, True, ("input", "weight"), output_layout=CHANNELS_FIRST)),
    ("dgrad-depthwise-stride2-direct", lambda: dgrad_kernel(geo(1, 32, 32, (56, 56), 3, stride=2, pad=1, groups=32),
                                                            BF16, output_layout=CHANNELS_FIRST)),
]


@pytest.mark.parametrize("name,build", COMPILED + COMPILED_CHANNELS_FIRST,
                         ids=[c[0] for c in COMPILED] + [f"{c[0]}-channels-first" for c in COMPILED_CHANNELS_FIRST])
def test_kernel_compiles_for_sm90(name, build):
    pytest.importorskip("tilelang")
    spec = build()
    source = compile_kernel(spec.prim_func, arch="sm_90a").get_kernel_source()
    assert "atomic" not in source.lower()  # every reduction in a fixed order
    launches = source.count("__launch_bounds__")
    kind = spec.config["kernel"]
    if kind != "direct":
        assert "wgmma" in source
        assert "cp_async_gs_conditional<" in source  # the gathered tile: predicated async copies
    if spec.config["op"] == "dgrad":
        assert launches == (2 if kind == "split_k" else 1)
    else:  # the GEMM or direct partials, the ordered sum, and the bias partials and their sum
        assert launches == (kind != "gemm") + 1 + 2 * ("grad_bias" in spec.outputs)


# -- the index arithmetic, run on TileLang's CPU target ----------------------------------------------

def run_cpu(spec, **inputs):
    """The spec's kernel on the CPU target, outputs (workspaces too) pre-filled with NaN."""
    from npuops.kernels import launcher

    kernel = compile_kernel(spec.prim_func, target=CPU_TARGET)
    tensors = {name: inputs[name] if name in inputs else torch.full(shape, float("nan"), dtype=spec.outputs[name])
               for name, shape in spec.params}
    run = launcher(kernel, torch.device("cpu"), [shape for _, shape in spec.params])
    run.run([tensors[name] for name, _ in spec.params], {})
    return tensors


def dgrad_reference(g, dy, w, bias=None):
    """fp32 data gradient (+ bias) of channels-last dy and w, channels-last."""
    dx = torch.ops.aten.convolution_backward(
        dy.float().movedim(-1, 1), torch.empty(1, device=dy.device).expand(g.input_shape), w.float().movedim(-1, 1), None,
        list(g.stride), list(g.pad_before), list(g.dilation), False, [0] * len(g.stride), g.groups,
        [True, False, False])[0].movedim(1, -1)
    return dx if bias is None else dx + bias.float()


def wgrad_reference(g, x, dy):
    """fp32 (grad_weight channels-last, grad_bias) of channels-last x and dy."""
    _, dw, db = torch.ops.aten.convolution_backward(
        dy.float().movedim(-1, 1), x.float().movedim(-1, 1), torch.empty(1, device=x.device).expand(g.weight_shape),
        [g.out_channels], list(g.stride), list(g.pad_before), list(g.dilation), False, [0] * len(g.stride), g.groups,
        [False, True, True])
    return dw.movedim(1, -1), db


# Small geometries with every feature of the phase arithmetic (kept few: each builds two kernels):
# stride and dilation per dim (stride 3 with dilation 2: taps 0, 3, ... of every phase), 1x1 stride 2
# (phases no tap hits: zeros), output rows past the last window, groups, channel counts that leave
# partial tiles. DimPhases itself is checked against brute force above for more combinations.
CPU_DGRAD = [
    ("stride-per-dim-dilated", geo(2, 3, 5, (10, 7), (3, 2), stride=(2, 3), pad=(1, 0), dilation=(1, 2))),
    ("pointwise-stride2-zero-phases", geo(1, 4, 4, (8, 8), 1, stride=2)),
    ("5x5-stride2-groups", geo(1, 4, 6, (12, 13), 5, stride=2, pad=2, groups=2)),
    ("stride1-dilated", geo(1, 4, 4, (7, 7), 3, pad=2, dilation=2)),
]


def _laid_out(output: torch.Tensor, ref: torch.Tensor, output_layout: str) -> torch.Tensor:
    """A kernel's ``output`` as the channels-last ``ref`` [N, *spatial, C] (its values, in either
    layout the kernel wrote them: channels first, [N, C, positions])."""
    if output_layout == CHANNELS_LAST:
        return output.view(ref.shape)
    return output.view(ref.movedim(-1, 1).shape).movedim(1, -1)


@LAYOUTS
@pytest.mark.parametrize("name,g", CPU_DGRAD, ids=[c[0] for c in CPU_DGRAD])
def test_dgrad_matches_torch_on_the_cpu_target(name, g, output_layout):
    """The direct kernel and the phase GEMM (T.gemm emulated; its K tiles straddle the group's
    output channels, its N tiles the group's input channels) on the same inputs, in either output
    layout (channels first: each phase's rows stored to their input positions)."""
    pytest.importorskip("tilelang")
    gen = torch.Generator().manual_seed(1)
    dy = torch.randn(g.batch, *g.out_size, g.out_channels, generator=gen)
    w = torch.randn(g.out_channels, *g.kernel, g.in_channels // g.groups, generator=gen)
    bias = torch.randn(g.in_channels, generator=gen)
    ref = dgrad_reference(g, dy, w)
    direct = dgrad_kernel(g, F32, kernel="direct", block_M=16, block_N=4, block_K=0, num_stages=0, threads=64, splits=1,
                          output_layout=output_layout)
    torch.testing.assert_close(_laid_out(run_cpu(direct, grad_output=dy, weight=w)["output"], ref, output_layout), ref,
                               atol=1e-4, rtol=1e-4)
    gemm = _dgrad_gemm(grad(g, F32, bias=True, output_layout=output_layout), ConvLaunch("gemm", 16, 8, 8, 1, 32, 1),
                       ("input", "weight"), emulate_gemm=True)
    torch.testing.assert_close(_laid_out(run_cpu(gemm, input=dy, weight=w, bias=bias)["output"], ref, output_layout),
                               ref + bias, atol=1e-4, rtol=1e-4)


@LAYOUTS
def test_dgrad_split_k_matches_torch_on_the_cpu_target(output_layout):
    pytest.importorskip("tilelang")
    g = geo(1, 12, 20, (6, 7), 3, pad=2, dilation=2)
    gen = torch.Generator().manual_seed(2)
    dy = torch.randn(g.batch, *g.out_size, g.out_channels, generator=gen)
    w = torch.randn(g.out_channels, *g.kernel, g.in_channels, generator=gen)
    bias = torch.randn(g.in_channels, generator=gen)
    spec = _dgrad_gemm(grad(g, F32, bias=True, output_layout=output_layout), ConvLaunch("split_k", 16, 8, 8, 1, 32, 4),
                       ("input", "weight"), emulate_gemm=True)  # 9 taps x 3 K tiles over 4 splits: the last has a tail
    ref = dgrad_reference(g, dy, w, bias)
    torch.testing.assert_close(_laid_out(run_cpu(spec, input=dy, weight=w, bias=bias)["output"], ref, output_layout),
                               ref, atol=1e-4, rtol=1e-4)


CPU_WGRAD = [
    ("split-k-bias-stride2", geo(2, 6, 5, (9, 11), 3, stride=2, pad=1, bias=True),
     ConvLaunch("split_k", 16, 16, 8, 1, 32, 3)),
    ("gemm-groups-flat", geo(1, 4, 6, (7, 8), (3, 2), stride=(1, 2), pad=(2, 1), dilation=(2, 1), groups=2),
     ConvLaunch("gemm", 16, 8, 8, 1, 32, 1)),
    ("direct-groups-bias", geo(1, 4, 8, (8, 8), 3, pad=1, groups=4, bias=True), None),
    ("direct-depthwise-stride2", geo(2, 3, 3, (9, 7), 3, stride=2, pad=1, groups=3), None),
]


@pytest.mark.parametrize("name,g,launch", CPU_WGRAD, ids=[c[0] for c in CPU_WGRAD])
def test_wgrad_matches_torch_on_the_cpu_target(name, g, launch):
    pytest.importorskip("tilelang")
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(g.batch, *g.in_size, g.in_channels, generator=gen)
    dy = torch.randn(g.batch, *g.out_size, g.out_channels, generator=gen)
    q = grad(g, F32, g.bias)
    spec = _wgrad(q, wgrad_direct_launch(q, outputs=16, threads=16)) if launch is None else _wgrad(
        q, launch, emulate_gemm=True)
    out = run_cpu(spec, input=x, grad_output=dy)
    dw, db = wgrad_reference(g, x, dy)
    torch.testing.assert_close(out["grad_weight"].view(dw.shape), dw, atol=1e-4, rtol=1e-4)
    if g.bias:
        torch.testing.assert_close(out["grad_bias"], db, atol=1e-4, rtol=1e-4)


# -- on the GPU ------------------------------------------------------------------------------------

TOLERANCE = {F16: 4e-3, BF16: 2e-2, F32: 2e-3}  # of rms(reference) + |reference|; fp32 runs as TF32


def _close(out, ref, dtype, what):
    assert not out.isnan().any(), f"{what}: {int(out.isnan().sum())} outputs unwritten or NaN"
    err = (out.float() - ref).abs()
    allowed = TOLERANCE[dtype] * (ref.square().mean().sqrt() + ref.abs())
    assert (err <= allowed).all(), f"{what}: max error {err.max().item():.3g}, rms(ref) {ref.square().mean().sqrt():.3g}"


def run_gpu(spec, inputs):
    """The spec's kernel on the GPU, outputs (workspaces too) pre-filled with NaN."""
    from npuops.kernels import launcher

    device = torch.device("cuda")
    kernel = compile_kernel(spec.prim_func)
    tensors = {name: inputs[name] if name in inputs else
               torch.full(shape, float("nan"), dtype=spec.outputs[name], device=device)
               for name, shape in spec.params}
    run = launcher(kernel, device, [shape for _, shape in spec.params])
    run.run([tensors[name] for name, _ in spec.params], run.sizes({}))
    torch.cuda.synchronize()
    return tensors


def check_on_gpu(op, w, config: dict | None = None, seed: int = 0):
    """``op``'s kernel for ``w`` (``config``: a launch variant) against the fp32 reference; the
    outputs it wrote."""
    g, dtype = op.geometry(w), w.dtype_of("input")
    device = torch.device("cuda")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    config = config or {}

    def randn(*shape, std=1.0):
        return (torch.randn(*shape, device=device, generator=gen) * std).to(dtype)

    if op.name == "Conv2dWgrad":
        x = randn(g.batch, *g.in_size, g.in_channels)
        dy = randn(g.batch, *g.out_size, g.out_channels, std=1 / math.sqrt(g.batch * math.prod(g.out_size)))
        spec = wgrad_kernel(g, dtype, **config)
        out = run_gpu(spec, {"input": x, "grad_output": dy})
        dw, db = wgrad_reference(g, x, dy)
        _close(out["grad_weight"].view(dw.shape), dw, dtype, f"{op.name} {w.id} {spec.config} grad_weight")
        if g.bias:
            _close(out["grad_bias"], db, dtype, f"{op.name} {w.id} grad_bias")
        return out
    dy = randn(g.batch, *g.out_size, g.out_channels)
    wt = randn(g.out_channels, *g.kernel, g.in_channels // g.groups, std=1 / math.sqrt(g.fan_out))
    bias = randn(g.in_channels, std=0.1) if op.kernel_bias(w) else None
    spec = dgrad_kernel(g, dtype, op.kernel_bias(w), op.kernel_inputs, **config)
    inputs = {op.kernel_inputs[0]: dy, "weight": wt, **({"bias": bias} if bias is not None else {})}
    out = run_gpu(spec, inputs)
    ref = dgrad_reference(g, dy, wt, bias)
    if op.name == "Conv2dTranspose":  # the op's own formulation agrees with the data gradient
        transposed = F.conv_transpose2d(dy.float().movedim(-1, 1), wt.float().movedim(-1, 1),
                                        None if bias is None else bias.float(), g.stride, g.padding,
                                        g.transpose_output_padding, g.groups, g.dilation).movedim(1, -1)
        torch.testing.assert_close(transposed, ref, atol=1e-3, rtol=1e-3)
    _close(out["output"].view(ref.shape), ref, dtype, f"{op.name} {w.id} {spec.config}")
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("op_name", GRAD_OPS)
def test_every_catalog_workload_matches_torch(op_name):
    for op, w in catalog():
        if op.name == op_name:
            check_on_gpu(op, w)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("op_name", GRAD_OPS)
def test_every_launch_variant_of_every_catalog_workload_matches_torch(op_name):
    for op, w in catalog():
        if op.name == op_name:
            for config in op.tilelang_variants(w):
                check_on_gpu(op, w, config, seed=1)


@pytest.mark.gpu
def test_weight_gradient_is_deterministic():
    """Twice on the same inputs: the same bits (split-K and the bias sums reduce in a fixed order)."""
    ops = {op.name: op for op, _ in catalog()}
    op = ops["Conv2dWgrad"]
    for w in op.workloads:
        if w.id in ("W8", "W16", "W14", "W7"):  # deep split-K, bias, direct, dilated
            first, second = check_on_gpu(op, w, seed=2), check_on_gpu(op, w, seed=2)
            for name in ("grad_weight", "grad_bias"):
                if name in first:
                    assert torch.equal(first[name], second[name]), (w.id, name)


@pytest.mark.gpu
def test_ops_build_their_kernels_on_nchw_inputs():
    """The ops' ``tilelang_build`` callables (NCHW inputs converted channels-last) match the ops'
    torch formulations."""
    from npuops import InputRNG

    device = torch.device("cuda")
    for op, w in catalog():
        if w.id not in ("W1", "W24", "W14"):
            continue
        inputs = op.make_inputs(w, InputRNG(device, 0))
        ours = op.tilelang_build(w, device)(**inputs)
        ref = op.torch_impl(w)(**{k: v.float() for k, v in inputs.items()})
        ours, ref = (ours, ref) if isinstance(ours, tuple) else ((ours,), (ref,))
        for o, r in zip(ours, ref, strict=True):
            assert o.shape == r.shape
            _close(o, r, w.dtype_of("input"), f"{op.name} {w.id}")
