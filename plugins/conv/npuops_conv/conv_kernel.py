"""The TileLang forward-convolution kernels of this plugin, chosen by :func:`conv_kernel`
(``kernel`` in a launch config): ``"gemm"``, an implicit GEMM on tensor cores; ``"split_k"``, the
same GEMM with its K range split over several blocks and a deterministic second pass;
``"direct"``, a CUDA-core direct convolution for depthwise and thin grouped convolutions;
``"window"``, a CUDA-core convolution for a small K (a stem's 3 channels x 9 taps), a launch
variant; and ``"halo"``, the GEMM over boxes of output positions whose input a block loads once,
a launch variant.

Layouts are channels-last: input ``[N, *in_size, C_in]`` (NLC / NHWC / NDHWC), weight
``[C_out, *kernel, C_in/groups]`` (the reduction dim K contiguous), output ``[N, *out_size, C_out]``
or, asked for (``output_layout`` CHANNELS_FIRST: what torch returns for NC[D]HW-contiguous
tensors), ``[N, C_out, *out_size]``; bias ``[C_out]``. The kernels view them flat: input
``[N*prod(in_size), C_in]``, weight ``[C_out, K]``, output ``[M, C_out]`` (channels first:
``[N, C_out, P]`` with ``P = prod(out_size)``, row m's outputs at ``[m // P, :, m % P]``). Every
rank is computed as 3-d (leading spatial dims of 1, which the index arithmetic folds away), so
1-d/2-d/3-d, stride, asymmetric padding (``pad_before`` / ``pad_after``; a causal conv pads before
only), dilation and groups are index arithmetic in one template, never copies of it.

Implicit GEMM, per group ``g``: ``M = N * prod(out_size)`` rows (output positions),
``N_gemm = C_out / groups`` columns, ``K = taps * Cg`` with ``Cg = C_in / groups`` and the
reduction index ``k = tap * Cg + c``; ``tap = (kd * kH + kh) * kW + kw``. Row ``m`` decodes to
``(n, od, oh, ow)``; its input element for ``k`` is at ``(n, od*sD - pD + kd*dD, oh*sH - pH +
kh*dH, ow*sW - pW + kw*dW, g*Cg + c)``, zero when any coordinate falls outside the input (the
padding, before or after) or ``k >= K``. A block of ``block_M`` x ``block_N`` outputs walks K in
``block_K`` tiles in a ``T.Pipelined`` loop: it gathers the A tile (``block_M`` x ``block_K``) and
loads the B tile (``block_N`` x ``block_K`` of the weight, K-major) into shared memory and calls
``T.gemm(A, B, acc, transpose_B=True)`` (wgmma on sm_90; fp32 inputs run as TF32, within the f32
tolerance, which allows TF32 as cuDNN's default does) into an fp32 fragment. Where ``Cg`` is a
multiple of ``block_K`` (the "aligned" form) a K tile lies in one tap: the tap and the first
channel are per-tile scalars and the tile's channels are contiguous, so its loads are whole rows
with one bounds predicate each; otherwise (the "flat" form: Cg = 1, 3, 80...) each element decodes
its own ``(tap, c)``. The epilogue scales (fp8), adds the bias, applies ReLU, casts to the output
dtype in a shared tile and writes the rows and columns inside the output: along the channels, or,
channels first, along the rows (consecutive positions of a channel, consecutive addresses), the
tile's rows padded so that those reads down its columns do not conflict in the banks.

Padding skipped (a large dilation on a small map: ASPP): where whole row tiles read only padding
at some taps (:func:`live_tap_share` of the tiles' (tile, tap) pairs at most
:data:`LIVE_TAPS_AT_MOST`; aligned K tiles), each tile walks only the K tiles of its live taps: per
spatial dim, the taps some position between its first and last row reads input at (the whole dim
where those rows differ in a dim before it), their counts known at run time, the pipeline's trip
count with them. A tile over rows of several images takes every tap.

Split-K (deep K, few output tiles, e.g. C_in = 2048 with 3x3: K = 18432, M = 1024): the grid's
third dim is ``groups * splits``; split ``s`` runs K tiles ``[s*T, (s+1)*T)`` and writes its fp32
partial tile to a workspace ``[splits, M, C_out]`` (an output of the kernel the op does not
return). A second kernel in the same prim_func (launched after the first, on the same stream) sums
the ``splits`` partials of each output in index order 0..splits-1, then applies the epilogue: the
result does not depend on which block finishes first, and no atomics are used. The workspace is
channels last in either output layout; a channels-first output is written as the GEMM's is.

Direct kernel (memory bound: depthwise, ``groups == C_in``; and grouped convs with fewer than 16
output channels per group, where a GEMM tile would be mostly padding): a block of ``block_M``
positions x ``block_N`` output channels, an fp32 fragment accumulator, serial loops over the taps
and the group's input channels, each step one masked load per output (consecutive output channels
read consecutive input channels in the depthwise case: coalesced) and a multiply-add.

Window kernel (ungrouped convolutions whose K fits a thread's registers, :func:`window_fits`): a
block of ``block_M`` positions, a thread each, x ``block_N`` output channels. The block's weights
are staged in shared memory; each thread loads its position's whole window (K inputs, the
padding zero) into registers, then forms its ``block_N`` outputs from them, every thread of a
warp reading the same weight at once (a broadcast). Where a GEMM tile of a stem is one K tile,
its work is a gather of 2-byte elements behind the index arithmetic, one MMA and a store, on
``M / block_M`` blocks (a 112 x 112 stem at stride 2: 49 of 132 SMs).

Halo kernel (a launch variant, :func:`halo_launches`, of ungrouped convolutions of several taps
whose channels are one K slice of 32 to 128 bytes): a block's ``block_M`` outputs are a box of
output positions (d x h x w: ``block_M / (box_h * box_w)`` x ``box_h`` x ``box_w``), not a run of
GEMM rows. It loads the box's input, its halo (every position the box's windows read, the padding
zero), into shared memory once; each K step (``block_K``: one tap or a row of kW taps, all the
channels) then fills its A tile from the halo and multiplies it with the weight tile. The GEMM
gathers each input element from L2 once per tap (27 times in a 3x3x3 convolution: the 3-d U-Net's
32 -> 64 layer is bound by those reads); the halo kernel about halo / box times (3.4 for 2 x 4 x
16 boxes of a 3x3x3).

fp8 (Conv2dFp8Fwd): e4m3 input and weight, fp32 accumulation, the per-tensor scales ``x_scale`` and
``w_scale`` (0-dim fp32 tensors, viewed as ``[1]``) multiplied in the epilogue, bf16 output.

TileLang is imported when a kernel is built.
"""


import dataclasses
import math
import operator
from dataclasses import dataclass

import torch
from npuops import VECTOR_BYTES, KernelKey, KernelSpec, in_order, multiprocessors, thread_owned, tilelang_dtype

from .layouts import CHANNELS_LAST
from .ops._geometry import ConvGeometry

F32 = "float32"
MIN_GEMM_COLUMNS = 16  # output channels per group below which the direct kernel is the default
DIRECT_OUTPUTS = 1024  # outputs a direct-kernel block computes
DIRECT_THREADS = 256
REDUCE_ELEMENTS = 2048  # outputs a split-K reduction block sums
SPLIT_K_MIN_TILES = 32  # K tiles a GEMM needs before the default splits K (K >= 2048 at 64-wide tiles)
SPLIT_K_VARIANT_MIN_TILES = 16  # ... before the launch variants offer split-K
SPLIT_K_TILES_PER_SPLIT = 8  # ... and at least this many K tiles each split keeps
MAX_SPLITS = 16
WALKED_TILES = 2  # row tiles a GEMM block walks in the launch variants that walk them (K one tile)
WINDOW_BYTES = 256  # a window kernel thread's inputs (K elements) at most: 64 registers
WINDOW_THREADS = 128  # positions a window-kernel block computes, a thread each
LIVE_TAPS_AT_MOST = 0.9  # share of (row tile, tap) pairs reading any input below which a GEMM skips the rest
HALO_BYTES = 64 * 1024  # a halo kernel block's input box in shared memory at most


@dataclass(frozen=True)
class ConvLaunch:
    """One launch configuration. ``kernel``: "gemm", "split_k", "direct", "window" or "halo". The GEMM kernels use
    ``block_M`` x ``block_N`` output tiles, ``block_K`` deep K tiles, ``num_stages`` pipeline
    stages and ``threads`` per block (the consumer threads: on sm_90 TileLang warp-specializes the
    pipelined loop and adds a producer warpgroup of 128 threads, which issues the input gather as
    predicated cp.async and the weight tile as a TMA load); ``splits`` K ranges for "split_k";
    ``tiles``, for a "gemm" whose K is one tile, the output row tiles a block walks, pipelined (a
    tile's input load runs while the tile before it is multiplied and stored; the weight tile is
    loaded once). The direct kernel uses ``block_M`` positions x ``block_N`` channels and ``threads``.
    The halo kernel's ``block_M`` positions are a box of ``block_M / (box_h * box_w)`` x ``box_h``
    x ``box_w`` output positions (d, h, w), its ``block_K`` a K step of whole taps;
    ``warp_specialized`` False builds it without TileLang's producer warpgroup (which takes the
    registers of a whole SM for one block): several blocks an SM then hide each other's waits."""

    kernel: str = "gemm"
    block_M: int = 128
    block_N: int = 128
    block_K: int = 64
    num_stages: int = 3
    threads: int = 256
    splits: int = 1
    tiles: int = 1
    box_h: int = 0
    box_w: int = 0
    warp_specialized: bool = True

    def as_dict(self) -> dict:
        """The fields, ``tiles`` only where a block walks several, the box only for the halo kernel
        and ``warp_specialized`` only where False (launches recorded and tuned before they existed
        read the same)."""
        fields = dataclasses.asdict(self)
        if self.tiles == 1:
            del fields["tiles"]
        if not self.box_w:
            del fields["box_h"], fields["box_w"]
        if self.warp_specialized:
            del fields["warp_specialized"]
        return fields

    @property
    def box(self) -> tuple[int, int, int]:
        """The halo kernel's box of output positions (d, h, w)."""
        return self.block_M // (self.box_h * self.box_w), self.box_h, self.box_w


@dataclass(frozen=True)
class ChannelsFirst:
    """A channels-first output ``Y [N, C_out, positions]`` (NC[D]HW-contiguous) of GEMM rows
    ``m = n * positions + position``: output (m, c) at ``Y[m // positions, c, m % positions]``. A
    block stages its outputs (rows x channels, as it computed them) in shared memory, then stores
    them with consecutive threads on consecutive rows: consecutive addresses of one channel."""

    positions: int
    dtype: torch.dtype

    def columns(self, channels: int) -> int:
        """Columns of the staging tile of ``channels`` outputs a row: a 4-byte word more, so that
        the store's reads down a column (a row a thread) fall in distinct banks, not all in one."""
        return channels + 4 // self.dtype.itemsize

    def store(self, rows: int, channels: int, output_row=None):
        """A macro ``store(tile, Y, row0, col0, row_count, col_count, first_col)``: the ``rows`` x
        ``channels`` outputs staged in ``tile``, (i, j) being row ``row0 + i`` and channel
        ``first_col + col0 + j``, into ``Y``; rows from ``row_count`` on and ``col0 + j`` from
        ``col_count`` on left out. ``output_row(row, row_count)``: (whether it is written, its row
        m of ``Y``) of the tile's row ``row0 + i``, given the macro's ``row_count`` argument, for
        a kernel whose rows are not ``Y``'s (the data gradient's stride phases: ``row_count`` is
        then its phase); by default ``(row < row_count, row)``."""
        import tilelang.language as T

        positions = self.positions
        if output_row is None:
            def output_row(row, row_count):
                return row < row_count, row

        @T.macro
        def store(tile, Y, row0, col0, row_count, col_count, first_col):
            for j, i in T.Parallel(channels, rows):
                # The pair under one name: unpacked (`written, row = ...`), each would be let-bound.
                target = output_row(row0 + i, row_count)
                if target[0] and col0 + j < col_count:
                    Y[target[1] // positions, first_col + col0 + j, target[1] % positions] = tile[i, j]

        return store

    def write(self, rows: int, channels: int, output_row=None):
        """``write(value, Y, row0, col0, row_count, col_count, first_col)``: the outputs
        ``value(i, j)`` (a callable of the tile's row and column) staged in a padded shared tile
        (:meth:`columns`), then stored as :meth:`store` does, which the arguments are passed to."""
        import tilelang.language as T

        store = self.store(rows, channels, output_row)

        @T.macro
        def stage(value):
            staged = T.alloc_shared((rows, self.columns(channels)), tilelang_dtype(self.dtype))
            for i, j in T.Parallel(rows, channels):
                staged[i, j] = value(i, j)
            return staged

        # Not a macro: a macro's arguments are let-bound on entry, which would put the store's
        # bindings ahead of the staging loop instead of after it.
        def write(value, Y, row0, col0, row_count, col_count, first_col):
            store(stage(value), Y, row0, col0, row_count, col_count, first_col)

        return write


@dataclass(frozen=True)
class Problem:
    """A forward convolution in the kernels' terms: every size 3-d (leading 1s / 0s for lower
    ranks), the GEMM view's sizes, the dtypes, the epilogue and the output's layout (``CHANNELS_LAST``
    or ``CHANNELS_FIRST``, see :func:`conv_kernel`)."""

    geometry: ConvGeometry
    dtype: torch.dtype
    relu: bool = False
    output_layout: str = CHANNELS_LAST

    @property
    def rank(self) -> int:
        return len(self.geometry.in_size)

    def _3d(self, values, fill):
        return (fill,) * (3 - len(values)) + tuple(values)

    @property
    def in3(self):
        return self._3d(self.geometry.in_size, 1)

    @property
    def out3(self):
        return self._3d(self.geometry.out_size, 1)

    @property
    def kernel3(self):
        return self._3d(self.geometry.kernel, 1)

    @property
    def stride3(self):
        return self._3d(self.geometry.stride, 1)

    @property
    def pad3(self):
        return self._3d(self.geometry.pad_before, 0)

    @property
    def dilation3(self):
        return self._3d(self.geometry.dilation, 1)

    @property
    def taps(self) -> int:
        return math.prod(self.geometry.kernel)

    @property
    def cg(self) -> int:
        """Input channels per group."""
        return self.geometry.in_channels // self.geometry.groups

    @property
    def og(self) -> int:
        """Output channels per group (the GEMM's N)."""
        return self.geometry.out_channels // self.geometry.groups

    @property
    def k(self) -> int:
        return self.taps * self.cg

    @property
    def m(self) -> int:
        return self.geometry.batch * math.prod(self.geometry.out_size)

    @property
    def input_is_a(self) -> bool:
        """Whether the GEMM's A is the input itself ([rows, C_in]): a pointwise, stride-1, unpadded,
        ungrouped convolution whose rows are whole 16-byte units, whose A tiles the kernel copies
        whole (the bulk copy engine) instead of gathering them element by element."""
        g = self.geometry
        return (self.taps == 1 and g.groups == 1 and set(self.stride3) == {1} and set(self.pad3) == {0}
                and self.out3 == self.in3 and g.in_channels * self.dtype.itemsize % VECTOR_BYTES == 0)

    @property
    def rows_in(self) -> int:
        return self.geometry.batch * math.prod(self.geometry.in_size)

    @property
    def fp8(self) -> bool:
        return self.dtype == torch.float8_e4m3fn

    @property
    def out_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.fp8 else self.dtype

    @property
    def bias(self) -> bool:
        return self.geometry.bias and not self.fp8

    @property
    def channels_first(self) -> ChannelsFirst | None:
        """How the kernels write a channels-first output; None for a channels-last one."""
        if self.output_layout == CHANNELS_LAST:
            return None
        return ChannelsFirst(math.prod(self.geometry.out_size), self.out_dtype)


def unsupported(geometry: ConvGeometry, dtype: torch.dtype) -> str | None:
    """Why no kernel here takes this convolution (None: one does)."""
    if dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn):
        return f"the TileLang conv kernels take fp16, bf16, fp32 and fp8 e4m3 inputs, not {dtype}"
    return too_large(geometry)


def too_large(geometry: ConvGeometry) -> str | None:
    """Why the convolution's tensors are too large for the kernels' int32 indices (None: they fit)."""
    g = geometry
    sizes = (g.batch * math.prod(g.in_size) * g.in_channels, g.batch * math.prod(g.out_size) * g.out_channels,
             g.out_channels * g.in_channels // g.groups * math.prod(g.kernel))
    if max(sizes) >= 2**31:
        return "a tensor of 2^31 or more elements (the kernels index with int32)"
    return None


# -- launch rules ----------------------------------------------------------------------------------

def _tiles(p: Problem, block_M: int, block_N: int) -> int:
    return -(-p.m // block_M) * -(-p.og // block_N) * p.geometry.groups


def swizzle_row(p: Problem) -> int:
    """Elements of one 128-byte swizzle span: 64 for 16-bit types, 128 for fp8, 32 for fp32."""
    return 128 // p.dtype.itemsize


def gemm_block_K(p: Problem) -> int:
    """K tile: 128 bytes of a row (one 128-byte swizzle span) where K allows; the widest tile of at
    least 32 bytes inside one tap (the aligned form: whole-vector predicated cp.async loads) where
    the group's channels allow (whisper's C_in = 80 takes 16-element tiles)."""
    row = swizzle_row(p)
    smallest = max(32 // p.dtype.itemsize, 32 if p.fp8 else 8)
    for block_K in (row, row // 2, row // 4):
        if block_K >= smallest and p.cg % block_K == 0:
            return block_K
    return row if p.k >= row else max(smallest, row // 2)


def default_launch(p: Problem) -> ConvLaunch:
    """The rule-based default for any shape: the direct kernel for depthwise / thin groups, else a
    GEMM whose tiles fill the GPU ((64, 128, 64), 4 stages, 256 threads for small maps; 128-row
    tiles, 3 stages where those still fill the GPU: not 128 x 256, whose warp-specialized build
    caps its consumers at 128 registers a thread, all of them taken by the accumulator, so it spills
    and ran 6x behind cuDNN on the H100), split-K where few output tiles face a deep K."""
    g = p.geometry
    if not p.fp8 and (p.cg == 1 or p.og < MIN_GEMM_COLUMNS):
        return direct_launch(p)
    block_K = gemm_block_K(p)
    block_N = 32 if p.og <= 32 else 64 if p.og <= 64 else 128
    sms = multiprocessors()
    if _tiles(p, 128, block_N) >= sms:
        block_M, stages = 128, 3
    else:
        block_M, stages = 64, 4
    threads = 256 if block_M * block_N >= 64 * 128 else 128
    k_tiles = -(-p.k // block_K)
    tiles = _tiles(p, block_M, block_N)
    splits = 1
    if k_tiles >= SPLIT_K_MIN_TILES and tiles < sms // 2 and g.groups == 1:
        splits = min(k_tiles // SPLIT_K_TILES_PER_SPLIT, -(-sms // tiles), MAX_SPLITS)
        splits = no_empty_split(k_tiles, splits)
    per_split = -(-k_tiles // splits)
    return ConvLaunch("split_k" if splits > 1 else "gemm", block_M, block_N, block_K,
                      max(1, min(stages, per_split)), threads, splits)


def channel_block(channels: int, most: int) -> int:
    """Output channels a CUDA-core kernel's block takes: ``channels`` rounded up to a power of two,
    at most ``most``."""
    return min(most, 1 << max(0, (channels - 1).bit_length()))


def direct_launch(p: Problem, threads: int = DIRECT_THREADS, outputs: int = DIRECT_OUTPUTS) -> ConvLaunch:
    """Channels per block: the output's channels up to 64 (a power of two), positions the rest of
    ``outputs``."""
    block_N = channel_block(p.geometry.out_channels, 64)
    block_M = max(1, outputs // block_N)
    return ConvLaunch("direct", block_M, block_N, 0, 0, threads, 1)


def window_fits(p: Problem) -> bool:
    """Whether the window kernel takes ``p``: one group, no fp8, and a window (K elements) a
    thread holds in registers (:data:`WINDOW_BYTES`)."""
    return p.geometry.groups == 1 and not p.fp8 and p.k * p.dtype.itemsize <= WINDOW_BYTES


def window_launch(p: Problem, channels: int) -> ConvLaunch:
    """The window kernel's launch: :data:`WINDOW_THREADS` positions a block, ``channels`` output
    channels (fewer where the convolution has fewer, a power of two)."""
    block_N = channel_block(p.geometry.out_channels, channels)
    return ConvLaunch("window", WINDOW_THREADS, block_N, 0, 0, WINDOW_THREADS, 1)


def halo_extent(p: Problem, box) -> tuple[int, int, int]:
    """(d, h, w) input positions the windows of a ``box`` of output positions read."""
    return tuple((b - 1) * s + (k - 1) * d + 1
                 for b, s, k, d in zip(box, p.stride3, p.kernel3, p.dilation3, strict=True))


def halo_fits(p: Problem, box) -> bool:
    """Whether the halo kernel takes ``p`` with a ``box`` of output positions: one group, no fp8,
    several taps, the channels one K slice of whole 32-byte MMA steps (16 16-bit elements, 8 fp32)
    of at most a 128-byte row, the box's input in :data:`HALO_BYTES`."""
    row = p.cg * p.dtype.itemsize
    return (p.geometry.groups == 1 and not p.fp8 and p.taps > 1 and row % 32 == 0 and row <= 128
            and math.prod(halo_extent(p, box)) * row <= HALO_BYTES)


def halo_launches(p: Problem) -> list[ConvLaunch]:
    """The halo kernel's launch variants: boxes of 128 output positions shaped to the output's
    rank (a 3-d one deep, a 2-d one wide, a 1-d one a run), of 64 where none of those fits (strided
    windows spread far), K steps of one tap and of a row of taps (kW of them), the output channels
    in one or two column tiles, and all of them in one column tile without warp specialization."""
    OD, OH, _ = p.out3
    boxes = ([(2, 4, 16), (1, 8, 16)] if OD > 1 else [(1, 8, 16), (1, 4, 32)] if OH > 1 else [(1, 1, 128)])
    boxes = [box for box in boxes if halo_fits(p, box)] or [box for box in [(1, 4, 16) if OH > 1 else (1, 1, 64)]
                                                            if halo_fits(p, box)]
    steps = dict.fromkeys((1, p.kernel3[2]))
    block_N = channel_block(p.og, 128)
    launches = []
    for box in boxes:
        block_M = math.prod(box)
        for taps in steps:
            for columns in dict.fromkeys((block_N, min(block_N, 64))):
                threads = 256 if block_M * columns >= 64 * 128 else 128
                launches.append(ConvLaunch("halo", block_M, columns, taps * p.cg, 2, threads, 1,
                                           box_h=box[1], box_w=box[2]))
    return launches + [dataclasses.replace(launch, warp_specialized=False) for launch in launches
                       if launch.block_N == block_N]


def chosen_launch(p: Problem) -> ConvLaunch:
    """The launch a plain run takes: the one tuning chose for this problem (``tuned_launches.json``,
    see :mod:`npuops_conv.tuned`), else the rule's."""
    from .tuned import tuned_launch

    return tuned_launch(p.geometry, p.dtype, p.relu) or default_launch(p)


def no_empty_split(k_tiles: int, splits: int) -> int:
    """``splits`` or fewer, so that none of ceil(k_tiles / splits)-tile ranges is empty."""
    return -(-k_tiles // -(-k_tiles // splits)) if splits > 1 else 1


def gemm_variants(block_K: int, k_tiles: int, wide: bool, splittable: bool, copied_a: bool = False) -> list[ConvLaunch]:
    """The GEMM launches tuning tries beside a rule's for ``k_tiles`` K tiles of ``block_K``: three
    tile shapes, 64 x 256 where the GEMM is ``wide`` (256+ columns), split-K into 2, 4 and 8 where
    K is deep and the GEMM ``splittable`` (one group), of 64 x 128 tiles and, ``wide``, 128 x 128.
    128 x 256 only where A is ``copied_a``: a gathered A takes as many producer threads as
    consumers, which caps a thread at 128 registers, all of them the 128 x 256 accumulator's
    (ptxas: spills, wgmma serialized); the copied form's one producer warp leaves its consumers 240."""
    stages, deep = max(1, min(3, k_tiles)), max(1, min(4, k_tiles))
    variants = [ConvLaunch("gemm", 64, 128, block_K, deep, 256, 1), ConvLaunch("gemm", 128, 128, block_K, stages, 256, 1),
                ConvLaunch("gemm", 64, 64, block_K, deep, 128, 1)]
    if wide:
        variants.append(ConvLaunch("gemm", 64, 256, block_K, stages, 256, 1))
        if copied_a:
            variants.append(ConvLaunch("gemm", 128, 256, block_K, stages, 256, 1))
    if splittable and k_tiles >= SPLIT_K_VARIANT_MIN_TILES:
        for splits in dict.fromkeys(no_empty_split(k_tiles, s) for s in (2, 4, 8)):
            per_split = -(-k_tiles // splits)
            variants.append(ConvLaunch("split_k", 64, 128, block_K, max(1, min(4, per_split)), 256, splits))
            if wide:  # 128-row tiles: half the weight tiles' loads from L2 of 64-row ones (ASPP's 2048 x 9 deep K)
                variants.append(ConvLaunch("split_k", 128, 128, block_K, max(1, min(3, per_split)), 256, splits))
    return variants


def launch_variants(p: Problem) -> list[dict]:
    """Launch configs to tune among, the chosen one first, the rule's among them."""
    first = default_launch(p)
    variants = [chosen_launch(p), first]
    if first.kernel == "direct":
        variants += [direct_launch(p, outputs=DIRECT_OUTPUTS // 2), direct_launch(p, threads=128)]
        if not p.fp8 and p.og >= 8:  # a GEMM still takes it (N tile of 16+)
            variants.append(ConvLaunch("gemm", 64, 32, gemm_block_K(p), 2, 128, 1))
    else:
        block_K, k_tiles = first.block_K, -(-p.k // first.block_K)
        variants += gemm_variants(block_K, k_tiles, wide=p.og >= 256, splittable=p.geometry.groups == 1,
                                   copied_a=p.input_is_a)
        if _tiles(p, 64, 64) < multiprocessors():  # few output rows: narrower column tiles, more blocks
            variants.append(ConvLaunch("gemm", 64, 32, block_K, max(1, min(4, k_tiles)), 128, 1))
        if p.cg % 32 == 0 and block_K != 32 and p.dtype.itemsize == 2:  # the aligned form, narrower tiles
            variants.append(ConvLaunch("gemm", 64, 128, 32, max(1, min(4, -(-p.k // 32))), 256, 1))
        if p.k <= block_K and not p.fp8:  # one K tile (a stem's 3 channels x 9 taps): CUDA cores may do
            variants.append(direct_launch(p))
        if k_tiles == 1:  # a block walks row tiles, each tile's load under the last one's product and store
            variants += [ConvLaunch("gemm", 64, block_N, block_K, 2, threads, 1, tiles=WALKED_TILES)
                         for block_N, threads in ((128, 256), (64, 128))
                         if _tiles(p, 64, block_N) >= WALKED_TILES * multiprocessors()]
        row = swizzle_row(p)
        if block_K < row and p.cg % (VECTOR_BYTES // p.dtype.itemsize) == 0 and p.k > row:
            # A full-row K tile over several taps (the element-wise form, still whole 16-byte
            # vectors a tap): half the pipeline steps of 32-channel groups' one-tap tiles.
            variants.append(ConvLaunch("gemm", first.block_M, first.block_N, row,
                                       max(1, min(3, -(-p.k // row))), first.threads, 1))
    if window_fits(p):  # a small K on CUDA cores, a thread a position (stems, thin 1-d convs)
        variants += [window_launch(p, 16), window_launch(p, 8)]
    variants += halo_launches(p)
    unique = list(dict.fromkeys(variants))
    return [v.as_dict() for v in unique]


# -- the builder -----------------------------------------------------------------------------------

def conv_kernel(geometry: ConvGeometry, dtype: torch.dtype, relu: bool = False, kernel: str | None = None,
                portable: bool = False, output_layout: str = CHANNELS_LAST, **launch) -> KernelSpec:
    """The kernel for a forward convolution of ``geometry`` on ``dtype`` inputs (``relu``: fuse a
    ReLU after the bias): the chosen launch's (:func:`chosen_launch`), or the one the launch config
    (a dict of :class:`ConvLaunch` fields, as :func:`launch_variants` gives) names. ``portable``:
    see :func:`gemm_kernel`.

    Parameters, in order (see :func:`_params`): ``input`` [rows_in, C_in] (N x the input's
    positions), ``weight`` [C_out, K], then ``bias`` [C_out] (when the geometry has one),
    ``x_scale`` and ``w_scale`` [1] (fp8), ``output`` and, for split-K, ``workspace`` [splits,
    rows, C_out] fp32 (allocated per call, not returned). Channels-last tensors of the natural
    shapes fit as they are. ``output_layout``: ``CHANNELS_LAST``, the output [rows, C_out]
    returned as [N, *out_size, C_out]; or ``CHANNELS_FIRST``, [N, C_out, prod(out_size)] returned as
    [N, C_out, *out_size] (NC[D]HW-contiguous, written so by the epilogue: no transposing pass)."""
    problem = unsupported(geometry, dtype)
    if problem:
        raise ValueError(problem)
    config = chosen_launch(Problem(geometry, dtype, relu)) if kernel is None else ConvLaunch(kernel, **launch)
    # The batch comes at launch: the kernel is built from the geometry without it, so that one
    # build serves every batch size (of its launch config: see kernel_key).
    p = Problem(unbatched(geometry), dtype, relu, output_layout)
    if config.kernel == "direct":
        if p.fp8:
            raise ValueError("the direct kernel does not take fp8 inputs")
        return direct_kernel(p, config)
    if config.kernel == "window":
        if not window_fits(p):
            raise ValueError(f"the window kernel takes ungrouped, non-fp8 convolutions whose K ({p.k}) fits "
                             f"{WINDOW_BYTES} bytes a thread")
        return window_kernel(p, config)
    if config.kernel == "halo":
        if not config.box_w or not halo_fits(p, config.box):
            raise ValueError(f"the halo kernel takes ungrouped, non-fp8 convolutions of several taps whose channels "
                             f"({p.cg}) are 32, 64, 96 or 128 bytes, and whose box's input fits {HALO_BYTES} bytes")
        return halo_kernel(p, config, portable)
    if config.kernel in ("gemm", "split_k"):
        return gemm_kernel(p, config, portable)
    raise ValueError(f"unknown conv kernel {config.kernel!r}")


def unbatched(geometry: ConvGeometry) -> ConvGeometry:
    """``geometry`` without its batch size, which the kernels take at launch."""
    return dataclasses.replace(geometry, batch=0)


def kernel_key(geometry: ConvGeometry, dtype: torch.dtype, relu: bool = False, output_layout: str = CHANNELS_LAST,
               **launch) -> KernelKey:
    """What one build of :func:`conv_kernel` serves: every batch size of the geometry, in one output
    layout. Its launch (the chosen one, which depends on the batch's output tiles) is the key's
    launch class: any of them computes any batch size, so one stands in while another builds."""
    config = chosen_launch(Problem(geometry, dtype, relu)) if not launch else ConvLaunch(**launch)
    return KernelKey((unbatched(geometry), dtype, relu, output_layout), tuple(sorted(config.as_dict().items())))


def _params(p: Problem, config: ConvLaunch) -> tuple:
    """The kernel's parameters: flat channels-last views whose row counts, "rows_in" (N x the
    input's positions) and "rows" (N x the output's: the GEMM's M), are sizes given at launch."""
    g = p.geometry
    params = [("input", ("rows_in", g.in_channels)), ("weight", (g.out_channels, p.k))]
    if p.bias:
        params.append(("bias", (g.out_channels,)))
    if p.fp8:
        params += [("x_scale", (1,)), ("w_scale", (1,))]
    params.append(("output", ("batch", g.out_channels, math.prod(g.out_size)) if p.channels_first
                   else ("rows", g.out_channels)))
    outputs = {"output": p.out_dtype}
    if config.kernel == "split_k":
        params.append(("workspace", (config.splits, "rows", g.out_channels)))
        outputs["workspace"] = torch.float32
    return tuple(params), outputs


def _spec(p: Problem, config: ConvLaunch, prim_func, extra: dict) -> KernelSpec:
    params, outputs = _params(p, config)
    g = p.geometry
    positions_in, positions_out = math.prod(g.in_size), math.prod(g.out_size)

    def batch_sizes(sizes):
        batch = sizes["rows_in"] // positions_in
        return {"batch": batch, "rows": batch * positions_out}

    returned = ("batch", g.out_channels, *g.out_size) if p.channels_first else ("batch", *g.out_size, g.out_channels)
    return KernelSpec(prim_func, params, outputs, (("output", returned),),
                      {**config.as_dict(), "output_layout": p.output_layout, **extra},
                      pass_configs={} if config.warp_specialized else {"tl.disable_warp_specialized": True},
                      derived=batch_sizes)


def _position(p: Problem, m):
    """(n, od, oh, ow) of GEMM row ``m``."""
    OD, OH, OW = p.out3
    return m // (OD * OH * OW), m // (OH * OW) % OD, m // OW % OH, m % OW


def _tap(p: Problem, tap):
    """(kd, kh, kw) of tap index ``tap``."""
    _, kH, kW = p.kernel3
    return tap // (kH * kW), tap // kW % kH, tap % kW


def _div(a, b):
    """``a // b`` for ``a >= 0`` (folded where ``b`` is 1; C division where ``b`` is known only at run
    time, which TVM's floor division would wrap in sign tests)."""
    from tvm import tirx

    if isinstance(b, int):
        return a if b == 1 else a // b
    return tirx.truncdiv(a, b)


def _mod(a, b):
    from tvm import tirx

    if isinstance(b, int):
        return 0 if b == 1 else a % b
    return tirx.truncmod(a, b)


def _div_at_most(a, b, most: int):
    """``a // b`` for ``a >= 0`` and a run-time ``b`` of 1 to ``most``: a choice among divisions by
    constants (multiplies and shifts), not a division by a run-time value (tens of instructions,
    and index arithmetic TVM can no longer bound in int32)."""
    import tilelang.language as T
    from tvm import tirx

    quotient = a // most
    for divisor in range(most - 1, 0, -1):
        quotient = T.if_then_else(tirx.EQ(b, divisor), a // divisor if divisor > 1 else a, quotient)
    return quotient


def is_one(count) -> bool:
    """Whether ``count`` (an int, or a TIR expression known only at run time) is 1 at build time."""
    return isinstance(count, int) and count == 1


def box_position(t, counts, most=(None, None, None)):
    """(u_d, u_h, u_w) of the flat index ``t`` (w fastest) in a box of ``counts`` (d, h, w); a
    count known at run time is divided as :func:`_div` does, or where ``most`` bounds it, as
    :func:`_div_at_most`."""
    def div(a, count, bound):
        return _div(a, count) if bound is None or isinstance(count, int) else _div_at_most(a, count, bound)

    def mod(a, count, bound):
        return _mod(a, count) if bound is None or isinstance(count, int) else a - div(a, count, bound) * count

    (c_d, c_h, c_w), (_, most_h, most_w) = counts, most
    rest = div(t, c_w, most_w)  # below c_h where c_d is 1
    return ((0 if is_one(c_d) else div(rest, c_h, most_h)), (rest if is_one(c_d) else mod(rest, c_h, most_h)),
            (t if is_one(c_d) and is_one(c_h) else mod(t, c_w, most_w)))


def _edges_crossed(p: Problem):
    """Per dim (d, h, w): (low, high), whether some window reads before the input's first element
    (the padding) and whether some reads past its last (the padding, or a last window crossing it):
    the bounds a tap's input coordinate must be checked against (decided at build time)."""
    return tuple((pad > 0, (out - 1) * s - pad + (taps - 1) * d > size - 1)
                 for size, out, taps, s, pad, d in zip(p.in3, p.out3, p.kernel3, p.stride3, p.pad3, p.dilation3,
                                                       strict=True))


def _reaches_padding(p: Problem):
    """Per dim (d, h, w): whether some window of several taps crosses an edge of the input, so that
    some of its taps may read nothing for a run of output positions."""
    return tuple(taps > 1 and (low or high) for taps, (low, high) in zip(p.kernel3, _edges_crossed(p), strict=True))


# The operations _dim_live_taps takes, on Python ints (maximum, minimum, select, equal, both).
_INT_OPS = (max, min, lambda same, a, b: a if same else b, operator.eq, operator.and_)


def _live_range(lo, hi, taps: int, s: int, pad: int, d: int, size: int, maximum, minimum):
    """(first, count) of one dim's taps that read inside the input for some output position in
    ``[lo, hi]`` (ints, or TIR expressions with ``maximum`` / ``minimum`` TIR's): tap k reads
    ``o*s - pad + k*d``, inside for some o where ``hi*s - pad + k*d >= 0`` and ``lo*s - pad + k*d <=
    size - 1``. Every numerator is kept non-negative."""
    first = (maximum(pad - hi * s, 0) + d - 1) // d
    end = minimum(taps, maximum(size - 1 + pad - lo * s + d, 0) // d)
    return first, maximum(end - first, 0)


def live_tap_share(p: Problem, block_M: int) -> float:
    """The share of (row tile, tap) pairs of the batch-1 GEMM in which some row of the tile reads
    inside the input at the tap (each tile's rows taken as the hull of their positions, as the
    kernel takes them): the K tiles a GEMM that skips the others would walk. 1 where no window
    reaches the padding."""
    reaches = _reaches_padding(p)
    if not any(reaches):
        return 1.0
    positions = math.prod(p.out3)
    live = 0
    for first_row in range(0, positions, block_M):
        ends = (_position(p, first_row)[1:], _position(p, min(first_row + block_M, positions) - 1)[1:])
        live += math.prod(_dim_live_taps(p, reaches, ends, True, *_INT_OPS)[1])
    return live / (-(-positions // block_M) * p.taps)


def _dim_live_taps(p: Problem, reaches, ends, same, maximum, minimum, select, equal, both):
    """((first, ...), (count, ...)) per dim (d, h, w) of the taps live for the rows between the
    positions ``ends`` ((od, oh, ow) of a tile's first and last row; ``same``: whether they are of
    one image): a dim's range of positions is the two ends' where the dims before it agree, else the
    whole dim. Ints, or TIR expressions with the TIR forms of the operations passed."""
    firsts, counts = [], []
    for dim, (o0, o1) in enumerate(zip(*ends, strict=True)):
        size, out, taps = p.in3[dim], p.out3[dim], p.kernel3[dim]
        if reaches[dim]:
            lo, hi = select(same, o0, 0), select(same, o1, out - 1)
            first, count = _live_range(lo, hi, taps, p.stride3[dim], p.pad3[dim], p.dilation3[dim], size,
                                       maximum, minimum)
        else:
            first, count = 0, taps
        firsts.append(first)
        counts.append(count)
        same = both(same, equal(o0, o1))
    return tuple(firsts), tuple(counts)


def _tile_live_taps(p: Problem, first_row, block_M: int):
    """The TIR form of :func:`_dim_live_taps` for the ``block_M`` GEMM rows from ``first_row``. A
    dim whose positions of one index of the dims before it are fewer than a tile's rows (a row of
    32 outputs, tiles of 64) is whole in every tile: its live taps are constants."""
    import tilelang.language as T
    from tvm import tirx

    def select(same, a, b):
        return a if same is True else T.if_then_else(same, a, b)

    OD, OH, OW = p.out3
    narrow = (block_M <= OD * OH * OW, block_M <= OH * OW, block_M <= OW)
    n0, *ends0 = _position(p, first_row)
    n1, *ends1 = _position(p, first_row + block_M - 1)
    runtime = _dim_live_taps(p, [r and n for r, n in zip(_reaches_padding(p), narrow, strict=True)],
                             (ends0, ends1), tirx.EQ(n0, n1), T.max, T.min, select, tirx.EQ, tirx.And)
    whole = _dim_live_taps(p, _reaches_padding(p), ((0, 0, 0), tuple(o - 1 for o in p.out3)), False, *_INT_OPS)
    return tuple(tuple(r if n else w for r, w, n in zip(values, whole_values, narrow, strict=True))
                 for values, whole_values in zip(runtime, whole, strict=True))


def _all(conditions):
    """The conjunction of ``conditions`` (Python bools fold away)."""
    from tvm import tirx

    result = True
    for condition in conditions:
        if condition is True:
            continue
        result = condition if result is True else tirx.And(result, condition)
    return result


def _source(p: Problem, m, tap, rows=None):
    """(inside, input row) of GEMM row ``m`` at ``tap`` (an index, or its (kd, kh, kw)): whether the
    tap reads inside the input (not the padding) and ``m`` is a row of the GEMM, and the flat input
    row it reads. A bound is checked only where the padding or the last window can cross it
    (decided at build time)."""
    D, H, W = p.in3
    n, od, oh, ow = _position(p, m)
    conditions = [m < rows] if rows is not None else []
    coordinates = []
    taps = tap if isinstance(tap, tuple) else _tap(p, tap)
    for o, k, size, s, pad, d, (low, high) in zip((od, oh, ow), taps, p.in3, p.stride3, p.pad3, p.dilation3,
                                                  _edges_crossed(p), strict=True):
        coordinate = o * s - pad + k * d
        coordinates.append(coordinate)
        if low:
            conditions.append(coordinate >= 0)
        if high:
            conditions.append(coordinate < size)
    i_d, i_h, i_w = coordinates
    return _all(conditions), ((n * D + i_d) * H + i_h) * W + i_w


def _a_element(p: Problem, X, m, rows, kt, kk, group_or_split, block_K: int, tail: bool, at=None):
    """A[m, kt*block_K + kk] of the implicit GEMM (the input gathered through the window): zero in
    the padding and past K. ``group_or_split``: the grid's third index (the group; split-K
    convolutions have one group). Aligned (Cg a multiple of block_K): the tile lies in one tap, the
    tap and first channel are per-tile (``at``: given as (tap, first channel) in place of ``kt``);
    else each element decodes (tap, channel)."""
    import tilelang.language as T

    group = group_or_split if p.geometry.groups > 1 else 0
    k_tiles = -(-p.k // block_K)
    if at is not None:
        tap, channel, extra = at[0], at[1] + kk, []
    elif p.cg % block_K == 0:
        tap, channel, extra = kt * block_K // p.cg, kt * block_K % p.cg + kk, [kt < k_tiles] if tail else []
    else:
        k = kt * block_K + kk
        tap, channel = (k, 0) if p.cg == 1 else (k // p.cg, k % p.cg)
        extra = [k < p.k]
    inside, row = _source(p, m, tap, rows)
    return T.if_then_else(_all([inside, *extra]), X[row, group * p.cg + channel], 0)


def _epilogue(p: Problem, value, column, Bias, XS, WS):
    """fp32 ``value`` of output channel ``column`` (clamped in range by the caller): scaled (fp8),
    biased, ReLU'd."""
    import tilelang.language as T

    if p.fp8:
        value = value * (XS[0] * WS[0])
    if p.bias:
        value = value + T.Cast(F32, Bias[column])
    if p.relu:  # not max(value, 0), which makes NaN 0 where torch's ReLU keeps it
        value = T.if_then_else(value < T.float32(0), T.float32(0), value)
    return value


def ordered_sum(splits: int, rows, cols: int, finish, channels_first: ChannelsFirst | None = None):
    """The second kernel of a split-K GEMM, as a macro ``reduce(Work, Out, *extra)`` of three
    ``extra`` buffers (or None): the ``splits`` fp32 partials in ``Work[splits, rows, cols]`` of each
    output summed in index order (the same bits every run: no atomics, no order left to the
    scheduler), then ``Out[row, col] = finish(total, col, *extra)`` (the epilogue: its cast, bias,
    scales), or where ``channels_first`` the output (row, col) of its ``Out [N, cols, positions]``."""
    import tilelang.language as T

    r_cols = min(128, 1 << max(2, (cols - 1).bit_length()))  # whole 16-byte fp32 vectors along a row
    r_rows = max(1, REDUCE_ELEMENTS // r_cols)
    write = channels_first.write(r_rows, r_cols) if channels_first else None

    @T.macro
    def reduce(Work, Out, A, B, C):
        with T.Kernel(T.ceildiv(cols, r_cols), T.ceildiv(rows, r_rows), threads=256) as (cx, cy):
            total = T.alloc_fragment((r_rows, r_cols), F32)
            for i, j in T.Parallel(r_rows, r_cols):  # not T.clear: the CPU target fills no fragment
                total[i, j] = 0
            for s in in_order(splits):  # a fixed order: deterministic
                for i, j in T.Parallel(r_rows, r_cols):
                    total[i, j] += T.if_then_else(
                        cy * r_rows + i < rows and cx * r_cols + j < cols,
                        Work[s, T.min(cy * r_rows + i, rows - 1), T.min(cx * r_cols + j, cols - 1)], T.float32(0))
            if channels_first is not None:
                write(lambda i, j: finish(total[i, j], T.min(cx * r_cols + j, cols - 1), A, B, C),
                      Out, cy * r_rows, cx * r_cols, rows, cols, 0)
            else:
                for i, j in T.Parallel(r_rows, r_cols):
                    if cy * r_rows + i < rows and cx * r_cols + j < cols:
                        Out[cy * r_rows + i, cx * r_cols + j] = finish(total[i, j], cx * r_cols + j, A, B, C)

    return reduce


def tile_allocator(portable: bool):
    """Where a GEMM's tiles live: shared memory, or where ``portable`` fragments (TileLang's CPU
    target takes one dynamic shared allocation a kernel)."""
    import tilelang.language as T

    return T.alloc_fragment if portable else T.alloc_shared


def zero_fill(portable: bool):
    """A macro clearing a 2-d fragment: ``T.clear``, or where ``portable`` a loop (the CPU target
    fills no fragment with ``T.clear``)."""
    import tilelang.language as T

    @T.macro
    def zero(fragment):
        if portable:
            for i, j in T.Parallel(*fragment.shape):
                fragment[i, j] = 0
        else:
            T.clear(fragment)

    return zero


def tile_product(portable: bool, transpose_A: bool = False, transpose_B: bool = False):
    """A macro ``product(A_s, B_s, acc)``: acc += A @ B in fp32 (A_s stored [K, M] where
    ``transpose_A``, B_s [N, K] where ``transpose_B``): ``T.gemm`` on tensor cores, or where
    ``portable`` plain loops (TileLang's CPU target has no lowering for T.gemm)."""
    import tilelang.language as T

    def a(A_s, i, kk):
        return A_s[kk, i] if transpose_A else A_s[i, kk]

    def b(B_s, kk, j):
        return B_s[j, kk] if transpose_B else B_s[kk, j]

    def depth(A_s):
        return A_s.shape[0 if transpose_A else 1]

    @T.macro
    def product(A_s, B_s, acc):
        if portable:
            for i, j in T.Parallel(*acc.shape):
                for kk in T.serial(depth(A_s)):
                    acc[i, j] += T.Cast(F32, a(A_s, i, kk)) * T.Cast(F32, b(B_s, kk, j))
        else:
            T.gemm(A_s, B_s, acc, transpose_A=transpose_A, transpose_B=transpose_B)

    return product


def staging_columns(columns: int, channels_first: ChannelsFirst | None = None) -> int:
    """Columns of the shared tile a block stages ``columns`` outputs a row in before its store:
    :meth:`ChannelsFirst.columns` for a channels-first store; for a row-major one, 8 elements
    more, so that a warp's writes of its accumulator fragment (8 rows of 4 threads, 2 elements
    each) fall in distinct banks: rows a multiple of 128 bytes apart all fall in the same ones."""
    return channels_first.columns(columns) if channels_first else columns + 8


def staged_store(tile_rows: int, channels: int, channels_first: ChannelsFirst | None, output_row=None):
    """A macro ``store(tile, Y, row0, col0, rows, col_count, first_col)``: a block's outputs staged
    in ``tile`` (tile_rows x channels, :func:`staging_columns` wide) into ``Y``: channels first,
    :meth:`ChannelsFirst.store`'s (``rows`` its ``row_count``); channels last, along each output
    row, tile row ``i`` to the row ``output_row(row0 + i, rows)`` names (by default ``(row < rows,
    row)``), column ``j`` to channel ``first_col + col0 + j`` where ``col0 + j < col_count``."""
    import tilelang.language as T

    if channels_first is not None:
        return channels_first.store(tile_rows, channels, output_row)
    if output_row is None:
        def output_row(row, rows):
            return row < rows, row

    # The parameter is named ``rows`` as the GEMM's run-time row count is: a macro renames a size
    # variable passed to it after its parameter, and the kernel's signature would change with it.
    @T.macro
    def store(tile, Y, row0, col0, rows, col_count, first_col):
        for i, j in T.Parallel(tile_rows, channels):
            target = output_row(row0 + i, rows)  # one name: unpacked, each half would be let-bound
            if target[0] and col0 + j < col_count:
                Y[target[1], first_col + col0 + j] = tile[i, j]

    return store


def store_partials():
    """A macro ``store(acc, C_s, Work, split, row0, col0, rows, cols)``: a split-K block's fp32
    tile (through ``C_s``, :func:`staging_columns` wide) into its split's slice of the workspace,
    at (row0, col0), rows and columns past (rows, cols) left out (what :func:`ordered_sum` then
    adds)."""
    import tilelang.language as T

    @T.macro
    def store(acc, C_s, Work, split, row0, col0, rows, cols):
        for i, j in T.Parallel(*acc.shape):
            C_s[i, j] = acc[i, j]
        for i, j in T.Parallel(*acc.shape):
            if row0 + i < rows and col0 + j < cols:
                Work[split, row0 + i, col0 + j] = C_s[i, j]

    return store


def gemm_kernel(p: Problem, config: ConvLaunch, portable: bool = False) -> KernelSpec:
    """The implicit GEMM (``splits`` == 1) or its split-K form with a fixed-order reduction.
    ``portable``: the tile product as plain loops instead of ``T.gemm``, which TileLang's CPU target
    has no lowering for, so that tests run every other part of the kernel (the gather, the split-K
    ranges and reduction, the epilogue and the masked writes) on machines without a GPU."""
    import tilelang.language as T

    g = p.geometry
    dt, ot = tilelang_dtype(p.dtype), tilelang_dtype(p.out_dtype)
    bM, bN, bK, stages, threads, splits = (config.block_M, config.block_N, config.block_K, config.num_stages,
                                           config.threads, config.splits)
    sizes = _launch_sizes(p)
    M, K, Cg, Og, C_out, groups = sizes["rows"], p.k, p.cg, p.og, g.out_channels, g.groups
    aligned = Cg % bK == 0
    k_tiles = -(-K // bK)
    per_split = -(-k_tiles // splits)
    split = config.kernel == "split_k"
    tail = split and per_split * splits > k_tiles
    walks = config.tiles
    if split and groups != 1:
        raise ValueError("split-K takes ungrouped convolutions")
    if walks > 1 and (split or k_tiles > 1):
        raise ValueError(f"a block walks several row tiles only where K is one tile and not split, got {k_tiles} "
                         f"K tiles, {splits} splits")
    # Where whole row tiles' windows lie in the padding at some taps (a large dilation on a small
    # map: ASPP), each tile walks only the K tiles of the taps some row of it reads input at.
    skips = aligned and not p.input_is_a and walks == 1 and live_tap_share(p, bM) <= LIVE_TAPS_AT_MOST
    tap_tiles = Cg // bK if aligned else 0

    def finish(total, c, Bias, XS, WS):
        return T.Cast(ot, _epilogue(p, total, c, Bias, XS, WS))

    channels_first = p.channels_first
    reduce = ordered_sum(splits, M, C_out, finish, channels_first)
    # Split-K blocks stage fp32 partials for the channels-last workspace; the others, the output.
    staged_columns = staging_columns(bN, None if split else channels_first)
    store = staged_store(bM, bN, channels_first)
    # Rows and channels past the input's edge read as zeros in a copied A tile. The 1x1 rows ran
    # 0.73-0.86x of cuDNN on the H100 with the gather.
    rows_are_a = p.input_is_a

    def _k_tile(bz, ko):
        """The K tile of pipeline step ``ko`` of the block in grid row ``bz``."""
        return bz % splits * per_split + ko if split else ko

    def _group(bz):
        return bz if groups > 1 else 0

    def live_tiles(row0):
        """(first tap per dim, taps per dim, K tiles) live in the row tile from ``row0`` (rows past M
        fall in an image after the last: their tile takes every tap)."""
        firsts, counts = _tile_live_taps(p, row0, bM)
        tiles = tap_tiles
        for count in counts:
            tiles = tiles * count if not is_one(count) else tiles
        return firsts, counts, tiles

    def live_start(tiles, bz, split_index):
        """The first of the live K tiles ``tiles`` that the split ``split_index`` of the grid row ``bz``
        takes (splits of the live tiles as even as they divide)."""
        return _div((bz % splits + split_index) * tiles, splits) if split else split_index * tiles

    def live_steps(row0, bz):
        """Pipeline steps of the split ``bz`` of the row tile from ``row0`` over its live K tiles."""
        tiles = live_tiles(row0)[2]
        return live_start(tiles, bz, 1) - live_start(tiles, bz, 0)

    def live_k(row0, bz, ko):
        """((kd, kh, kw), first channel) of pipeline step ``ko`` of the split ``bz`` of the row tile
        from ``row0``."""
        firsts, counts, tiles = live_tiles(row0)
        tile = live_start(tiles, bz, 0) + ko
        taps = box_position(_div(tile, tap_tiles), counts, p.kernel3)
        # Clamped to the dim's taps (they lie there): bounds TVM can prove keep the gather's index
        # arithmetic in int32.
        return (tuple(T.max(0, T.min(first + u, size - 1)) for first, u, size in zip(firsts, taps, p.kernel3, strict=True)),
                _mod(tile, tap_tiles) * bK)

    zero, product = zero_fill(portable), tile_product(portable, transpose_B=True)

    @T.macro
    def load_a(X, A_s, row0, bz, ko):
        """The A tile of rows from ``row0`` at pipeline step ``ko``."""
        if rows_are_a:
            T.copy(X[row0, _k_tile(bz, ko) * bK], A_s)
        else:
            # Expressions built whole by the helpers (no let-bound names): TileLang turns a
            # zero-fill if_then_else load into a predicated cp.async only in that form.
            for i, kk in T.Parallel(bM, bK):
                A_s[i, kk] = _a_element(p, X, row0 + i, M, _k_tile(bz, ko), kk, bz, bK, tail,
                                        live_k(row0, bz, ko) if skips else None)

    @T.macro
    def load_b(Wt, B_s, row0, bx, bz, ko):
        # T.copy, not a gather: with two gathers in a stage TileLang makes only one of
        # them cp.async. Its bounds checks zero-fill rows past C_out and columns past K;
        # rows past the group's channels (the next group's weights) only reach output
        # columns that are not written.
        if skips:
            (kd, kh, kw), channel = live_k(row0, bz, ko)
            _, kH, kW = p.kernel3
            T.copy(Wt[_group(bz) * Og + bx * bN, ((kd * kH + kh) * kW + kw) * Cg + channel], B_s)
        else:
            T.copy(Wt[_group(bz) * Og + bx * bN, _k_tile(bz, ko) * bK], B_s)

    @T.macro
    def write_tile(acc, C_s, Y, Bias, XS, WS, row0, bx, bz):
        """The tile of rows from ``row0``: the epilogue, staged in ``C_s``, stored."""
        for i, j in T.Parallel(bM, bN):
            C_s[i, j] = T.Cast(ot, _epilogue(p, acc[i, j], _group(bz) * Og + T.min(bx * bN + j, Og - 1),
                                             Bias, XS, WS))
        store(C_s, Y, row0, bx * bN, M, Og, _group(bz) * Og)

    @T.macro
    def body(X, Wt, Bias, XS, WS, Y, Work):
        with T.Kernel(T.ceildiv(Og, bN), T.ceildiv(M, bM * walks), groups * splits, threads=threads) as (bx, by, bz):
            tile = tile_allocator(portable)
            A_s = tile((bM, bK), dt)
            B_s = tile((bN, bK), dt)
            acc = T.alloc_fragment((bM, bN), F32)
            C_s = tile((bM, staged_columns), F32 if split else ot)
            if walks > 1:  # K is one tile: the pipeline runs over the block's row tiles
                load_b(Wt, B_s, by * bM, bx, bz, 0)
                for t in T.Pipelined(walks, num_stages=stages):
                    load_a(X, A_s, (by * walks + t) * bM, bz, 0)
                    zero(acc)
                    product(A_s, B_s, acc)
                    write_tile(acc, C_s, Y, Bias, XS, WS, (by * walks + t) * bM, bx, bz)
            else:
                zero(acc)
                for ko in T.Pipelined(live_steps(by * bM, bz) if skips else per_split, num_stages=stages):
                    load_a(X, A_s, by * bM, bz, ko)
                    load_b(Wt, B_s, by * bM, bx, bz, ko)
                    product(A_s, B_s, acc)
                if split:
                    store_partials()(acc, C_s, Work, bz, by * bM, bx * bN, M, Og)
                else:
                    write_tile(acc, C_s, Y, Bias, XS, WS, by * bM, bx, bz)
        if split:
            reduce(Work, Y, Bias, XS, WS)

    prim_func = _prim_func(p, config, body, sizes)
    return _spec(p, config, prim_func, {"k_tiles": k_tiles, "aligned": aligned, **({"skips_padding": True} if skips else {})})


def direct_kernel(p: Problem, config: ConvLaunch) -> KernelSpec:
    """Direct convolution on CUDA cores: a block of ``block_M`` positions x ``block_N`` output
    channels, each output's taps x group channels summed in fp32."""
    import tilelang.language as T

    g = p.geometry
    ot = tilelang_dtype(p.out_dtype)
    bM, bN, threads = config.block_M, config.block_N, config.threads
    sizes = _launch_sizes(p)
    M, Cg, Og, C_out, taps = sizes["rows"], p.cg, p.og, g.out_channels, p.taps
    channels_first = p.channels_first
    write = channels_first.write(bM, bN) if channels_first else None

    @T.macro
    def body(X, Wt, Bias, XS, WS, Y, Work):
        with T.Kernel(T.ceildiv(C_out, bN), T.ceildiv(M, bM), threads=threads) as (bx, by):
            acc = T.alloc_fragment((bM, bN), F32)
            for i, j in T.Parallel(bM, bN):  # not T.clear: TileLang's CPU target fills no fragment
                acc[i, j] = 0
            for tap in T.serial(taps):
                for c in T.serial(Cg):
                    for i, j in T.Parallel(bM, bN):
                        co = T.min(bx * bN + j, C_out - 1)
                        inside, row = _source(p, by * bM + i, tap, M)
                        x = T.if_then_else(inside, X[row, co // Og * Cg + c], 0)
                        acc[i, j] += T.Cast(F32, x) * T.Cast(F32, Wt[co, tap * Cg + c])
            if channels_first is not None:
                write(lambda i, j: T.Cast(ot, _epilogue(p, acc[i, j], T.min(bx * bN + j, C_out - 1), Bias, XS, WS)),
                      Y, by * bM, bx * bN, M, C_out, 0)
            else:
                for i, j in T.Parallel(bM, bN):
                    if by * bM + i < M and bx * bN + j < C_out:
                        Y[by * bM + i, bx * bN + j] = T.Cast(ot, _epilogue(p, acc[i, j], bx * bN + j, Bias, XS, WS))

    return _spec(p, config, _prim_func(p, config, body, sizes), {})


def window_kernel(p: Problem, config: ConvLaunch) -> KernelSpec:
    """A small K on CUDA cores (see the module's docstring): ``block_M`` positions, a thread each,
    x ``block_N`` output channels a block, each thread's window in registers, the block's weights
    in shared memory."""
    import tilelang.language as T

    g = p.geometry
    dt, ot = tilelang_dtype(p.dtype), tilelang_dtype(p.out_dtype)
    bM, bN, threads = config.block_M, config.block_N, config.threads
    sizes = _launch_sizes(p)
    M, Cg, C_out, K = sizes["rows"], p.cg, g.out_channels, p.k
    channels_first = p.channels_first
    if bM != threads:
        raise ValueError(f"the window kernel takes a position a thread: block_M ({bM}) must equal threads ({threads})")

    @T.macro
    def body(X, Wt, Bias, XS, WS, Y, Work):
        with T.Kernel(T.ceildiv(C_out, bN), T.ceildiv(M, bM), threads=threads) as (bx, by):
            weights = T.alloc_shared((bN, K), dt)
            window = T.alloc_fragment((bM, K), dt)
            acc = T.alloc_fragment((bM, bN), F32)
            T.annotate_layout({window: thread_owned((bM, K), 0), acc: thread_owned((bM, bN), 0)})
            for j, k in T.Parallel(bN, K):
                weights[j, k] = Wt[T.min(bx * bN + j, C_out - 1), k]
            for i, k in T.Parallel(bM, K):
                inside, row = _source(p, by * bM + i, k // Cg, M)
                window[i, k] = T.if_then_else(inside, X[row, k % Cg], 0)
            for i, j in T.Parallel(bM, bN):
                acc[i, j] = 0
                for k in T.unroll(K):  # unrolled: the window stays in registers, indexed by constants
                    acc[i, j] += T.Cast(F32, window[i, k]) * T.Cast(F32, weights[j, k])
            # Stored from registers in either layout: channels last, a thread's channels are
            # consecutive addresses; channels first, a warp's positions are, channel by channel.
            for i, j in T.Parallel(bM, bN):
                m, column = by * bM + i, bx * bN + j
                if m < M and column < C_out:
                    value = T.Cast(ot, _epilogue(p, acc[i, j], column, Bias, XS, WS))
                    if channels_first is not None:
                        Y[m // channels_first.positions, column, m % channels_first.positions] = value
                    else:
                        Y[m, column] = value

    return _spec(p, config, _prim_func(p, config, body, sizes), {})


def halo_kernel(p: Problem, config: ConvLaunch, portable: bool = False) -> KernelSpec:
    """The implicit GEMM over a box of output positions whose input (the halo: every position its
    windows read, the padding zero) a block loads into shared memory once: each K step's A tile
    (``block_K / Cg`` taps x the channels) is then filled from it, not gathered from global memory
    again for every tap (a 3x3x3 conv reads its input 27 times so: from L2, the bound of the GEMM
    on the 3-d U-Net's 32 -> 64 layer). ``portable``: see :func:`gemm_kernel`."""
    import tilelang.language as T

    dt, ot = tilelang_dtype(p.dtype), tilelang_dtype(p.out_dtype)
    bM, bN, bK, stages, threads = config.block_M, config.block_N, config.block_K, config.num_stages, config.threads
    (tD, tH, tW), Cg, Og = config.box, p.cg, p.og
    if bK % Cg or p.taps % (bK // Cg):
        raise ValueError(f"a halo kernel's K step ({bK}) takes whole taps of {Cg} channels, a divisor of {p.taps} taps")
    sizes = _launch_sizes(p)
    M = sizes["rows"]
    (D, H, W), (OD, OH, OW) = p.in3, p.out3
    (sD, sH, sW), (dD, dH, dW) = p.stride3, p.dilation3
    hD, hH, hW = halo_extent(p, config.box)
    nD, nH, nW = -(-OD // tD), -(-OH // tH), -(-OW // tW)
    boxes = nD * nH * nW
    step_taps = bK // Cg
    channels_first = p.channels_first
    tile = tile_allocator(portable)
    zero, product = zero_fill(portable), tile_product(portable, transpose_B=True)

    def origin(box):
        """(n, od, oh, ow) of the first output position of box index ``box``."""
        return box // boxes, box // (nH * nW) % nD * tD, box // nW % nH * tH, box % nW * tW

    def box_row(i, box):
        """(inside, output row m) of position ``i`` of box index ``box``."""
        n, od0, oh0, ow0 = origin(box)
        od, oh, ow = od0 + i // (tH * tW), oh0 + i // tW % tH, ow0 + i % tW
        return _all([od < OD if OD % tD else True, oh < OH if OH % tH else True, ow < OW if OW % tW else True]), \
            ((n * OD + od) * OH + oh) * OW + ow

    store = staged_store(bM, bN, channels_first, box_row)

    @T.macro
    def body(X, Wt, Bias, XS, WS, Y, Work):
        with T.Kernel(T.ceildiv(Og, bN), M // math.prod(p.out3) * boxes, threads=threads) as (bx, by):
            halo = tile((hD * hH * hW, Cg), dt)
            A_s = tile((bM, bK), dt)
            B_s = tile((bN, bK), dt)
            acc = T.alloc_fragment((bM, bN), F32)
            C_s = tile((bM, staging_columns(bN, channels_first)), ot)
            n, od0, oh0, ow0 = origin(by)
            for e, c in T.Parallel(hD * hH * hW, Cg):
                z = [o * s - pad + u for o, s, pad, u in zip((od0, oh0, ow0), (sD, sH, sW), p.pad3,
                                                            (e // (hH * hW), e // hW % hH, e % hW), strict=True)]
                inside = _all([bound for coordinate, size in zip(z, (D, H, W), strict=True)
                               for bound in (coordinate >= 0, coordinate < size)])
                halo[e, c] = T.if_then_else(inside, X[((n * D + z[0]) * H + z[1]) * W + z[2], c], 0)
            zero(acc)
            for step in T.Pipelined(p.taps // step_taps, num_stages=stages):
                T.copy(Wt[bx * bN, step * bK], B_s)
                for i, kk in T.Parallel(bM, bK):
                    kd, kh, kw = _tap(p, step * step_taps + kk // Cg)
                    A_s[i, kk] = halo[((i // (tH * tW) * sD + kd * dD) * hH + i // tW % tH * sH + kh * dH) * hW
                                      + i % tW * sW + kw * dW, kk % Cg]
                product(A_s, B_s, acc)
            for i, j in T.Parallel(bM, bN):
                C_s[i, j] = T.Cast(ot, _epilogue(p, acc[i, j], T.min(bx * bN + j, Og - 1), Bias, XS, WS))
            store(C_s, Y, 0, bx * bN, by, Og, 0)  # row_count: the box, which box_row maps a tile row in

    return _spec(p, config, _prim_func(p, config, body, sizes), {})


def _launch_sizes(p: Problem) -> dict:
    """The kernels' sizes given at launch, as TIR variables (int32: see :func:`unsupported`):
    "rows_in" and "rows" (see :func:`_params`); a channels-first output's batch, whose "rows" are
    ``batch * positions``."""
    import tilelang.language as T

    if p.channels_first:
        batch = T.dynamic("batch", "int32")
        return {"rows_in": T.dynamic("rows_in", "int32"), "batch": batch, "rows": batch * p.channels_first.positions}
    return {name: T.dynamic(name, "int32") for name in ("rows_in", "rows")}


def _prim_func(p: Problem, config: ConvLaunch, body, sizes: dict):
    """``body(X, Wt, Bias, XS, WS, Y, Work)`` as a prim_func over :func:`_params`' parameters
    (the ones a problem lacks passed as None), their named sizes ``sizes``' variables."""
    params, _ = _params(p, config)
    params = [(name, tuple(sizes[d] if isinstance(d, str) else d for d in shape)) for name, shape in params]
    dtypes = {"input": p.dtype, "weight": p.dtype, "bias": p.dtype, "x_scale": torch.float32,
              "w_scale": torch.float32, "output": p.out_dtype, "workspace": torch.float32}
    names = [name for name, _ in params]

    def run(t):
        body(t["input"], t["weight"], t.get("bias"), t.get("x_scale"), t.get("w_scale"), t["output"], t.get("workspace"))

    return prim_func_over(params, [dtypes[name] for name in names], run, names)


def prim_func_over(params, dtypes, run, roles):
    """A prim_func over ``params`` (name, shape) of ``dtypes`` whose body is ``run(tensors)``,
    ``tensors`` the parameters by role (``roles``, one per parameter)."""
    import tilelang.language as T

    t = [T.Tensor(shape, tilelang_dtype(dtype)) for (_, shape), dtype in zip(params, dtypes, strict=True)]

    def by_role(*args):
        return dict(zip(roles, args, strict=True))

    n = len(t)
    # One prim_func per arity (TileLang reads the signature's annotations; names do not matter).
    if n == 3:
        @T.prim_func
        def main(a0: t[0], a1: t[1], a2: t[2]):
            run(by_role(a0, a1, a2))
    elif n == 4:
        @T.prim_func
        def main(a0: t[0], a1: t[1], a2: t[2], a3: t[3]):
            run(by_role(a0, a1, a2, a3))
    elif n == 5:
        @T.prim_func
        def main(a0: t[0], a1: t[1], a2: t[2], a3: t[3], a4: t[4]):
            run(by_role(a0, a1, a2, a3, a4))
    elif n == 6:
        @T.prim_func
        def main(a0: t[0], a1: t[1], a2: t[2], a3: t[3], a4: t[4], a5: t[5]):
            run(by_role(a0, a1, a2, a3, a4, a5))
    else:  # pragma: no cover
        raise AssertionError(n)
    return main
