"""The pool kernel that takes its sizes at launch against the kernels built per shape, by kernel
time on the GPU: whether the one-build-per-key default (``sizes_at_launch``) may stay the default.

For every sliding-window catalog workload of the pool ops, a 20-size ``max_pool2d`` sweep (3x3,
stride 2, padding 1, bf16, H = W from 7 to 300, batches and channels varying) and a few
off-catalog shapes: both kernels pass the correctness gate, then each is timed
(``npuops.timing.kernel_time``: CUPTI spans, L2 flushed and the GPU held before each call, eager
regime). ``shape`` is the per-shape kernels' default launch (the first of ``shape_variants``),
``sized`` the sizes-at-launch kernel's default launch; ``ratio`` = shape / sized (above 1: the sizes-at-launch
kernel is faster). Also counts the sized builds (distinct kernel keys) the sweep took.

    python scripts/bench-pool-sizes-at-launch.py --out pool-sizes-at-launch.json   # on a CUDA machine

``npuops run --family pool --tune --kernel-time`` compares every launch (both sized row classes
and every per-shape variant) on the catalog as the product does.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path

import torch

from npuops import InputRNG
from npuops.check import check
from npuops.registry import load_registry
from npuops.timing import kernel_time

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins" / "pool" / "tests"))
from test_pool import make_workload  # noqa: E402
from test_pool_sizes_at_launch import STEM, sweep  # noqa: E402

OFF_CATALOG = [  # odd windows and sizes, few planes, 1-d and 3-d
    ("MaxPool2dFwd", (1, 3, 224, 224), "bf16", dict(kernel_size=3, stride=2, padding=1)),
    ("MaxPool2dFwd", (16, 96, 55, 55), "f16", dict(kernel_size=3, stride=2)),
    ("MaxPool2dFwd", (8, 128, 63, 63), "bf16", dict(kernel_size=5, stride=1, padding=2)),
    ("AvgPool2dFwd", (8, 256, 29, 29), "bf16", dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    ("MaxPool1dFwd", (4, 64, 10001), "bf16", dict(kernel_size=3, stride=2, padding=1)),
    ("MaxPool3dFwd", (2, 64, 17, 57, 57), "bf16", dict(kernel_size=3, stride=2, padding=1)),
]


def workloads(registry):
    for name in sorted(n for n, op in registry.ops.items() if op.family == "pool"):
        for w in registry.op(name).workloads:
            yield "catalog", w
    for w in sweep("MaxPool2dFwd", STEM):
        yield "sweep", w
    for op_name, shape, dtype, params in OFF_CATALOG:
        yield "off-catalog", make_workload(op_name, shape, dtype, **params)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="pool-sizes-at-launch.json")
    parser.add_argument("--iterations", type=int, default=30)
    args = parser.parse_args()

    from npuops_pool.pool_kernel import shape_variants

    registry = load_registry(strict=True)
    device = registry.device("cuda")
    rows, keys = [], set()
    for group, w in workloads(registry):
        op = registry.op(w.op)
        impl = registry.implementation(w.op, "tilelang")
        variants = op.tilelang_variants(w)
        if op.kernel_unsupported(w) or variants[0]["kernel"] != "sizes_at_launch":
            continue  # adaptive, global and too-large grids keep the per-shape kernels alone
        if group == "sweep":
            keys.add(op.kernel_key(w))
        launches = {"sized": variants[0], "shape": shape_variants(op.pooling(w), w.dtype_of("input"))[0]}
        inputs = op.make_inputs(w, InputRNG(device.torch_device(), 1))
        row = {"group": group, "op": w.op, "id": w.id, "dtype": w.dtype, "shape": w.shapes["input"],
               "params": {k: v for k, v in w.params.items() if k not in ("N", "C", "L_in", "D_in", "H_in", "W_in")}}
        for name, config in launches.items():
            fn = impl.build(op, w, device.torch_device(), config=config)
            result = check(op, w, fn, device, seed=7)
            timed = kernel_time(lambda fn=fn: fn(**inputs), device, "eager", args.iterations)
            row[name] = {"config": dict(fn.config), "ok": result.ok, "detail": result.detail,
                         "us": timed.median_ms * 1e3 if timed else None}
        row["ratio"] = row["shape"]["us"] / row["sized"]["us"]
        rows.append(row)
        print(f"{group:11} {w.op:13} {w.id:3} {str(w.shapes['input']):22} {w.dtype:4} shape {row['shape']['us']:8.2f} us "
              f"({row['shape']['config']['kernel']})  sized {row['sized']['us']:8.2f} us  ratio {row['ratio']:.2f}"
              f"{'' if row['sized']['ok'] and row['shape']['ok'] else '  GATE FAILED'}", flush=True)
    summary = {group: {"n": len(r), "geomean_ratio": statistics.geometric_mean([x["ratio"] for x in r]),
                       "sized_slower_than_0.95": sum(x["ratio"] < 0.95 for x in r)}
               for group in ("catalog", "sweep", "off-catalog") if (r := [x for x in rows if x["group"] == group])}
    summary["sweep_builds"] = len(keys)
    print(json.dumps(summary, indent=1))
    Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "host": platform.node(),
                                          "summary": summary, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
