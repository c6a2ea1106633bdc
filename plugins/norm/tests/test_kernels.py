"""Our TileLang row kernels: they compile for sm_90 on any machine (CPU CI); on a GPU (marker
``gpu``) every catalog workload and shapes the catalog lacks pass the correctness gate."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from npuops.check import check
from npuops.kernels import compile_kernel, multiprocessors
from npuops.registry import load_registry
from npuops_norm.rowwise_kernel import RowNorm

tilelang = pytest.importorskip("tilelang")

REGISTRY = load_registry(strict=True)
OURS = {name: REGISTRY.implementation(name, "tilelang") for name, impls in REGISTRY.implementations.items()
        if any(i.name == "tilelang" for i in impls)}
EXPECTED = {"RMSNormFwd", "LayerNormFwd", "FusedAddRMSNormFwd", "FusedAddLayerNormFwd", "RMSNormQuantFwd",
            "LayerNormQuantFwd", "GemmaRMSNormFwd", "QKNormFwd", "GroupRMSNormFwd", "L1NormFwd", "L2NormFwd",
            "AdaLayerNormFwd", "WeightNormFwd", "SpectralNormPowerIterFwd"}


def reshaped(op, w, rows: int, hidden: int):
    """``w`` with x [rows, hidden], dropping params tied to the old shape."""
    params = {k: v for k, v in w.params.items() if k != "normalized_shape"}
    chosen = {k: v for k, v in w.chosen.items() if k != "batch"}
    if "batch" in op.params and rows % 2 == 0:
        chosen["batch"] = 2
    return dataclasses.replace(w, id=f"{w.id}-{rows}x{hidden}", shapes={"x": [rows, hidden]}, params=params, chosen=chosen)


def test_every_row_norm_has_a_kernel():
    assert EXPECTED <= set(OURS)


ROW_KERNEL_OPS = sorted(EXPECTED - {"SpectralNormPowerIterFwd"})
RMS = RowNorm("rms", 1e-6, weight="w")
FUSED_ADD_RMS = RowNorm("rms", 1e-6, weight="w", residual=True)
FUSED_ADD_LAYER_NORM = RowNorm("meanvar", 1e-5, weight="w", bias=True, residual=True)
LAYER_NORM = RowNorm("meanvar", 1e-5, weight="w", bias=True)
LAYER_NORM_QUANT = RowNorm("meanvar", 1e-5, weight="w", bias=True, quant_min_scale=1e-8)
RMS_QUANT = RowNorm("rms", 1e-6, weight="w", quant_min_scale=1e-8)


def row_spec(op, w):
    from npuops_norm.rowwise_kernel import rowwise_kernel

    return rowwise_kernel(op.row_norm(w), w.shapes["x"], w.dtype_of("x"), samples=op.kernel_samples(w))


@pytest.mark.parametrize("op_name", ROW_KERNEL_OPS)
def test_row_kernel_compiles_for_sm90(op_name):
    op = REGISTRY.op(op_name)
    for w in (op.workloads[0], reshaped(op, op.workloads[0], 3, 1000)):
        if op.kernel_unsupported(w):
            continue
        spec = row_spec(op, w)
        source = compile_kernel(spec.prim_func, arch="sm_90").get_kernel_source()
        assert "__global__" in source and spec.config["threads"] % 32 == 0


def test_spectral_norm_kernels_compile_for_sm90_at_both_ends_of_their_variants():
    from npuops_norm import spectral_kernel as sk

    for rows in (1, 2048):
        cols, dt = 8192, "bfloat16"
        variants = sk.launch_variants(rows, cols, torch.bfloat16)
        assert len({tuple(v.items()) for v in variants}) == len(variants) > 1
        passes = [v for v in variants if not v.get("cooperative") and not v.get("column_slabs")]
        # Many rows: one cooperative launch in column slabs by default, then the row slabs, then five
        # launches with programmatic dependent launch.
        assert variants[0].get("column_slabs", False) == passes[0].get("pdl", False) == (rows > 1)
        for config in (passes[0], passes[-1]):
            threads, pdl = config["threads"], config.get("pdl", False)
            kernels = [sk._single_row(cols, dt, 2, 1e-12, threads, config.get("cluster", 1))] if rows == 1 else [
                sk._column_partials(rows, cols, dt, config["row_chunks"], pdl),
                sk._sum_partials(cols, config["row_chunks"], pdl), sk._row_dots(rows, cols, dt, threads, pdl),
                sk._finish(rows, cols, dt, 1e-12, pdl), sk._scale(rows, cols, dt, threads, pdl)]
            for position, prim_func in enumerate(kernels):
                source = compile_kernel(prim_func, arch="sm_90").get_kernel_source()
                assert "__global__" in source
                # With programmatic dependent launch every pass but the first waits for the one before.
                assert ("cudaGridDependencySynchronize" in source) == (pdl and position > 0)


def test_spectral_norm_cooperative_kernel_compiles_with_a_grid_barrier_between_passes():
    from npuops_norm import spectral_kernel as sk

    cooperative = [v for v in sk.launch_variants(2048, 8192, torch.bfloat16) if v.get("cooperative")]
    assert cooperative[0] == {"threads": 512, "cooperative": True}
    assert [v for v in sk.launch_variants(1024, 2048, torch.bfloat16) if v.get("cooperative")][0] == {"threads": 256, "cooperative": True}
    assert {v["threads"] for v in sk.launch_variants(2048, 8192, torch.bfloat16) if v.get("cooperative")} == {256, 512}
    assert {v["threads"] for v in sk.launch_variants(2048, 16384, torch.bfloat16) if v.get("cooperative")} == {512}  # 32 columns a thread
    assert not any(v.get("cooperative") for v in sk.launch_variants(1, 8192, torch.bfloat16) + sk.launch_variants(2048, 32768, torch.bfloat16))
    assert [sk.held_rows(2048, cols, 2, 128) for cols in (4096, 8192, 16384)] == [16, 13, 6]
    assert sk.cooperative_blocks(2048, 8192) == 128 and sk.cooperative_blocks(3072, 6144, sms=108) == 64
    source = compile_kernel(sk._cooperative(2048, 8192, "bfloat16", 2, 1e-12, 512, 128), arch="sm_90").get_kernel_source()
    assert source.count("this_grid().sync()") == 3


def test_spectral_norm_column_slabs_split_w_evenly_and_compile_with_two_grid_barriers():
    """Each block a slab of whole 16-byte vectors of every row, a power of two of lanes a row, an
    equal share of the rows for the sums of z; the steps over a slab held in shared memory, then in
    registers, then read again, as many as the slab has; no barrier between the two passes over W."""
    from npuops_norm import spectral_kernel as sk

    assert [sk.column_slab_blocks(2048, cols, 2) for cols in (4096, 8192, 16384)] == [128] * 3
    assert sk.column_slab_blocks(3072, 6144, 2) == 96  # 64 columns a block: 8 lanes a row
    assert sk.column_slab_blocks(2048, 12288, 2) is None  # 96 or 192 columns: no power of two of lanes
    assert not any(v.get("column_slabs") for v in sk.launch_variants(1, 8192, torch.bfloat16) + sk.launch_variants(2048, 12288, torch.bfloat16))
    for rows, cols in ((2048, 4096), (2048, 8192), (2048, 16384), (1024, 2048), (3072, 6144)):
        slabs = [v for v in sk.launch_variants(rows, cols, torch.bfloat16) if v.get("column_slabs")]
        assert slabs and all(sk.column_slabs_fit(rows, cols, 2, v["threads"]) for v in slabs)
        lanes = cols // sk.column_slab_blocks(rows, cols, 2) // 8
        for config in slabs:
            held = sk.column_slab_steps(rows, cols, 2, config["threads"], config["register_steps"],
                                        sk.column_slab_blocks(rows, cols, 2))
            assert sum(held) * config["threads"] == rows * lanes and held[0] > 0
            assert held[1] == config["register_steps"] or held[2] == 0
    # A GPU of fewer SMs splits W into fewer, wider slabs, and the steps follow its blocks.
    assert sk.column_slab_blocks(2048, 4096, 2, sms=108) == 64 and sk.column_slabs_fit(2048, 4096, 2, 512, sms=108)
    assert sum(sk.column_slab_steps(2048, 4096, 2, 512, 0, 64)) * 512 == 2048 * 8  # 8 lanes a row
    with pytest.raises(ValueError, match="column slabs cannot split W"):
        sk.build_power_iteration((2048, 12288), torch.bfloat16, 1e-12, torch.device("cpu"), threads=512, column_slabs=True)
    # Every step of a 4096-wide slab fits in shared memory: no variant holds any in registers.
    assert {v["register_steps"] for v in sk.launch_variants(2048, 4096, torch.bfloat16) if v.get("column_slabs")} == {0}
    # The default holds 4 steps in registers at 512 threads; a choice that holds as many as another
    # is not offered twice, and is named by the steps it holds (8192 wide: 5 at most at 512
    # threads, 9 at 256). f16 offers more steps in registers than bf16.
    def register_choices(cols, dtype):
        return [(v["threads"], v["register_steps"]) for v in sk.launch_variants(2048, cols, dtype) if v.get("column_slabs")]

    assert sk.launch_variants(2048, 8192, torch.bfloat16)[0] == {"threads": 512, "column_slabs": True, "register_steps": 4}
    assert register_choices(8192, torch.bfloat16) == register_choices(8192, torch.float16) \
        == [(512, 4), (512, 5), (512, 0), (256, 0), (256, 9)]
    assert register_choices(16384, torch.bfloat16) == [(512, 4), (512, 6), (512, 0), (256, 0), (256, 16), (256, 24)]
    assert register_choices(16384, torch.float16) == [(512, 4), (512, 12), (512, 8), (512, 0),
                                                      (256, 0), (256, 16), (256, 24), (256, 32)]
    assert register_choices(16384, torch.float32) == [(512, 0), (256, 0)]  # no register options for f32
    source = compile_kernel(sk._column_slabs(3072, 6144, "float16", 2, 1e-12, 256, 96, 16), arch="sm_90").get_kernel_source()
    # Pass 2 visits the 16 steps held in registers at once: a dot product's slot for each.
    assert source.count("this_grid().sync()") == 2 and "register_w[128]" in source and "dots[16]" in source


def test_spectral_norm_column_partials_cover_the_gpu_evenly():
    """About two blocks per SM on every catalog width, each chunk a whole number of unrolled steps."""
    from npuops_norm import spectral_kernel as sk

    for cols in (4096, 8192, 16384):
        for config in sk.launch_variants(2048, cols, torch.bfloat16):
            if config.get("cooperative") or config.get("column_slabs"):
                continue
            chunks = config["row_chunks"]
            assert 2048 % (chunks * sk.ROW_UNROLL) == 0
        chunks = sk.default_row_chunks(2048, cols)
        assert cols // sk.COLUMN_TILE * chunks == sk.COLUMN_PARTIAL_BLOCKS


@pytest.mark.parametrize("op_name", ROW_KERNEL_OPS)
def test_kernel_parameters_match_the_op(op_name):
    """Every kernel input is an op input, outputs never shadow one, and the returns match the
    torch formulation's outputs in number and shape (sizes given at launch resolved from the
    inputs, as a call resolves them)."""
    from npuops.kernels import BoundKernel

    op = REGISTRY.op(op_name)
    w = next(w for w in op.workloads if not op.kernel_unsupported(w))
    spec = row_spec(op, w)
    inputs, outputs = op.meta_io(w)
    params = [name for name, _ in spec.params]
    assert set(spec.outputs).isdisjoint(inputs)
    assert set(params) - set(spec.outputs) == set(inputs)
    bound = BoundKernel(spec, None, torch.device("cpu"))  # nothing compiled: only the shapes are read
    shapes = {name: tuple(t.shape) for name, t in inputs.items()}
    assert [tuple(shape) for _, shape in bound._returned(shapes, bound._sizes(shapes))] == [tuple(t.shape) for t in outputs]


def test_segments_hold_whole_rows():
    """dim=[0, 2] of [4, 128, 4096]: 128 blocks, each holding 4 whole 4096-long segments, unmasked."""
    from npuops_norm.rowwise_kernel import RowNorm, rowwise_kernel

    spec = rowwise_kernel(RowNorm("l2", 1e-12, segments=4), (4, 128, 4096), torch.float16)
    assert dict(spec.params)["x"] == (4, "rows", 4096) and spec.config["padded_to"] == 4 * 4096
    assert not spec.config["masked"]
    assert "__global__" in compile_kernel(spec.prim_func, arch="sm_90").get_kernel_source()


def test_normalize_over_other_dims_says_why_it_has_no_kernel():
    op = REGISTRY.op("L2NormFwd")
    assert op.kernel_unsupported(op.workload("W1")) is None  # dim [0, 2] of [4, 128, 4096]
    w = reshaped(op, op.workload("W1"), 4, 64)
    w = dataclasses.replace(w, params={"dim": [0]})
    assert "neither" in op.kernel_unsupported(w)


GPU_SHAPES = [(3, 5120), (4097, 7168), (2, 1000), (300, 1000)]


@pytest.mark.gpu
@pytest.mark.parametrize("op_name", sorted(EXPECTED))
def test_kernel_passes_the_gate_on_every_workload_and_odd_shapes(op_name):
    device = REGISTRY.device("cuda")
    op, impl = REGISTRY.op(op_name), OURS[op_name]
    workloads = [w for w in list(op.workloads) + [reshaped(op, op.workloads[-1], r, h) for r, h in GPU_SHAPES]
                 if not impl.why_not(op, w, device)]
    failures = []
    for w in workloads:
        result = check(op, w, impl.build(op, w, device.torch_device()), device, seed=11)
        if not result.ok:
            failures.append(f"{w.key} {w.shapes}: {result.detail}")
    assert not failures, "\n".join(failures)


def gate_variants(op_name, shapes, chosen, seed, catalog=True):
    """(variants checked, failures): the gate on every launch variant ``chosen`` picks, over the
    op's catalog workloads (unless not ``catalog``) and its last one reshaped to each (rows, hidden)
    of ``shapes``."""
    device = REGISTRY.device("cuda")
    op, impl = REGISTRY.op(op_name), OURS[op_name]
    workloads = [w for w in list(op.workloads if catalog else []) + [reshaped(op, op.workloads[-1], r, h) for r, h in shapes]
                 if not impl.why_not(op, w, device)]
    checked, failures = 0, []
    for w in workloads:
        for config in op.tilelang_variants(w):
            if chosen(config):
                checked += 1
                result = check(op, w, impl.build(op, w, device.torch_device(), config=config), device, seed=seed)
                if not result.ok:
                    failures.append(f"{w.key} {w.shapes} {config}: {result.detail}")
    return checked, failures


CLUSTER_SHAPES = [(1, 12288), (3, 16384), (2, 32768)]  # 6 blocks of a row; several rows; 4096 per block


@pytest.mark.gpu
@pytest.mark.parametrize("op_name", sorted(EXPECTED - {"GroupRMSNormFwd"}))
def test_every_cluster_split_passes_the_gate_on_the_gpu(op_name):
    """Every launch variant that splits rows over a cluster, on the catalog's decode rows and others."""
    shapes = CLUSTER_SHAPES if op_name != "SpectralNormPowerIterFwd" else [(1, 12288), (1, 32768)]
    checked, failures = gate_variants(op_name, shapes, lambda config: config.get("cluster", 1) > 1, seed=13)
    assert checked >= 2 * len(shapes) and not failures, "\n".join(failures)


@pytest.mark.gpu
@pytest.mark.parametrize("workload", ["W7", "W1", "W8"])  # one row in one block, in a cluster; many rows
def test_layer_norm_is_exact_on_rows_far_from_zero(workload):
    """Rows of mean 300 and standard deviation about 1: a sum and a sum of squares in fp32 would
    lose the variance; Welford's merge (every variant taking it) and the two-pass form keep it."""
    from npuops.data import InputRNG

    device = REGISTRY.device("cuda")
    op = REGISTRY.op("LayerNormFwd")
    w = op.workload(workload)
    inputs = op.make_inputs(w, InputRNG(device.torch_device(), 3))
    inputs["x"] += 300
    reference = op.reference(inputs, w)
    variants = op.tilelang_variants(w)
    assert {v.get("welford", True) for v in variants} == {True, False}
    for config in variants:
        out = OURS["LayerNormFwd"].build(op, w, device.torch_device(), config=config)(**inputs)
        result = op.compare(out, reference, w)
        assert result.ok, (config, result.detail)


@pytest.mark.gpu
def test_misaligned_input_is_rejected():
    device = REGISTRY.device("cuda")
    op = REGISTRY.op("RMSNormFwd")
    fn = OURS["RMSNormFwd"].build(op, op.workload("W7"), device.torch_device())  # [1, 4096] bf16
    x = torch.randn(4097, device="cuda", dtype=torch.bfloat16)[1:].view(1, 4096)
    with pytest.raises(ValueError, match="16-byte boundary"):
        fn(x=x, weight=torch.ones(4096, device="cuda", dtype=torch.bfloat16))


@pytest.mark.gpu
def test_non_contiguous_input_is_rejected():
    device = REGISTRY.device("cuda")
    op = REGISTRY.op("RMSNormFwd")
    w = op.workload("W8")
    fn = OURS["RMSNormFwd"].build(op, w, device.torch_device())
    x = torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16).t()
    with pytest.raises(ValueError, match="must be contiguous"):
        fn(x=x, weight=torch.ones(4096, device="cuda", dtype=torch.bfloat16))


@pytest.mark.parametrize("spec,rows,hidden,threads,blocks,cluster", [
    (RMS, 2048, 4096, 128, 4, 1), (RMS_QUANT, 2048, 4096, 128, 2, 1), (RMS, 1, 4096, 512, 1, 1), (RMS, 1, 8192, 128, 1, 4), (RMS, 1, 16384, 128, 1, 8),
    (RMS, 3, 12288, 128, 1, 6), (RMS, 1, 32768, 256, 1, 8), (RMS, 1, 7168, 128, 1, 1), (RMS, 16, 16384, 512, 1, 1),
    (RMS, 64, 32768, 1024, 1, 1), (RMS, 133, 4096, 128, 2, 1), (RMS, 2048, 8192, 256, 2, 1),
    (RMS, 2048, 16384, 256, 4, 1), (FUSED_ADD_RMS, 2048, 16384, 256, 2, 1), (LAYER_NORM, 2048, 8192, 128, 4, 1),
    (LAYER_NORM, 2048, 16384, 256, 2, 1), (LAYER_NORM_QUANT, 2048, 16384, 256, 2, 1), (LAYER_NORM, 2048, 4096, 128, 4, 1),
    (RMS_QUANT, 2048, 16384, 512, 2, 1), (RMS_QUANT, 2048, 8192, 256, 2, 1)])
def test_launch_rule(spec, rows, hidden, threads, blocks, cluster):
    """Many rows: ~32 elements per thread, registers for two blocks per SM where the rows outnumber
    the SMs (four, pipelined, on rows 4096 wide with an operand: see test_rule_pipelines_...), and 64
    a thread on rows 16384 wide (LayerNorm's 8192; not RMSNormQuant's, whose weight comes with the
    row), with four blocks where that stays within 128 registers or the row is light; a few
    (decode): ~8 per thread, registers
    unbounded, and a row 4 to 8 slices of 2048 wide split over a cluster of blocks, 16 elements per
    thread."""
    from npuops_norm.rowwise_kernel import rowwise_kernel

    config = rowwise_kernel(spec, (rows, hidden), torch.bfloat16).config
    assert (config["threads"], config["min_blocks_per_sm"], config["cluster"]) == (threads, blocks, cluster)


@pytest.mark.parametrize("stat,values", [("rms", 1), ("meanvar", 2)])
def test_cluster_split_rows_meet_once(stat, values):
    """Each block of the cluster reduces its slice in one barrier, waits once for the cluster to
    start, then sends its result (LayerNorm: mean and squared deviations) to every block (one store
    per block and value, from as many threads) and meets the cluster at one barrier."""
    from npuops_norm.rowwise_kernel import RowNorm, rowwise_kernel

    spec = rowwise_kernel(RowNorm(stat, 1e-6, weight="w", bias=stat == "meanvar"), (1, 16384), torch.bfloat16)
    source = compile_kernel(spec.prim_func, arch="sm_90").get_kernel_source()
    body = source[source.index("__launch_bounds__(128, 1)"):]
    assert body.count("tl::cluster_arrive_relaxed()") == body.count("tl::cluster_wait()") == 1
    assert body.count("tl::cluster_sync()") == body.count("threadIdx.x) < 8)") == body.count("__syncthreads()") == 1
    assert body.count("npuops_store_to_cluster_rank(") == values
    assert body.index("tl::cluster_wait()") > body.rindex("(X +")  # the row's loads are issued first


@pytest.mark.parametrize("rows,prefetch,barriers", [(1, None, 1), (2048, None, 1), (2048, False, 2)])
def test_rms_quant_rows_with_their_weight_take_the_absmax_with_the_sum_of_squares(rows, prefetch, barriers):
    """With the weight in registers (the rule), an RMS row's max |x w| (its max |y| times rms) is
    reduced with its sum of squares behind one barrier (a decode row: one cluster barrier), and q
    formed from x w without y; otherwise the absmax of y is a second reduction."""
    from npuops_norm.rowwise_kernel import rowwise_kernel

    spec = rowwise_kernel(RMS_QUANT, (rows, 16384), torch.bfloat16, prefetch=prefetch)
    source = compile_kernel(spec.prim_func, arch="sm_90").get_kernel_source()
    body = source[source.index("__launch_bounds__"):]
    assert body.count("__syncthreads()") + body.count("tl::cluster_sync()") == barriers * (2 if rows == 1 else 1)
    assert body.count("warp_reduce_max") == 1 and body.count("warp_reduce_sum") == 1


@pytest.mark.parametrize("welford,barriers", [(True, 1), (False, 2)])
def test_layer_norm_takes_mean_and_variance_in_one_reduction(welford, barriers):
    """Welford: each thread's moments, merged across the warp by shuffles, then the warps' in one
    exchange; otherwise a mean, then a centered sum."""
    from npuops_norm.rowwise_kernel import RowNorm, rowwise_kernel

    spec = rowwise_kernel(RowNorm("meanvar", 1e-5, weight="w", bias=True), (3, 4096), torch.bfloat16, welford=welford)
    source = compile_kernel(spec.prim_func, arch="sm_90").get_kernel_source()
    assert spec.config["welford"] == welford and source.count("__syncthreads()") == barriers
    assert source.count("__shfl_xor_sync") == (10 if welford else 0)


@pytest.mark.parametrize("quantized", [False, True])
def test_cluster_rows_may_exchange_through_mbarriers(quantized):
    """The exchange_barriers variants of a cluster row: thread 0 initializes an mbarrier a
    reduction (Welford's mean and m2 wait on one) and releases the inits before the cluster's start
    barrier; each reduction then sends its results with st.async, completing the bytes the
    receiver's barrier expects (4 a value and block), and waits on its own barrier: no cluster
    barrier after the start one."""
    from npuops_norm.rowwise_kernel import RowNorm, launch_variants, rowwise_kernel

    spec = RowNorm("meanvar", 1e-5, weight="w", bias=True, quant_min_scale=1e-7 if quantized else None)
    variants = launch_variants(spec, (1, 16384), torch.bfloat16)
    clustered = [v for v in variants if v.get("cluster", 1) > 1]
    assert [v for v in clustered if v.get("exchange_barriers")] == [{**v, "exchange_barriers": True}
                                                                     for v in clustered[:3]]
    kernel = rowwise_kernel(spec, (1, 16384), torch.bfloat16, threads=128, min_blocks=1, cluster=8, exchange_barriers=True)
    body = compile_kernel(kernel.prim_func, arch="sm_90").get_kernel_source()
    body = body[body.index("__launch_bounds__(128, 1)"):]
    reductions = 2 if quantized else 1  # the moments, then max|y|
    assert body.count("npuops_init_exchange_barrier(") == reductions  # a barrier a reduction
    assert body.index("npuops_fence_barrier_init()") < body.index("tl::cluster_arrive_relaxed()")
    assert body.count("tl::cluster_arrive_relaxed()") == body.count("tl::cluster_wait()") == 1
    assert "cluster_sync" not in body and "npuops_store_to_cluster_rank(" not in body
    assert body.count("npuops_wait_exchange(") == body.count("npuops_expect_exchange_bytes(") == reductions
    assert "npuops_expect_exchange_bytes(barrier, 64)" in body  # mean and m2 from 8 blocks
    assert body.count("npuops_send_to_cluster_rank(") == 2 + quantized
    with pytest.raises(ValueError, match="exchange barriers are for rows split over a cluster"):
        rowwise_kernel(spec, (2048, 16384), torch.bfloat16, exchange_barriers=True)


def test_cluster_split_needs_plain_rows_of_whole_vectors():
    from npuops_norm.rowwise_kernel import RowNorm, launch_variants, rowwise_kernel

    with pytest.raises(ValueError, match="split over 8 blocks needs one group"):
        rowwise_kernel(RowNorm("rms", 1e-6, groups=4), (1, 16384), torch.bfloat16, threads=128, cluster=8)
    with pytest.raises(ValueError, match="slices the 128 threads of a block share evenly, got rows 8000 wide"):
        rowwise_kernel(RowNorm("rms", 1e-6), (1, 8000), torch.bfloat16, threads=128, cluster=8)
    variants = launch_variants(RowNorm("rms", 1e-6, weight="w"), (1, 16384), torch.bfloat16)
    assert variants[:3] == [{"threads": 128, "min_blocks": 1, "cluster": 8}, {"threads": 256, "min_blocks": 1, "cluster": 8},
                            {"threads": 256, "min_blocks": 1, "cluster": 4}]
    assert not any("cluster" in v for v in launch_variants(RowNorm("rms", 1e-6, groups=8), (1, 16384), torch.bfloat16))


@pytest.mark.parametrize("rows,prefetch,early", [(1, None, True), (2048, None, False), (2048, True, True)])
def test_few_rows_load_the_weight_with_the_row(rows, prefetch, early):
    """Decode rows issue the weight's loads before the block reduction, so the two DRAM latencies
    overlap; many-row kernels read it (L2-resident) after, keeping registers for resident rows,
    unless the launch asks for it early (a tuning variant)."""
    from npuops_norm.rowwise_kernel import RowNorm, rowwise_kernel

    spec = rowwise_kernel(RowNorm("rms", 1e-6, weight="w"), (rows, 4096), torch.bfloat16, prefetch=prefetch)
    source = compile_kernel(spec.prim_func, arch="sm_90").get_kernel_source()
    body = source[source.index("__launch_bounds__"):]
    assert (body.index("(W +") < body.index("__syncthreads")) == early


def test_rows_a_warp_holds_load_their_operands_with_the_row():
    """Many rows a warp holds, one a block (LayerNorm 300 x 1000 f32: 32 threads), load their weight
    and bias with the row by rule; not where a block packs several rows, nor where a row takes
    more than a warp; the other choice stays a variant."""
    from npuops_norm.rowwise_kernel import launch_variants, rowwise_kernel

    assert rowwise_kernel(LAYER_NORM, (300, 1000), torch.float32).config["prefetch"]
    variants = launch_variants(LAYER_NORM, (300, 1000), torch.float32)
    assert {v.get("prefetch") for v in variants if v["threads"] == 32 and v["min_blocks"] > 1} == {None, False}
    assert not rowwise_kernel(RMS, (4096, 128), torch.bfloat16).config["prefetch"]  # 8 rows a block
    assert not rowwise_kernel(LAYER_NORM, (300, 4096), torch.float32).config["prefetch"]
    # A row of more than a vector a lane takes a block of its own (768 f16: three a lane).
    assert rowwise_kernel(LAYER_NORM, (1576, 768), torch.float16).config["rows_per_block"] == 1


@pytest.mark.parametrize("hidden,threads,barriers", [(4096, 256, 1), (1000, 64, 1), (8192, 1024, 1)])
def test_plain_rows_reduce_through_one_barrier(hidden, threads, barriers):
    """A plain row's sum: warp shuffles, then one exchange of the warps' sums through shared memory
    (TileLang's block all-reduce would take two barriers per power of two from threads/2 to 32)."""
    from npuops_norm.rowwise_kernel import RowNorm, rowwise_kernel

    spec = rowwise_kernel(RowNorm("rms", 1e-6, weight="w"), (3, hidden), torch.bfloat16, threads=threads)
    source = compile_kernel(spec.prim_func, arch="sm_90").get_kernel_source()
    assert source.count("__syncthreads()") == barriers and "AllReduce" not in source
    assert source.count("warp_reduce_sum") == 1


@pytest.mark.parametrize("threads,own", [(256, True), (512, True), (128, False)])
def test_groups_of_whole_warps_reduce_through_one_barrier(threads, own):
    """Eight groups of 1024: with whole warps a group (256 or 512 threads) their sums meet in one
    exchange as a plain row's do, where TileLang's all-reduce ran once per group a thread held;
    with 16 threads a group (128 threads) the all-reduce stays."""
    from npuops_norm.rowwise_kernel import RowNorm, rowwise_kernel

    spec = rowwise_kernel(RowNorm("rms", 1e-6, weight="w", groups=8), (3, 8192), torch.bfloat16, threads=threads)
    source = compile_kernel(spec.prim_func, arch="sm_90").get_kernel_source()
    assert ("AllReduce" not in source and source.count("__syncthreads()") == 1) == own
    assert spec.config["warp_reduce"] == own


def test_launch_variants_start_with_the_rule_and_each_compiles():
    """What `npuops run --tune` chooses among: the rule's launch first, then others that split
    the (grouped) row evenly."""
    from npuops_norm.rowwise_kernel import rowwise_kernel

    op = REGISTRY.op("GroupRMSNormFwd")
    w = op.workload("W2")
    variants = op.tilelang_variants(w)
    default = row_spec(op, w).config
    assert variants[0] == {"threads": default["threads"], "min_blocks": default["min_blocks_per_sm"]}
    assert len(variants) > 2 and len({tuple(v.items()) for v in variants}) == len(variants)
    for config in variants:
        spec = rowwise_kernel(op.row_norm(w), w.shapes["x"], w.dtype_of("x"), **config)
        assert not spec.config["masked"] and spec.config["threads"] == config["threads"]
        assert "__global__" in compile_kernel(spec.prim_func, arch="sm_90").get_kernel_source()


def test_many_rows_offer_registers_capped_at_128_96_and_64():
    """Many rows' launch variants cap registers at 128, 96 and 64 a thread (the blocks per SM that
    leaves room for, told to ptxas through the launch bounds) where that asks for more blocks than
    the rule's two; decode rows are left as they were."""
    from npuops_norm.rowwise_kernel import RowNorm, launch_variants, rowwise_kernel

    spec = RowNorm("meanvar", 1e-5, weight="w", bias=True)
    asked = {(v["threads"], v["min_blocks"]) for v in launch_variants(spec, (2048, 8192), torch.bfloat16)
             if v["min_blocks"] > 2}
    assert asked == {(128, 4), (128, 5), (128, 8), (256, 4)}  # 512 threads: two blocks already cap them at 64
    assert max(v["min_blocks"] for v in launch_variants(spec, (1, 8192), torch.bfloat16)) == 1
    source = compile_kernel(rowwise_kernel(spec, (2048, 8192), torch.bfloat16, threads=128, min_blocks=8).prim_func,
                            arch="sm_90").get_kernel_source()
    assert "__launch_bounds__(128, 8)" in source


def test_rows_no_power_of_two_divides_offer_wider_blocks():
    """A row no power of two divides (1000 wide) pads to the block: every share gives the widest
    block its share fits, 32 threads for f32 LayerNorm rows, so blocks 2 and 4 times as wide are
    variants too, each padding the row to 1024 and masking the tail."""
    from npuops_norm.rowwise_kernel import launch_variants, rowwise_kernel

    variants = launch_variants(LAYER_NORM, (300, 1000), torch.float32)
    assert variants[0]["threads"] == 32
    wider = [v for v in variants if v["threads"] > 32]
    assert {v["threads"] for v in wider} == {64, 128}
    for config in wider[:2]:
        spec = rowwise_kernel(LAYER_NORM, (300, 1000), torch.float32, **config)
        assert spec.config["masked"] and spec.config["padded_to"] == 1024
        assert "__global__" in compile_kernel(spec.prim_func, arch="sm_90").get_kernel_source()


def test_padded_rows_of_whole_vectors_load_a_vector_at_a_time():
    """A padded row whose length is whole 16-byte vectors (1000 f32) clamps its masked tail a vector
    at a time, so its row, weight and bias load as vectors; a row that is not (999) clamps each
    element. The GPU gate checks both (test_kernel_passes_the_gate_on_every_workload_and_odd_shapes)."""
    from npuops_norm.rowwise_kernel import rowwise_kernel

    def source(hidden):
        spec = rowwise_kernel(LAYER_NORM, (300, hidden), torch.float32)
        assert spec.config["masked"]
        return compile_kernel(spec.prim_func, arch="sm_90").get_kernel_source()

    vectors = source(1000)
    assert all(f"*(float4*)({name} + " in vectors for name in ("X", "W", "B"))
    assert "float4" not in source(999).split("main_kernel(", 2)[2].split("Y +")[0]


def test_rows_one_warp_holds_take_several_rows_a_block():
    """Rows a warp holds whole (Qwen's 128-wide head-dim rows) take blocks of 8 rows by rule where
    they fill two blocks an SM, 4 as a variant, a block a row after them; fewer rows keep a block
    a row (the packed blocks variants); the rows past the last of a partial block are neither read
    out of bounds nor stored. Not where a row takes more than a warp, nor for per-row operands."""
    from npuops_norm.rowwise_kernel import launch_variants, one_wave_rows, rowwise_kernel

    variants = launch_variants(RMS, (4096, 128), torch.bfloat16)
    packed = [v for v in variants if v.get("rows_per_block", 1) > 1]
    assert [(v["threads"], v["rows_per_block"]) for v in packed] == [(256, 8), (128, 4)] and variants[0] == packed[0]
    assert rowwise_kernel(RMS, (4096, 128), torch.bfloat16).config["rows_per_block"] == 8  # the rule's
    few = one_wave_rows() * 2
    assert "rows_per_block" not in launch_variants(RMS, (few, 128), torch.bfloat16)[0]
    assert rowwise_kernel(RMS, (few, 128), torch.bfloat16).config["rows_per_block"] == 1
    for config in packed:
        spec = rowwise_kernel(RMS, (4099, 128), torch.bfloat16, **config)
        assert spec.config["rows_per_block"] == config["rows_per_block"] and spec.config["warp_reduce"]
        source = compile_kernel(spec.prim_func, arch="sm_90").get_kernel_source()
        per_block = config["rows_per_block"]
        # Loads clamped to the last row, stores kept to the rows there are.
        assert re.search(r"min\(.*rows\) - \(int64_t\)1\)", source) or "(rows - 1)" in source
        assert re.search(rf"blockIdx.x\) \* {per_block}\) \+ .*\) < rows\)", source)
    assert not any(v.get("rows_per_block") for v in launch_variants(RMS, (4096, 4096), torch.bfloat16))
    assert not any(v.get("rows_per_block") for v in launch_variants(RMS, (4, 128), torch.bfloat16))  # decode
    assert not any(v.get("rows_per_block") for v in launch_variants(RMS_QUANT, (4096, 128), torch.bfloat16))
    with pytest.raises(ValueError, match="whole warps"):
        rowwise_kernel(RMS, (4096, 128), torch.bfloat16, threads=96, rows_per_block=4)


def test_many_plain_rows_offer_staging_in_shared_memory():
    """Many plain rows may be staged in shared memory (cp.async), at as many blocks per SM as
    their shared memory fits; decode rows, groups and segments are not."""
    from npuops_norm.rowwise_kernel import (SHARED_PER_SM, RowNorm, launch_variants, rowwise_kernel,
                                            staged_bytes)

    fused_add = RowNorm("rms", 1e-6, weight="w", residual=True)
    staged = [v for v in launch_variants(fused_add, (2048, 16384), torch.bfloat16) if v.get("staged")]
    assert staged and all(v["min_blocks"] * staged_bytes(fused_add, 16384, torch.bfloat16) < SHARED_PER_SM
                          for v in staged)
    assert {v["min_blocks"] for v in staged} == {2, 3}  # 64 KiB a row: four do not fit
    for spec, shape in [(fused_add, (1, 16384)), (RowNorm("rms", 1e-6, groups=8), (2048, 4096))]:
        assert not any(v.get("staged") for v in launch_variants(spec, shape, torch.bfloat16))
    source = compile_kernel(rowwise_kernel(fused_add, (2048, 16384), torch.bfloat16, **staged[0]).prim_func,
                            arch="sm_90").get_kernel_source()
    assert source.count("cp_async_gs<16>") == 2  # the row's and the residual's vectors
    with pytest.raises(ValueError, match="staged row"):
        rowwise_kernel(RowNorm("rms", 1e-6, groups=8), (2048, 4096), torch.bfloat16, staged=True)


def test_many_rows_with_per_column_operands_offer_chunked_stores():
    """Many plain rows 16384 wide with a weight, bias or modulation may form and store their output
    a vector a thread at a time, a compiler fence after each, their per-column operands' pointers
    not restrict (the fence would not hold their loads); narrower rows, decode rows, groups, pairs
    and int8 epilogues are not."""
    from npuops_norm.rowwise_kernel import launch_variants, rowwise_kernel

    chunked = [v for v in launch_variants(LAYER_NORM, (2048, 16384), torch.bfloat16) if v.get("chunked")]
    assert chunked and all(v["min_blocks"] > 1 for v in chunked)
    for spec, shape in [(LAYER_NORM, (1, 16384)), (LAYER_NORM, (2048, 8192)),
                        (RowNorm("rms", 1e-6, weight="w", groups=8), (2048, 16384)),
                        (RowNorm("rms", 1e-6, weight="w", quant_min_scale=1e-8), (2048, 16384)),
                        (RowNorm("rms", 1e-6, weight="w", pair=True), (2048, 16384)), (RowNorm("l2", 1e-12), (2048, 16384))]:
        assert not any(v.get("chunked") for v in launch_variants(spec, shape, torch.bfloat16))
    source = compile_kernel(rowwise_kernel(LAYER_NORM, (2048, 4096), torch.bfloat16, threads=128, chunked=True).prim_func,
                            arch="sm_90").get_kernel_source()
    assert source.count("npuops_compiler_fence();") == 4  # 32 elements a thread, 8 a vector
    assert "const bfloat16_t* W" in source and "const bfloat16_t* B" in source and "__restrict__ X" in source
    with pytest.raises(ValueError, match="a vector at a time"):
        rowwise_kernel(LAYER_NORM, (2048, 1000), torch.bfloat16, chunked=True)  # padded and masked


def test_rows_beyond_two_blocks_an_sm_offer_pipelined_launches():
    """Rows beyond two blocks an SM of plain rows without a residual may be pipelined: min_blocks
    blocks an SM, each taking every so many rows, the next row's loads issued before this row's
    reductions, a barrier after each row; other rows are not."""
    from npuops_norm.rowwise_kernel import launch_variants, rowwise_kernel

    pipelined = [v for v in launch_variants(LAYER_NORM_QUANT, (2048, 8192), torch.bfloat16) if v.get("pipelined")]
    assert pipelined and all(set(v) == {"threads", "min_blocks", "pipelined"} and v["min_blocks"] in (2, 4) for v in pipelined)
    for spec, shape in [(LAYER_NORM, (256, 8192)), (FUSED_ADD_RMS, (2048, 8192)), (LAYER_NORM, (2048, 1000)),
                        (RowNorm("rms", 1e-6, weight="w", groups=8), (2048, 4096))]:
        assert not any(v.get("pipelined") for v in launch_variants(spec, shape, torch.bfloat16))
    # Two rows of 64 elements a thread fill a 64-register budget (256 threads x 4 spilled), two of 16
    # leave too little of 32 (1024 threads): not offered. Two rows held in f32 at 128 registers are.
    wide = {(v["threads"], v["min_blocks"]) for v in launch_variants(RMS, (2048, 16384), torch.float16) if v.get("pipelined")}
    assert (256, 2) in wide and (256, 4) not in wide and (1024, 2) not in wide
    assert {(128, 4), (128, 2)} <= {(v["threads"], v["min_blocks"]) for v in pipelined}
    kernel = rowwise_kernel(LAYER_NORM_QUANT, (2048, 8192), torch.bfloat16, threads=128, min_blocks=4, pipelined=True)
    source = compile_kernel(kernel.prim_func, arch="sm_90").get_kernel_source()
    grid = multiprocessors() * 4
    assert f"< {-(-2048 // grid)}; ++" in source  # each block's rows
    assert source.count("__syncthreads()") == 3  # the two reductions' and one after each row
    with pytest.raises(ValueError, match="pipelined row"):
        rowwise_kernel(FUSED_ADD_RMS, (2048, 8192), torch.bfloat16, pipelined=True)


def test_many_rows_with_a_residual_load_with_the_evict_last_hint():
    """The rule loads many rows with a residual (and the residual) with the evict_last L2 hint, one
    16-byte load a vector; the launch variants offer the other choice for rows held as 16-bit values
    (not quantized ones, not rows held in f32, not staged or padded ones)."""
    from npuops_norm.rowwise_kernel import launch_variants, rowwise_kernel

    for spec, shape, rule in [(FUSED_ADD_RMS, (2048, 16384), True), (FUSED_ADD_LAYER_NORM, (2048, 8192), True),
                              (FUSED_ADD_RMS, (4, 8192), False), (FUSED_ADD_RMS, (2048, 1000), False),
                              (RMS, (2048, 8192), False)]:
        assert rowwise_kernel(spec, shape, torch.bfloat16).config["evict_last"] == rule
    kernel = rowwise_kernel(FUSED_ADD_RMS, (2048, 16384), torch.bfloat16, threads=512, min_blocks=2)
    source = compile_kernel(kernel.prim_func, arch="sm_90").get_kernel_source()
    assert source.count("npuops_load_evict_last((&") == 8  # 4 vectors a thread of the row and of the residual
    assert "L2::evict_last" in source
    others = [v for v in launch_variants(FUSED_ADD_RMS, (2048, 16384), torch.bfloat16) if "evict_last" in v]
    assert others and not any(v["evict_last"] or v.get("staged") for v in others)
    assert any(v.get("evict_last") for v in launch_variants(RMS, (2048, 16384), torch.bfloat16))
    for spec, shape in [(RMS_QUANT, (2048, 16384)), (LAYER_NORM, (4, 8192)), (RMS, (2048, 1000))]:
        assert not any("evict_last" in v for v in launch_variants(spec, shape, torch.bfloat16))
    assert not any(v.get("evict_last") and v.get("f32_row", True) for v in launch_variants(LAYER_NORM, (2048, 8192), torch.bfloat16))
    with pytest.raises(ValueError, match="evict_last"):
        rowwise_kernel(RMS, (2048, 1000), torch.bfloat16, evict_last=True)  # padded and masked
    with pytest.raises(ValueError, match="evict_last"):
        rowwise_kernel(FUSED_ADD_RMS, (2048, 8192), torch.bfloat16, threads=256, min_blocks=2, staged=True, evict_last=True)


@pytest.mark.parametrize("spec,shape,rule", [
    (RMS, (2048, 4096), True), (LAYER_NORM_QUANT, (2048, 4096), True), (RowNorm("l2_gain"), (2048, 4096), True),
    (LAYER_NORM, (2048, 3072), True), (RMS_QUANT, (2048, 4096), False), (RowNorm("l2", 1e-12), (2048, 4096), False),
    (RMS, (2048, 8192), False), (RMS, (2048, 2048), False), (RMS, (256, 4096), False), (FUSED_ADD_RMS, (2048, 4096), False),
    (LAYER_NORM, (2048, 3000), False)])  # 3000: padded
def test_rule_pipelines_many_rows_4096_wide_with_an_operand(spec, shape, rule):
    """The rule pipelines many plain rows over 2048 and at most 4096 wide that have a weight, bias,
    modulation or gain (not RMSNormQuant's, whose weight loads with the row; not padded ones), at
    four blocks an SM; the launch variants then start with it and still offer the rows one a block."""
    from npuops_norm.rowwise_kernel import launch_variants, rowwise_kernel

    config = rowwise_kernel(spec, shape, torch.bfloat16).config
    assert config["pipelined"] == rule
    variants = launch_variants(spec, shape, torch.bfloat16)
    assert variants[0].get("pipelined", False) == rule
    if rule:
        assert config["min_blocks_per_sm"] == 4 and {"threads": config["threads"], "min_blocks": 4} in variants


def test_many_layer_norm_rows_offer_rows_held_in_f32():
    """Many plain mean-and-variance rows (quantized or not) may hold the row in f32 from its load,
    the output formed in its place (one f32 fragment, no second); decode rows, rows with a residual
    and other statistics not."""
    from npuops_norm.rowwise_kernel import launch_variants, rowwise_kernel

    choices = [v for v in launch_variants(LAYER_NORM_QUANT, (2048, 16384), torch.bfloat16) if "f32_row" in v]
    assert choices and not any(v.get("chunked") or v.get("staged") for v in choices)
    # The rule holds many LayerNorm rows in f32 (offering them in 16 bits), other rows in 16 bits.
    for spec, shape, rule in [(LAYER_NORM, (2048, 8192), True), (LAYER_NORM_QUANT, (2048, 16384), True),
                              (LAYER_NORM, (2048, 4096), True), (LAYER_NORM, (4, 8192), False)]:
        assert rowwise_kernel(spec, shape, torch.bfloat16).config["f32_row"] == rule
        assert {v.get("f32_row", rule) for v in launch_variants(spec, shape, torch.bfloat16)} == ({True, False} if shape[0] > 8 else {False})
    assert not rowwise_kernel(LAYER_NORM, (2048, 8192), torch.bfloat16, staged=True).config["f32_row"]
    for spec, shape in [(LAYER_NORM_QUANT, (1, 16384)), (RMS_QUANT, (2048, 16384)), (FUSED_ADD_LAYER_NORM, (2048, 8192)),
                        (RMS, (2048, 16384))]:
        assert not any(v.get("f32_row") for v in launch_variants(spec, shape, torch.bfloat16))
    source = compile_kernel(rowwise_kernel(LAYER_NORM_QUANT, (2048, 4096), torch.bfloat16, threads=128,
                                           f32_row=True).prim_func, arch="sm_90").get_kernel_source()
    assert len(re.findall(r"float \w+\[32\];", source)) == 1 and "bfloat16_t raw[" not in source
    with pytest.raises(ValueError, match="held in f32"):
        rowwise_kernel(FUSED_ADD_RMS, (2048, 4096), torch.bfloat16, f32_row=True)


@pytest.mark.gpu
def test_every_rms_quant_row_with_its_weight_loaded_passes_the_gate_on_the_gpu():
    """Every RMSNormQuant launch variant that loads the weight with the row (the rule's: the absmax
    reduced with the sum of squares), on the catalog's workloads and odd shapes (7168 wide; 1000
    wide, padded and masked; 133 and 4097 rows)."""
    checked, failures = gate_variants("RMSNormQuantFwd", [(4097, 7168), (133, 16384), (64, 1000)],
                                      lambda config: config.get("prefetch", True), seed=31)
    assert checked >= 8 and not failures, "\n".join(failures)


@pytest.mark.gpu
@pytest.mark.parametrize("op_name", ["LayerNormFwd", "FusedAddRMSNormFwd", "FusedAddLayerNormFwd", "AdaLayerNormFwd",
                                     "GemmaRMSNormFwd"])
def test_every_chunked_row_passes_the_gate_on_the_gpu(op_name):
    """Every launch variant that stores rows a vector at a time, on the catalog's many-row
    workloads and odd shapes (5 x 3 x 1024 wide, 7 vectors a thread at 256 threads)."""
    checked, failures = gate_variants(op_name, [(4097, 7168 * 3), (133, 16384)], lambda config: config.get("chunked"),
                                      seed=19)
    assert checked >= 4 and not failures, "\n".join(failures)


@pytest.mark.gpu
@pytest.mark.parametrize("op_name", ["LayerNormQuantFwd", "LayerNormFwd", "AdaLayerNormFwd"])
def test_every_row_held_in_f32_passes_the_gate_on_the_gpu(op_name):
    """Every launch variant that holds rows in f32, on the catalog's many-row workloads
    and odd shapes (7168 wide: 7 vectors a thread at 128 threads; 1000 wide: padded and masked)."""
    rule = op_name in ("LayerNormFwd", "LayerNormQuantFwd")  # holds_f32: their many rows by default
    checked, failures = gate_variants(
        op_name, [(4097, 7168), (133, 16384), (64, 1000)],
        lambda config: config.get("f32_row", rule) and not config.get("staged") and not config.get("chunked"), seed=29)
    assert checked >= 8 and not failures, "\n".join(failures)


@pytest.mark.gpu
def test_every_wider_block_of_a_padded_row_passes_the_gate_on_the_gpu():
    """The launch variants wider than the rule's on rows no power of two divides (1000 wide)."""
    checked, failures = gate_variants("LayerNormFwd", [(300, 1000), (5, 1000)], lambda config: config["threads"] > 32,
                                      seed=37, catalog=False)
    assert checked >= 4 and not failures, "\n".join(failures)


@pytest.mark.gpu
@pytest.mark.parametrize("op_name", ["RMSNormFwd", "LayerNormFwd", "FusedAddRMSNormFwd", "L2NormFwd", "GemmaRMSNormFwd"])
def test_every_block_of_several_rows_passes_the_gate_on_the_gpu(op_name):
    """Blocks of 4 and 8 rows on rows a warp holds (64 and 128 wide), full blocks and a partial last."""
    checked, failures = gate_variants(op_name, [(4096, 128), (4099, 128), (37, 64)],
                                      lambda config: config.get("rows_per_block", 1) > 1, seed=41, catalog=False)
    assert checked >= 4 and not failures, "\n".join(failures)


@pytest.mark.gpu
def test_every_cooperative_power_iteration_passes_the_gate_on_the_gpu():
    """The power iteration in one cooperative launch, on the catalog's prefill workloads and shapes
    whose unrolls do not fill: 1024 x 2048 (8-row slabs at 256 threads), 3072 x 6144 (24-row slabs,
    3 vectors a row a thread), 2048 x 12288."""
    checked, failures = gate_variants("SpectralNormPowerIterFwd", [(1024, 2048), (3072, 6144), (2048, 12288)],
                                      lambda config: config.get("cooperative"), seed=23)
    assert checked >= 13 and not failures, "\n".join(failures)


@pytest.mark.gpu
def test_a_cooperative_launch_has_a_kernel_time_in_both_regimes():
    """TileLang launches a grid-synchronized kernel with cuLaunchCooperativeKernel, a launch the
    profiler does not record: npuops run --kernel-time still finds its one kernel, eager and
    replayed, no longer than the event time."""
    from npuops.timing import TimingOptions, kernel_time, measure
    from npuops_norm.spectral_kernel import build_power_iteration

    device, shape = REGISTRY.device("cuda"), (1024, 2048)
    weight, u = torch.randn(shape, device="cuda").bfloat16(), torch.randn(shape[0], device="cuda").bfloat16()
    power_iteration = build_power_iteration(shape, torch.bfloat16, 1e-12, weight.device, threads=512, column_slabs=True)
    for regime in ("eager", "graph"):
        kernels = kernel_time(lambda: power_iteration(weight, u, None), device, regime)
        assert kernels.activities == 1, f"{regime}: {kernels.activities} activities"
        assert 0 < kernels.median_ms <= measure(lambda: power_iteration(weight, u, None), device, regime,
                                                TimingOptions(budget_s=0.2)).median_ms


@pytest.mark.gpu
def test_every_column_slab_power_iteration_passes_the_gate_on_the_gpu():
    """The power iteration in column slabs, on the catalog's prefill workloads and shapes whose
    slabs are narrow (1024 x 2048: 2 lanes a row) or not a power-of-two count (3072 x 6144: 96
    blocks, with steps read again at every variant)."""
    checked, failures = gate_variants("SpectralNormPowerIterFwd", [(1024, 2048), (3072, 6144)],
                                      lambda config: config.get("column_slabs"), seed=31)
    assert checked >= 29 and not failures, "\n".join(failures)


@pytest.mark.gpu
@pytest.mark.parametrize("op_name", ["LayerNormFwd", "FusedAddRMSNormFwd", "FusedAddLayerNormFwd", "RMSNormQuantFwd",
                                     "WeightNormFwd"])
def test_every_staged_row_passes_the_gate_on_the_gpu(op_name):
    """Every launch variant that stages rows in shared memory, on the catalog's many-row workloads
    and an odd shape."""
    checked, failures = gate_variants(op_name, [(4097, 7168)], lambda config: config.get("staged"), seed=17)
    assert checked >= 8 and not failures, "\n".join(failures)


@pytest.mark.gpu
@pytest.mark.parametrize("op_name", ["LayerNormQuantFwd", "LayerNormFwd", "RMSNormQuantFwd", "AdaLayerNormFwd",
                                     "WeightNormFwd"])
def test_every_pipelined_launch_passes_the_gate_on_the_gpu(op_name):
    """Every pipelined launch variant (the rule's among them, 3072 wide) on odd shapes (4097 rows:
    blocks with one row more than others; 600 rows 16384 wide); the catalog's workloads are gated
    by the tuning run that times them."""
    checked, failures = gate_variants(op_name, [(4097, 3072), (4097, 7168), (600, 16384)],
                                      lambda config: config.get("pipelined"), seed=41, catalog=False)
    assert checked >= 1 and not failures, "\n".join(failures)  # LayerNorm's f32 rows fit one launch there


@pytest.mark.gpu
@pytest.mark.parametrize("op_name", ["FusedAddRMSNormFwd", "FusedAddLayerNormFwd", "RMSNormFwd", "QKNormFwd",
                                     "GroupRMSNormFwd", "AdaLayerNormFwd"])
def test_every_launch_with_the_evict_last_hint_passes_the_gate_on_the_gpu(op_name):
    """Every launch variant loading rows with the evict_last hint (the rule's for rows with a
    residual) on odd shapes (4097 rows 7168 wide: 7 vectors a thread at 128 threads; 133 x 16384);
    the catalog's workloads are gated by the tuning run that times them."""
    residual = op_name.startswith("FusedAdd")
    checked, failures = gate_variants(op_name, [(4097, 7168), (133, 16384)],
                                      lambda config: config.get("evict_last", residual), seed=43, catalog=False)
    assert checked >= 4 and not failures, "\n".join(failures)


@pytest.mark.gpu
def test_tuning_run_checks_and_times_every_variant(tmp_path):
    from npuops.results import read_results
    from npuops.runner import Runner, RunOptions
    from npuops.timing import TimingOptions

    op = REGISTRY.op("RMSNormFwd")
    w = op.workload("W7")  # one row: three thread counts
    options = RunOptions(device="cuda", regimes=("eager",), tune=True, timing=TimingOptions(budget_s=0.1))
    Runner(REGISTRY, options, tmp_path / "r.jsonl").run([w], ["tilelang"])
    (row,) = read_results(tmp_path / "r.jsonl").rows
    assert row["status"] == "ok", row
    # Each variant's kernel records its whole launch configuration.
    assert [t["config"]["threads"] for t in row["tuning"]] == [v["threads"] for v in op.tilelang_variants(w)]
    assert row["config"] == min(row["tuning"], key=lambda t: t["median_ms"])["config"]
