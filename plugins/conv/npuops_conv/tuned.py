"""Launch configs chosen by ``npuops run --tune``, kept with the plugin as data, so that a user's run
needs no tuning: ``tuned_launches.json`` maps a convolution problem (:func:`problem_key`: dtype,
epilogue and every size, the batch included) to the :class:`~npuops_conv.conv_kernel.ConvLaunch`
fields its tuning chose. Problems not in it (other shapes, other batch sizes) take the launch rule.

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


def problem_key(geometry: ConvGeometry, dtype: torch.dtype, relu: bool) -> str:
    """The table's key of a convolution problem: "bf16 relu N8 64>128 56x56 k3x3 s1x1 p1x1/1x1 d1x1
    g1 bias"."""
    g = geometry

    def dims(values):
        return "x".join(map(str, values))

    return " ".join([dtype_name(dtype), *(["relu"] if relu else []), f"N{g.batch}", f"{g.in_channels}>{g.out_channels}",
                     dims(g.in_size), f"k{dims(g.kernel)}", f"s{dims(g.stride)}",
                     f"p{dims(g.pad_before)}/{dims(g.pad_after)}", f"d{dims(g.dilation)}", f"g{g.groups}",
                     *(["bias"] if g.bias else [])])


@functools.cache
def tuned_launches() -> Mapping[str, Mapping[str, Any]]:
    return json.loads((files(__package__) / TABLE).read_text())


def tuned_launch(geometry: ConvGeometry, dtype: torch.dtype, relu: bool) -> Mapping[str, Any] | None:
    return tuned_launches().get(problem_key(geometry, dtype, relu))


def launches_from_results(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The table of the tuned ``ours`` rows of forward convolutions among ``rows``: each problem's
    chosen launch (the row's config, kept to the launch fields)."""
    from npuops import load_registry

    from .conv_kernel import ConvLaunch
    from .ops._forward import ForwardConvOp

    registry, fields = load_registry(), {f.name for f in dataclasses.fields(ConvLaunch)}
    table = {}
    for row in rows:
        if row.get("tier") != "ours" or row.get("status") != "ok" or not row.get("tuning"):
            continue
        op = registry.op(row["op"])
        if not isinstance(op, ForwardConvOp):
            continue
        w = op.workload(row["workload"])
        key = problem_key(op.geometry(w), w.dtype_of("input"), op.fused_relu)
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
