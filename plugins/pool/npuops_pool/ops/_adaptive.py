"""Adaptive pooling (``F.adaptive_{avg,max}_pool2d``): the shared op base.

Output position ``i`` of a dim of input length ``n`` pooled to ``m`` reduces the input interval
``[floor(i * n / m), ceil((i + 1) * n / m))``: windows of uneven length that may overlap and
together cover the whole input.
"""

import math
from collections.abc import Callable
from typing import ClassVar

from npuops import Param, WorkloadError

from ._pooling import Axis, PoolOp, shape_params


def adaptive_window(i: int, size: int, out: int) -> tuple[int, int]:
    """[start, end) of output position ``i``'s window along a dim of ``size`` pooled to ``out``."""
    return (i * size) // out, -((-(i + 1) * size) // out)


def adaptive_params(spatial_dims: int) -> dict[str, Param]:
    return {
        **shape_params(spatial_dims),
        "output_size": Param(
            None,
            f"output spatial size (required): an int or {spatial_dims} values, None keeping that input size",
            types=(int, tuple),
        ),
    }


class AdaptivePoolOp(PoolOp):
    """Base of the adaptive pooling ops; ``torch_pool`` (a staticmethod) is the PyTorch function,
    called with the input and the op's params (``output_size``, ``return_indices``) by name."""

    torch_pool: ClassVar[Callable]

    def output_size(self, w, cfg) -> tuple[int, ...]:
        where = f"{self.name} {w.id}"
        value, dims = cfg["output_size"], self.spatial_dims
        sizes = (value,) * dims if isinstance(value, int) or value is None else tuple(value)
        if value is None or len(sizes) != dims or not all(
            s is None or (isinstance(s, int) and not isinstance(s, bool) and s >= 1) for s in sizes
        ):
            raise WorkloadError(
                f"{where}: param 'output_size' = {value!r} must be a positive int or a list of {dims} (positive ints or null)"
            )
        return tuple(n if s is None else s for s, n in zip(sizes, self.spatial_in(w), strict=True))

    def axes(self, w, cfg):
        return tuple(
            # The windows' lengths add up to size + out - gcd (they overlap by one wherever an
            # edge i * size / out is not whole): O(1), not a loop over the outputs.
            Axis(out, size + out - math.gcd(size, out))
            for size, out in zip(self.spatial_in(w), self.output_size(w, cfg), strict=True)
        )

    def pooling(self, w):
        from ..pool_kernel import Pooling

        cfg = self.config(w)
        return Pooling(self.reduction, self.spatial_in(w), self.output_size(w, cfg), adaptive=True)

    def torch_impl(self, w):
        cfg = self.config(w)
        pool = self.torch_pool
        kwargs = {**self.pool_settings(cfg), "output_size": self.output_size(w, cfg)}

        def adaptive_pool(input):
            return pool(input, **kwargs)

        return adaptive_pool
