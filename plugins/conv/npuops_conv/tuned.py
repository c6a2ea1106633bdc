"""Launch configs chosen by ``npuops run --tune``, kept with the plugin as data, so that a user's run
needs no tuning: ``tuned_launches.json`` maps a convolution problem (:func:`problem_key`: dtype,
epilogue and every size, the batch included) to the :class:`~npuops_conv.conv_kernel.ConvLaunch`
fields its tuning chose, for the forward convolutions and the gradients (data and weight) alike.
Problems not in it (other shapes, other batch sizes) take the launch rule.

Refresh the table from a tuned results file (rows of tier ``ours`` that record a tuning)::

    npuops run --family conv --impl tilelang --tune --out tuned.jsonl
    python -m npuops_conv.tuned tuned.jsonl -o plugins/conv/npuops_conv/tuned_launches.json
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
from collections.abc import Iterable, Mapping
from importlib.resources import files
from pathlib import Path
from typing import Any

import torch
from npuops import dtype_name

from .ops._geometry import ConvGeometry

TABLE = "tuned_launches.json"


FORWARD, DGRAD, DGRAD_BIAS, WGRAD = "forward", "dgrad", "dgrad+bias", "wgrad"  # what is computed of a conv


def problem_key(geometry: ConvGeometry, dtype: torch.dtype, relu: bool = False, kind: str = FORWARD) -> str:
    """The table's key of a convolution problem: "bf16 relu N8 64>128 56x56 k3x3 s1x1 p1x1/1x1 d1x1
    g1 bias" for the forward conv, the gradients' led by their ``kind`` ("dgrad+bias ...": a
    data gradient with a bias added, Conv2dTranspose's)."""
    g = geometry

    def dims(values):
        return "x".join(map(str, values))

    return " ".join([*([kind] if kind != FORWARD else []), dtype_name(dtype), *(["relu"] if relu else []), f"N{g.batch}",
                     f"{g.in_channels}>{g.out_channels}",
                     dims(g.in_size), f"k{dims(g.kernel)}", f"s{dims(g.stride)}",
                     f"p{dims(g.pad_before)}/{dims(g.pad_after)}", f"d{dims(g.dilation)}", f"g{g.groups}",
                     *(["bias"] if g.bias else [])])


@functools.cache
def tuned_launches() -> Mapping[str, Mapping[str, Any]]:
    return json.loads((files(__package__) / TABLE).read_text())


def tuned_launch(geometry: ConvGeometry, dtype: torch.dtype, relu: bool = False, kind: str = FORWARD):
    """The launch tuning chose for the problem (a ``ConvLaunch``), or None where the table has none."""
    from .conv_kernel import ConvLaunch

    tuned = tuned_launches().get(problem_key(geometry, dtype, relu, kind))
    return ConvLaunch(**tuned) if tuned else None


def op_problem_key(op, w) -> str | None:
    """The table's key of workload ``w`` of the conv op ``op`` (None: an op with no kernel of ours)."""
    from .ops._backward import DataGradientKernel, WeightGradientKernel
    from .ops._forward import ForwardConvOp

    if isinstance(op, ForwardConvOp):
        return problem_key(op.geometry(w), w.dtype_of("input"), op.fused_relu)
    if isinstance(op, DataGradientKernel):
        return problem_key(op.geometry(w), w.dtype_of("input"), kind=DGRAD_BIAS if op.kernel_bias(w) else DGRAD)
    if isinstance(op, WeightGradientKernel):
        return problem_key(op.geometry(w), w.dtype_of("input"), kind=WGRAD)
    return None


def launches_from_results(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The table of the tuned ``ours`` rows of convolutions and their gradients among ``rows``:
    each problem's chosen launch (the row's config, kept to the launch fields)."""
    from npuops import load_registry

    from .conv_kernel import ConvLaunch

    registry, fields = load_registry(), {f.name for f in dataclasses.fields(ConvLaunch)}
    table = {}
    for row in rows:
        if row.get("tier") != "ours" or row.get("status") != "ok" or not row.get("tuning"):
            continue
        op = registry.op(row["op"])
        key = op_problem_key(op, op.workload(row["workload"]))
        if key is not None:
            table[key] = {name: value for name, value in row["config"].items() if name in fields}
    return dict(sorted(table.items()))


def main(argv: list[str] | None = None) -> int:
    from npuops import read_results

    parser = argparse.ArgumentParser(prog="python -m npuops_conv.tuned", description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="results files of tuned runs (later files win)")
    parser.add_argument("-o", "--out", required=True, help="the table to write (tuned_launches.json)")
    args = parser.parse_args(argv)
    table: dict[str, dict[str, Any]] = {}
    for path in args.results:
        table.update(launches_from_results(read_results(path).rows))
    Path(args.out).write_text(json.dumps(dict(sorted(table.items())), indent=1) + "\n")
    print(f"{len(table)} tuned launches -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
