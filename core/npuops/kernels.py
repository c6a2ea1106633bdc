"""TileLang support shared by the family plugins: whether kernels can run, the compile target, and
the implementation wrapper that turns an op's kernel description into a checked, timed callable.

TileLang is imported lazily: the core and the plugins load (and list, and run baselines) without it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from .impl import Implementation, VariantsFn

if TYPE_CHECKING:
    from .devices import Device
    from .op import Op
    from .workload import Workload

MIN_CAPABILITY = (8, 0)
# The SMs of the GPU the launch rules were measured on (the H200): kernels size grids and waves by it.
H200_SMS = 132
TILELANG_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32",
                   torch.int8: "int8", torch.int32: "int32", torch.float8_e4m3fn: "float8_e4m3"}


def tilelang_dtype(dtype: torch.dtype) -> str:
    return TILELANG_DTYPES[dtype]


def cuda_target(arch: str | None = None) -> dict[str, str]:
    """TileLang's target as a JSON dict (the string form is rejected). The arch: as given, else
    NPUOPS_CUDA_ARCH (e.g. ``sm_90``: CPU-only machines compile the kernels a GPU run would, into
    TileLang's cache, see scripts/warm-kernel-cache.py), else the current GPU's."""
    arch = arch or os.environ.get("NPUOPS_CUDA_ARCH")
    if arch is None:
        major, minor = torch.cuda.get_device_capability()
        arch = f"sm_{major}{minor}"
    return {"kind": "cuda", "arch": arch}


CPU_TARGET = {"kind": "c"}


def compile_kernel(prim_func: Any, arch: str | None = None, pass_configs: Mapping[str, Any] | None = None,
                   target: Mapping[str, str] | None = None) -> Any:
    """Compile a TileLang prim_func for CUDA (TileLang caches the result on disk). ``target=CPU_TARGET``
    builds kernels written with tile-level operators only for the host instead, which lets tests
    check their logic on machines without a GPU."""
    import tilelang
    import tvm

    target = dict(target) if target else cuda_target(arch)
    if target["kind"] != "cuda":
        prim_func = single_thread_layouts(prim_func)
    with tvm.target.Target(target):  # lowering needs the target as context without a GPU
        return tilelang.compile(prim_func, target=target, pass_configs=dict(pass_configs or {}))


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


# The kernel prelude (``T.Kernel(prelude=...)``) :func:`load_vectors_evict_last` needs: a 16-byte
# global load whose L2 lines are evicted after all others (PTX ``evict_last``, as Triton lowers
# ``eviction_policy="evict_last"``). Rows read once and streamed so ran 3-4% faster on the H200
# (FusedAddRMSNorm 2048 x 16384: Triton in benchmarks/h200-s21-triton-far-probe, ours in
# h200-s21-evict-probe), presumably because the dirty output lines then leave the L2 first (not
# probed). The lines keep that priority after the kernel, until evicted: the timing protocol resets
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


@dataclass(frozen=True)
class KernelSpec:
    """One compiled-per-workload kernel and how the op's inputs map onto it.

    ``params`` are the kernel's parameters in order, each with the shape the kernel declares (op
    inputs are viewed to it, which never copies a contiguous tensor). Those in ``outputs`` are
    allocated per call; the rest are op inputs (possibly updated in place). ``returns`` names what
    the op returns, each viewed to the given shape.
    """

    prim_func: Any
    params: tuple[tuple[str, tuple[int, ...]], ...]
    outputs: Mapping[str, torch.dtype]
    returns: tuple[tuple[str, tuple[int, ...]], ...]
    config: Mapping[str, Any] = field(default_factory=dict)  # the launch configuration, recorded
    # TileLang pass options the kernel needs (e.g. tl.disable_thread_storage_sync for a kernel that
    # places its own barriers).
    pass_configs: Mapping[str, Any] = field(default_factory=dict)

    def compile(self, device: torch.device, arch: str | None = None) -> Callable[..., Any]:
        """Compile and bind: the callable an implementation's build returns."""
        return self.bind(compile_kernel(self.prim_func, arch, self.pass_configs), device)

    def bind(self, kernel: Any, device: torch.device) -> Callable[..., Any]:
        shapes = dict(self.params)
        order = [name for name, _ in self.params]
        outputs = dict(self.outputs)

        def call(**inputs: torch.Tensor) -> Any:
            args = {}
            for name in order:
                if name in outputs:
                    args[name] = torch.empty(shapes[name], dtype=outputs[name], device=device)
                else:
                    tensor = inputs[name]
                    problem = layout_problem(tensor)
                    if problem:
                        raise ValueError(f"input {name!r} {problem}")
                    args[name] = tensor.view(shapes[name])
            kernel(*(args[name] for name in order))
            result = tuple(args[name].view(shape) for name, shape in self.returns)
            return result[0] if len(result) == 1 else result

        call.config = dict(self.config)  # the runner records it with each row
        return call


def tilelang_implementation(
    op_name: str,
    build: Callable[[Op, Workload, torch.device], Callable[..., Any]],
    supports: Callable[[Op, Workload], str | None] | None = None,
    name: str = "tilelang",
    description: str = "",
    variants: VariantsFn | None = None,
) -> Implementation:
    """An ``ours``-tier implementation whose ``build`` compiles TileLang kernels for a workload
    (usually ``lambda op, w, device: spec(op, w).compile(device)`` for a :class:`KernelSpec`)."""

    def why_not(op: Op, w: Workload, device: Device) -> str | None:
        return why_tilelang_cannot_run(device) or (supports(op, w) if supports else None)

    return Implementation(op_name, name, "ours", build, devices=("cuda",), supports=why_not,
                          description=description or "TileLang kernel, compiled per workload", variants=variants)


def _build(op: Op, w: Workload, device: torch.device, config: Mapping[str, Any] | None = None) -> Callable[..., Any]:
    return op.tilelang_build(w, device) if config is None else op.tilelang_build(w, device, config)


def _variants(op: Op, w: Workload) -> Sequence[Mapping[str, Any]]:
    return op.tilelang_variants(w)


def kernel_implementations(ops: Mapping[str, Op], package: str, description: str) -> list[Implementation]:
    """The ``ours`` implementation of every op of ``package`` that defines ``tilelang_build(w,
    device)`` (and ``kernel_unsupported(w)``, None where its kernel takes ``w``) and whose kernel
    covers at least one of its workloads. Ops that also define ``tilelang_variants(w)`` (launch
    configurations, the default first) take ``tilelang_build(w, device, config)`` for each."""
    return [
        tilelang_implementation(op.name, _build, supports=lambda op, w: op.kernel_unsupported(w),
                                description=getattr(op, "kernel_description", description),
                                variants=_variants if callable(getattr(op, "tilelang_variants", None)) else None)
        for op in ops.values()
        if type(op).__module__.startswith(f"{package}.") and hasattr(op, "tilelang_build")
        and any(op.kernel_unsupported(w) is None for w in op.workloads)
    ]
