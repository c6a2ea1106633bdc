"""Cost model shared by the norms whose least DRAM traffic is one read of every input and one write
of every output (the row-wise norms, L1/L2 normalize, weight and spectral norm)."""

import dataclasses
import math

from npuops import Cost, KernelOp

from ..rowwise_kernel import RowNorm, rowwise_unsupported


class SinglePassNormOp(KernelOp):
    """Bytes come from the core's meta run of the inputs and the torch formulation, so byte counts
    cannot drift from what the op moves."""

    family = "norm"
    flops_per_element = 4  # useful FLOPs per element of the workload's ``x``
    kernel_description = "TileLang row kernel: one block per row, the row held in registers"

    def flops(self, w) -> int:
        return self.flops_per_element * math.prod(w.shapes["x"])

    def cost(self, w):
        return Cost(bytes=self.io_bytes(w), flops=self.flops(w))

    def row_norm(self, w) -> RowNorm | None:
        """What our TileLang row kernel does for ``w``; None where this op has no kernel."""
        return None

    def kernel_unsupported(self, w) -> str | None:
        """Why the row kernel cannot run ``w`` (None: it can)."""
        spec = self.row_norm(w)
        if spec is None:
            return f"{self.name} has no TileLang kernel yet"
        return rowwise_unsupported(spec, w.shapes["x"], w.dtype_of("x"))

    def kernel_samples(self, w) -> int:
        return 1

    def kernel_key(self, w):
        from ..rowwise_kernel import launch_key

        return launch_key(self.row_norm(w), w.shapes["x"], w.dtype_of("x"), self.kernel_samples(w))

    def kernel_launch_classes(self, w):
        """``w`` with a row count of each row class (x as [rows, hidden], the tensors shaped as x
        likewise); none where rows are split in samples or segments, or another tensor has rows of
        its own (QK norm's k)."""
        from ..rowwise_kernel import class_row_counts

        shape = tuple(w.shapes["x"])
        spec = self.row_norm(w)
        if spec is None or spec.segments > 1 or self.kernel_samples(w) > 1 or any(
                len(s) == len(shape) and tuple(s) != shape for s in w.shapes.values()):
            return ()
        return [dataclasses.replace(w, shapes={name: (rows, shape[-1]) if tuple(s) == shape else s
                                               for name, s in w.shapes.items()})
                for rows in class_row_counts()]

    def tilelang_variants(self, w):
        from ..rowwise_kernel import launch_variants

        return launch_variants(self.row_norm(w), w.shapes["x"], w.dtype_of("x"))

    def tilelang_build(self, w, device, config=None):
        """Our kernel for ``w`` (with a launch ``config`` from ``tilelang_variants``, or the launch
        rule's) as the callable the runner checks and times."""
        from ..rowwise_kernel import rowwise_kernel

        spec = rowwise_kernel(self.row_norm(w), w.shapes["x"], w.dtype_of("x"), samples=self.kernel_samples(w),
                              **(config or {}))
        return spec.compile(device)
