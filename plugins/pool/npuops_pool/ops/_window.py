"""Sliding-window pooling (``F.avg_pool{1,2,3}d``, ``F.max_pool{1,2,3}d``): the shared op bases.

A concrete op names its PyTorch function (``torch_pool``, a staticmethod), its ``spatial_dims``
and its params; every param besides the shape restatements is passed to ``torch_pool`` by name.
"""

from collections.abc import Callable
from typing import ClassVar

from npuops import Param, WorkloadError

from ._pooling import EXACT, RETURN_INDICES, SPATIAL_NAMES, PoolOp, window_axes, window_geometry, window_params


def avg_pool_params(spatial_dims: int) -> dict[str, Param]:
    params = {
        **window_params(spatial_dims),
        "count_include_pad": Param(True, "divide by the window size including padding (not past it)", types=(bool,)),
    }
    if spatial_dims > 1:  # F.avg_pool1d has no divisor_override
        params["divisor_override"] = Param(None, "divide every window sum by this instead (nonzero)", types=(int,))
    return params


def max_pool_params(spatial_dims: int) -> dict[str, Param]:
    return {
        **window_params(spatial_dims),
        "dilation": Param(1, "spacing between window taps: an int or one per spatial dim", types=(int, tuple)),
        "return_indices": RETURN_INDICES,
    }


class WindowPoolOp(PoolOp):
    """Base of the sliding-window pooling ops; ``torch_pool`` is the PyTorch function."""

    torch_pool: ClassVar[Callable]

    def axes(self, w, cfg):
        where = f"{self.name} {w.id}"
        if cfg.get("divisor_override") == 0:
            raise WorkloadError(f"{where}: param 'divisor_override' must be nonzero (or absent)")
        return window_axes(where, cfg, self.spatial_in(w), SPATIAL_NAMES[self.spatial_dims])

    def pooling(self, w):
        from ..pool_kernel import Pooling

        cfg = self.config(w)
        geometry = window_geometry(self.name, cfg, self.spatial_dims)
        return Pooling(self.reduction, self.spatial_in(w), tuple(axis.out for axis in self.axes(w, cfg)),
                       geometry["kernel_size"], geometry["stride"], geometry["padding"], geometry["dilation"],
                       count_include_pad=cfg.get("count_include_pad", True),
                       divisor_override=cfg.get("divisor_override"), ceil_mode=cfg["ceil_mode"])

    def pool_kwargs(self, cfg) -> dict:
        """Everything ``torch_pool`` takes besides the input, the geometry as per-dim tuples."""
        geometry = window_geometry(self.name, cfg, self.spatial_dims)
        return {name: geometry.get(name, value) for name, value in self.pool_settings(cfg).items()}

    def torch_impl(self, w):
        pool, kwargs = self.torch_pool, self.pool_kwargs(self.config(w))

        def window_pool(input):
            return pool(input, **kwargs)

        return window_pool


class MaxPoolOp(WindowPoolOp):
    """Base of ``MaxPool{1,2,3}dFwd``."""

    tolerances = EXACT
    reduction = "max"
