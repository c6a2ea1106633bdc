"""TileLang support shared by the family plugins: whether kernels can run, the compile target, and
the implementation wrapper that turns an op's kernel description into a checked, timed callable.

TileLang is imported lazily: the core and the plugins load (and list, and run baselines) without it.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from .impl import Implementation, KeyFn, LaunchClassesFn, VariantsFn
from .op import KernelOp

if TYPE_CHECKING:
    from .devices import Device
    from .op import Op
    from .workload import Workload

MIN_CAPABILITY = (8, 0)
# The SMs :func:`multiprocessors` gives without a GPU. Kernels compiled there (CI,
# scripts/warm-kernel-cache.py) target sm_90a, and its H100 and H200 have 132: so those kernels are
# the ones these GPUs build, and load from a cache warmed without them.
DEFAULT_TARGET_MULTIPROCESSORS = 132
TILELANG_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32",
                   torch.int8: "int8", torch.int32: "int32", torch.float8_e4m3fn: "float8_e4m3"}


def tilelang_dtype(dtype: torch.dtype) -> str:
    return TILELANG_DTYPES[dtype]


def cuda_target(arch: str | None = None) -> dict[str, str]:
    """TileLang's target as a JSON dict (the string form is rejected). The arch: as given, else
    NPUOPS_CUDA_ARCH (e.g. ``sm_90a``: CPU-only machines compile the kernels a GPU run would, into
    TileLang's cache, see scripts/warm-kernel-cache.py), else the current GPU's, with its
    architecture-specific features from Hopper on (``sm_90a``: wgmma and setmaxnreg exist only
    there; a kernel using them built for ``sm_90`` traps at run time)."""
    arch = arch or os.environ.get("NPUOPS_CUDA_ARCH")
    if arch is None:
        major, minor = torch.cuda.get_device_capability()
        arch = f"sm_{major}{minor}{'a' if major >= 9 else ''}"
    return {"kind": "cuda", "arch": arch}


CPU_TARGET = {"kind": "c"}


def multiprocessors(device: torch.device | str | int | None = None) -> int:
    """The SMs of the GPU a kernel is for, by which launch rules size grids and waves: the CUDA
    ``device``'s (None: the current one, which :func:`cuda_target` compiles for), else (no GPU, or
    a device other than a CUDA one) DEFAULT_TARGET_MULTIPROCESSORS. Looked up once per device, so
    that rules may ask at every decision."""
    if not torch.cuda.is_available():
        return DEFAULT_TARGET_MULTIPROCESSORS
    if device is not None:
        device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        if device.type != "cuda":
            return DEFAULT_TARGET_MULTIPROCESSORS
    index = device.index if device is not None and device.index is not None else torch.cuda.current_device()
    return _device_multiprocessors(index)


@functools.cache
def _device_multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def compile_kernel(prim_func: Any, arch: str | None = None, pass_configs: Mapping[str, Any] | None = None,
                   target: Mapping[str, str] | None = None) -> Any:
    """Compile a TileLang prim_func for CUDA (TileLang caches the result on disk). ``target=CPU_TARGET``
    builds kernels written with tile-level operators only for the host instead, which lets tests
    check their logic on machines without a GPU."""
    import tilelang
    import tvm

    target = dict(target) if target else cuda_target(arch)
    if target["kind"] != "cuda":
        prim_func = without_assumptions(single_thread_layouts(prim_func))
    # Kernels to run get TileLang's cython backend, whose host library :func:`launcher` calls
    # directly; that library links the CUDA driver, so a machine without one (CI) builds with the
    # default backend, which checks as much of the kernel, unless TileLang's own setting asks for
    # cython (scripts/warm-kernel-cache.py, linking a stand-in driver: the GPU machine's builds).
    cython = torch.cuda.is_available() or os.environ.get("TILELANG_EXECUTION_BACKEND") == "cython"
    backend = "cython" if target["kind"] == "cuda" and cython else "auto"
    with tvm.target.Target(target):  # lowering needs the target as context without a GPU
        return tilelang.compile(prim_func, target=target, pass_configs=dict(pass_configs or {}),
                                execution_backend=backend)


def thread_owned(shape: Sequence[int], thread_dim: int) -> Any:
    """A fragment layout for ``T.annotate_layout``: element ``i`` lives on thread
    ``i[thread_dim]``, which holds the other dims row-major in its registers (so a thread's
    elements along the last dim load and store as whole vectors). TileLang's own inference may
    instead spread them over several threads."""
    import math

    from tilelang.layout import Fragment

    shape = [int(n) for n in shape]
    rest = [d for d in range(len(shape)) if d != thread_dim]
    strides = {d: math.prod(shape[e] for e in rest[k + 1:]) for k, d in enumerate(rest)}
    return Fragment(shape, forward_thread_fn=lambda *i: i[thread_dim],
                    forward_index_fn=lambda *i: sum(i[d] * strides[d] for d in rest))


def interleaved_vectors(rows: int, length: int, lanes: int, vector: int) -> Any:
    """A fragment layout for ``T.annotate_layout`` of a (rows, length) tile: row p spread over the
    ``lanes`` threads from p * lanes, element k in vector k // ``vector``, vector c on lane
    c % lanes. Each thread holds whole vectors, lanes apart, as TileLang lays out a row it loads
    in vectors, so a kernel that combines a thread's own elements knows which they are."""
    from tilelang.layout import Fragment

    return Fragment((rows, length), forward_thread_fn=lambda p, k: p * lanes + k // vector % lanes,
                    forward_index_fn=lambda p, k: k // (vector * lanes) * vector + k % vector)


LOADS_IN_FLIGHT = 8  # iterations of an in-order sum whose loads the compiler issues together


def in_order(extent: Any) -> Any:
    """A loop over ``extent`` for summing partials in a fixed order (the same bits every run) whose
    iterations' loads the compiler may issue before the adds (``#pragma unroll 8``), not one memory
    latency each: a conv weight gradient's reduction of 88 partials, one block, read them one after
    another (29.3 µs against cuDNN's 11.0 on the H100)."""
    import tilelang.language as T

    return T.unroll(extent, annotations={"pragma_unroll_factor": LOADS_IN_FLIGHT})


# The kernel prelude (``T.Kernel(prelude=...)``) :func:`load_vectors_evict_last` needs: a 16-byte
# global load whose L2 lines are evicted after all others (PTX ``evict_last``, as Triton lowers
# ``eviction_policy="evict_last"``). Rows read once and streamed so ran 3-4% faster on the H200
# (FusedAddRMSNorm 2048 x 16384, Triton's kernel and ours alike), presumably because the dirty
# output lines then leave the L2 first (not measured). The lines keep that priority after the kernel, until evicted: the timing protocol resets
# it before each iteration (docs/timing.md); in a model the next kernels find them there.
EVICT_LAST_LOAD = r"""
static __device__ __forceinline__ void npuops_load_evict_last(void* dst, const void* src) {
  unsigned long long policy;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  uint4 v;
  asm volatile("ld.global.L1::evict_last.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(src), "l"(policy));
  *reinterpret_cast<uint4*>(dst) = v;
}
"""


def load_vectors_evict_last(fragment: Any, source: Callable[[Any, Any], Any], length: int, lanes: int,
                            vector: int) -> None:
    """In a TileLang kernel whose prelude has EVICT_LAST_LOAD: fragment[p, k] = source(p, k) (a
    buffer element) over a (rows, length) fragment laid out by :func:`interleaved_vectors`, one
    16-byte evict_last load per vector."""
    import tilelang.language as T

    thread = T.get_thread_binding()
    row, lane = thread // lanes, thread % lanes
    for k in range(length // (vector * lanes)):  # unrolled here: the fragment's registers take constant indices
        column = k * vector * lanes + lane * vector
        T.evaluate(T.call_extern("handle", "npuops_load_evict_last", T.address_of(fragment[row, column]),
                                 T.address_of(source(row, column))))


def single_thread_layouts(prim_func: Any) -> Any:
    """``prim_func`` with its ``T.annotate_layout`` fragment layouts replaced by one thread holding
    each fragment whole. A layout that gives each GPU thread its own elements (so that they load as
    whole vectors) cannot hold on the CPU target, which runs a block's threads one after another in
    one thread; the kernel's logic, which is what the CPU checks, does not depend on it."""
    import math

    from tilelang.layout import Fragment
    from tvm.tirx import SBlock
    from tvm.tirx.stmt_functor import ir_transform

    def whole(layout):
        shape = [int(n) for n in layout.get_input_shape()]
        strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
        return Fragment(shape, forward_thread_fn=lambda *i: 0,
                        forward_index_fn=lambda *i: sum(x * s for x, s in zip(i, strides, strict=True)))

    def rewrite(stmt):
        if isinstance(stmt, SBlock) and "layout_map" in stmt.annotations:
            annotations = dict(stmt.annotations)
            annotations["layout_map"] = {var: whole(layout) for var, layout in annotations["layout_map"].items()}
            return SBlock(stmt.iter_vars, stmt.reads, stmt.writes, stmt.name_hint, stmt.body, stmt.init,
                          stmt.alloc_buffers, stmt.match_buffers, annotations)
        return None

    return prim_func.with_body(ir_transform(prim_func.body, None, rewrite, ["tirx.SBlock"]))


def without_assumptions(prim_func: Any) -> Any:
    """``prim_func`` without its ``T.assume`` statements. They tell the GPU's vectorizer what it
    cannot prove (a size given at launch a multiple of the vector); on the CPU target the loads
    they vectorize take 64-bit vector indices, which TileLang's C code generator cannot print.
    The kernel's logic, which the CPU checks, does not depend on them."""
    from tvm import tirx
    from tvm.tirx.stmt_functor import ir_transform

    assume = tirx.op.Op.get("tirx.assume")

    def rewrite(stmt):
        if isinstance(stmt, tirx.Evaluate) and isinstance(stmt.value, tirx.Call) and stmt.value.op.same_as(assume):
            return tirx.Evaluate(0)
        return None

    return prim_func.with_body(ir_transform(prim_func.body, None, rewrite, ["tirx.Evaluate"]))


def why_tilelang_cannot_run(device: Device) -> str | None:
    if device.name != "cuda":
        return f"TileLang kernels need an NVIDIA GPU (sm_80+), not {device.name}"
    capability = torch.cuda.get_device_capability()
    if capability < MIN_CAPABILITY:
        return f"TileLang kernels need sm_80 or newer; this GPU is sm_{capability[0]}{capability[1]}"
    try:
        import tilelang  # noqa: F401
    except Exception as exc:
        return f"tilelang is not importable ({type(exc).__name__}: {exc}); pip install tilelang"
    return None


def _dtype_without_kernels(w: Workload) -> str | None:
    """A tensor dtype TileLang compiles no kernel of ours for (float64): torch's formulation runs
    it, said so up front rather than by a failed build."""
    for name in w.shapes:
        dtype = w.dtype_of(name)
        if dtype not in TILELANG_DTYPES:
            return f"no TileLang kernel for {str(dtype).removeprefix('torch.')} ({name})"
    return None


VECTOR_BYTES = 16  # kernels load and store 16-byte vectors


def layout_problem(tensor: torch.Tensor) -> str | None:
    """Why a kernel cannot take ``tensor`` as it is (None: it can): it must be contiguous and start
    on a 16-byte boundary (an offset view such as ``x.view(-1)[1:]`` may not)."""
    if not tensor.is_contiguous():
        return (f"must be contiguous (shape {tuple(tensor.shape)}, strides {tensor.stride()}); "
                "call .contiguous() first")
    if tensor.data_ptr() % VECTOR_BYTES:
        return (f"must start on a {VECTOR_BYTES}-byte boundary (storage offset {tensor.storage_offset()}); "
                "call .clone() first")
    return None


def wide_indices(shape: Sequence[int]) -> bool:
    """Whether a tensor of ``shape`` needs 64-bit element indices (a kernel whose sizes come at
    launch declares them int32 otherwise)."""
    return math.prod(shape) >= 2**31


@dataclass(frozen=True)
class KernelSpec:
    """One compiled kernel and how the op's inputs map onto it.

    ``params`` are the kernel's parameters in order, each with the shape the kernel declares. A
    dim may be a name: a size the kernel takes at launch (its ``T.dynamic`` of that name), so one
    build serves every size there. An input's first dim stands for all its leading dims flattened
    (a contiguous tensor is that shape without a copy); the others are its trailing dims, in order.
    Those in ``outputs`` are allocated per call, their named sizes taken from the inputs' or from
    ``derived`` (a function of the inputs' named sizes: an output size the inputs do not show);
    the rest are op inputs (possibly updated in place). ``returns`` names what the op returns,
    each viewed to the given shape, where a leading ``...`` stands for the first input's leading
    dims (those its first kernel dim flattens).
    """

    prim_func: Any
    params: tuple[tuple[str, tuple[int | str, ...]], ...]
    outputs: Mapping[str, torch.dtype]
    returns: tuple[tuple[str, tuple[Any, ...]], ...]
    config: Mapping[str, Any] = field(default_factory=dict)  # the launch configuration, recorded
    # TileLang pass options the kernel needs (e.g. tl.disable_thread_storage_sync for a kernel that
    # places its own barriers).
    pass_configs: Mapping[str, Any] = field(default_factory=dict)
    derived: Callable[[Mapping[str, int]], Mapping[str, int]] | None = None

    def compile(self, device: torch.device, arch: str | None = None) -> Callable[..., Any]:
        """Compile and bind: the callable an implementation's build returns."""
        return self.bind(compile_kernel(self.prim_func, arch, self.pass_configs), device)

    def bind(self, kernel: Any, device: torch.device) -> BoundKernel:
        return BoundKernel(self, kernel, device)


class BoundKernel:
    """A compiled :class:`KernelSpec` as the callable an implementation's build returns:
    ``kernel(**inputs)`` checks the inputs' layout and sizes, allocates the outputs and launches;
    :meth:`prepare` does the checking and sizing once for calls of one signature (model code's
    hot path). ``config``: the launch configuration, which the runner records with each row."""

    def __init__(self, spec: KernelSpec, kernel: Any, device: torch.device):
        self.spec, self.device = spec, device
        self.config = dict(spec.config)
        self._launch = launcher(kernel, device, [shape for _, shape in spec.params])
        self._positions = {name: i for i, (name, _) in enumerate(spec.params)}
        self._inputs = [(i, name, shape) for i, (name, shape) in enumerate(spec.params) if name not in spec.outputs]
        self._prepared: dict[tuple, Callable[..., Any]] = {}

    def _sizes(self, shapes: Mapping[str, Sequence[int]]) -> dict[str, int]:
        """The named sizes inputs of ``shapes`` give (``derived`` ones too), every dim checked."""
        sizes: dict[str, int] = {}
        for _, name, shape in self._inputs:
            bind_sizes(name, tuple(shapes[name]), shape, sizes)
        if self.spec.derived is not None:
            sizes.update(self.spec.derived(sizes))
        return sizes

    def _returned(self, shapes: Mapping[str, Sequence[int]], sizes: Mapping[str, int]) -> list[tuple[int, list[int]]]:
        """(parameter position, shape) of each returned tensor, a leading ``...`` resolved."""
        first, first_shape = self._inputs[0][1], self._inputs[0][2]
        leading = list(shapes[first][:len(shapes[first]) - len(first_shape) + 1])
        return [(self._positions[name], leading + resolved(shape[1:], sizes) if shape[:1] == (...,)
                 else resolved(shape, sizes)) for name, shape in self.spec.returns]

    def __call__(self, **given: torch.Tensor) -> Any:
        for name, tensor in given.items():
            problem = layout_problem(tensor)
            if problem:
                raise ValueError(f"input {name!r} {problem}")
        signature = tuple((name, tuple(t.shape), t.dtype) for name, t in given.items())
        launch = self._prepared.get(signature)
        if launch is None:  # prepared once per signature: the runner calls one signature many times
            launch = self._prepared[signature] = self.prepare(
                tuple(given), {name: shape for name, shape, _ in signature}, {name: d for name, _, d in signature})
        return launch(*given.values())

    def prepare(self, names: Sequence[str], shapes: Mapping[str, Sequence[int]],
                dtypes: Mapping[str, torch.dtype] | None = None) -> Callable[..., Any]:
        """``launch(*tensors)`` for inputs named ``names`` (in that order) of ``shapes`` (and
        ``dtypes``): contiguous, 16-byte aligned (the caller checks). Outputs are allocated in the
        shape they are returned in, so nothing is viewed per call; like an input where they match
        it (``empty_like`` costs less host time than ``empty``)."""
        sizes = self._sizes(shapes)
        returned = dict(self._returned(shapes, sizes))
        outputs, dtypes = self.spec.outputs, dtypes or {}
        like = {(tuple(shapes[name]), dtypes.get(name)): names.index(name) for name in reversed(names)}
        slots = []  # per kernel parameter: the caller's tensor index, or how to allocate the output
        for i, (name, shape) in enumerate(self.spec.params):
            if name not in outputs:
                slots.append(names.index(name))
                continue
            needed = math.prod(resolved(shape, sizes))
            shape = tuple(returned.get(i, resolved(shape, sizes)))
            if math.prod(shape) != needed:  # a returned shape that does not hold what the kernel writes
                raise ValueError(f"output {name!r} would be {list(shape)}, the kernel writes {needed} elements")
            made = (shape, outputs[name])
            slots.append((like[made], None) if made in like else made)
        picks = list(returned)
        launch, device, values = self._launch.run, self.device, self._launch.sizes(sizes)
        empty, empty_like = torch.empty, torch.empty_like
        native = None
        if self._launch.entry is not None:
            native = NativeLaunch(self._launch.entry, tuple(slots), tuple(values), tuple(picks),
                                  self._launch.device, self._launch.stream)

        if slots == [*range(len(names)), (slots[-1][0], None)] and picks == [len(names)]:
            # The common kernel (the inputs in the caller's order, then one output like an input,
            # returned): its arguments built in one expression, a third of a microsecond less a call.
            like_input = slots[-1][0]

            def call_one(*tensors: torch.Tensor) -> Any:
                args = [*tensors, empty_like(tensors[like_input])]
                launch(args, values)
                return args[-1]

            call_one.native = native
            return call_one

        def call(*tensors: torch.Tensor) -> Any:
            args = [tensors[slot] if type(slot) is int else
                    empty_like(tensors[slot[0]]) if slot[1] is None else empty(slot[0], dtype=slot[1], device=device)
                    for slot in slots]
            launch(args, values)
            return args[picks[0]] if len(picks) == 1 else tuple(args[i] for i in picks)

        call.native = native
        return call


def resolved(shape: Sequence[int | str], sizes: Mapping[str, int]) -> list[int]:
    return [sizes[d] if isinstance(d, str) else d for d in shape]


def bind_sizes(name: str, dims: Sequence[int], shape: Sequence[int | str], sizes: dict[str, int]) -> None:
    """Record the sizes a tensor of ``dims`` gives ``shape``'s named dims in ``sizes`` (the first
    dim: its leading dims flattened), checking its fixed dims and the names already bound. A shape
    without names takes any tensor of as many elements (viewed to it)."""
    if not any(isinstance(d, str) for d in shape):
        if math.prod(dims) != math.prod(shape):
            raise ValueError(f"input {name!r} has shape {list(dims)}, the kernel takes {list(shape)}")
        return
    trailing = len(shape) - 1
    if len(dims) < trailing:
        raise ValueError(f"input {name!r} has {len(dims)} dims, the kernel takes at least {trailing}")
    actual = (math.prod(dims[:len(dims) - trailing]), *dims[len(dims) - trailing:])
    for want, got in zip(shape, actual):
        if isinstance(want, str):
            if sizes.setdefault(want, got) != got:
                raise ValueError(f"input {name!r} has {want} = {got} where another input has {sizes[want]}")
        elif want != got:
            raise ValueError(f"input {name!r} has shape {list(dims)}, the kernel takes {list(shape)}")


class Launcher(NamedTuple):
    """``run(tensors, sizes(named_sizes))`` runs a compiled kernel on its parameters (every one, in
    order; contiguous) with its launch sizes, on the current stream of its device. ``entry``: the
    address of the host library's C entry point ``run`` calls, where there is one, ``stream``, what
    it asks for that stream, and ``device``, the one it launches on, with its index (see
    :class:`NativeLaunch`)."""

    run: Callable[[Sequence[torch.Tensor], Any], None]
    sizes: Callable[[Mapping[str, int]], Any]
    entry: int | None = None
    stream: Callable[[int], int] | None = None
    device: torch.device | None = None


class NativeLaunch(NamedTuple):
    """What a prepared launch does, for a caller that makes the same C call itself (the functions'
    fast path, ``npuops._fastpath``): the entry point's address; per kernel parameter, the
    caller's tensor index, ``(index, None)`` (a new tensor like that one) or ``(shape, dtype)`` (a
    new one); the launch sizes; which parameters are returned; the device (with its index) and
    ``stream(index)``, the address of its current stream."""

    entry: int
    slots: tuple
    sizes: tuple[int, ...]
    returns: tuple[int, ...]
    device: torch.device
    stream: Callable[[int], int]


def launcher(kernel: Any, device: torch.device, shapes: Sequence[Sequence[int | str]]) -> Launcher:
    """How to launch ``kernel`` (see :class:`Launcher`). A kernel built
    by TileLang's cython backend is launched through its host library's C entry point (the
    tensors' addresses, the sizes, the stream): on the H200's host 20 us a call against 40 for
    TileLang's tvm-ffi wrapper. Others (the CPU target's) are called as
    TileLang calls them, each tensor viewed to the kernel's shape (``shapes``, sizes resolved)."""
    lib = getattr(getattr(kernel, "adapter", None), "lib", None)
    if lib is None or device.type != "cuda":
        def call(tensors, sizes):
            return kernel(*(t.view(resolved(shape, sizes)) for t, shape in zip(tensors, shapes)))

        return Launcher(call, lambda sizes: sizes)
    import ctypes

    dynamic = kernel.adapter.dynamic_symbolic_map
    entry = lib.call
    entry.argtypes = [ctypes.c_void_p] * len(kernel.params) + [
        ctypes.c_int64 if str(var.dtype) == "int64" else ctypes.c_int32 for var in dynamic] + [ctypes.c_void_p]
    entry.restype = ctypes.c_int
    current_stream = torch._C._cuda_getCurrentRawStream
    index = device.index if device.index is not None else torch.cuda.current_device()

    def launch(tensors: Sequence[torch.Tensor], sizes: Sequence[int]) -> None:
        status = entry(*[t.data_ptr() for t in tensors], *sizes, current_stream(index))
        if status:
            raise RuntimeError(f"kernel launch failed: {lib.get_last_error().decode()}")

    dims = _launch_dims(dynamic, shapes)
    return Launcher(launch, lambda sizes: [sizes[d] if isinstance(d, str) else d for d in dims],
                    ctypes.cast(entry, ctypes.c_void_p).value, current_stream, torch.device(device.type, index))


def _launch_dims(dynamic: Mapping[Any, tuple[int, int, int, int]], shapes: Sequence[Sequence[int | str]]) -> list:
    """The size (a named dim of ``shapes``, or a fixed one) of each size the host entry point takes,
    in its order: TileLang's ``dynamic_symbolic_map`` gives each one's source, (0 = a shape,
    parameter, dim, _), read from our own shapes by position. Not by the TIR variable's name: a
    macro argument that is a bare size variable (a channels-first output's ``batch * 1``) can
    rename it, and a kernel found in TileLang's cache keeps its own names."""
    dims = []
    for var, (kind, param, dim, _) in dynamic.items():
        if kind != 0:
            raise ValueError(f"the kernel takes {var} from a stride at launch; only sizes from shapes are supported")
        dims.append(shapes[param][dim])
    return dims


def tilelang_implementation(
    op_name: str,
    build: Callable[[Op, Workload, torch.device], Callable[..., Any]],
    supports: Callable[[Op, Workload], str | None] | None = None,
    name: str = "tilelang",
    description: str = "",
    variants: VariantsFn | None = None,
    key: KeyFn | None = None,
    launch_classes: LaunchClassesFn | None = None,
) -> Implementation:
    """An ``ours``-tier implementation whose ``build`` compiles TileLang kernels for a workload
    (usually ``lambda op, w, device: spec(op, w).compile(device)`` for a :class:`KernelSpec`)."""

    def why_not(op: Op, w: Workload, device: Device) -> str | None:
        return why_tilelang_cannot_run(device) or _dtype_without_kernels(w) or (supports(op, w) if supports else None)

    return Implementation(op_name, name, "ours", build, devices=("cuda",), supports=why_not,
                          description=description or "TileLang kernel, compiled per workload", variants=variants,
                          key=key, launch_classes=launch_classes)


def _build(op: KernelOp, w: Workload, device: torch.device, config: Mapping[str, Any] | None = None) -> Callable[..., Any]:
    return op.tilelang_build(w, device, config)


def kernel_implementations(ops: Mapping[str, Op], package: str, description: str) -> list[Implementation]:
    """The ``ours`` implementation of every :class:`~npuops.op.KernelOp` of ``package`` whose
    kernel takes at least one of its workloads (``description``: of those whose class gives none)."""
    return [
        tilelang_implementation(op.name, _build, supports=lambda op, w: op.kernel_unsupported(w),
                                description=op.kernel_description or description,
                                variants=lambda op, w: op.tilelang_variants(w), key=lambda op, w: op.kernel_key(w),
                                launch_classes=lambda op, w: op.kernel_launch_classes(w))
        for op in ops.values()
        if isinstance(op, KernelOp) and type(op).__module__.startswith(f"{package}.")
        and any(op.kernel_unsupported(w) is None for w in op.workloads)
    ]
