"""What model code pays per call: every public function of the norm, pool and top-k families
against its torch equivalent, on every catalog workload, launched back to back with no hold.

For each (function, workload): ``host`` is the Python time to issue one call (the loop's time
before the final synchronize, over the calls), ``call`` the wall time per call including that
synchronize (max of host and device time, roughly: what an eager model sees). Then the first call
of new shapes: ``rms_norm`` over 100 distinct row counts (1 to 16384, 4096 wide, bf16) and
``max_pool2d`` over 20 image sizes with one window, counting the kernels built.

    python scripts/bench-functions.py --out results.json [--profile]   # on a CUDA machine
    python scripts/bench-functions.py --out l2.json --op L2NormFwd,L1NormFwd   # some ops' rows only

``--profile`` first runs cProfile over many calls of a few functions whose kernels are short (where
a call is host-bound) and keeps each table: where a call's host time goes.

Not a test: it times. The JSON holds every figure, rewritten whole after each row (a run cut
short keeps the rows it measured); the table printed last summarizes.
"""

from __future__ import annotations

import argparse
import cProfile
import inspect
import io
import json
import platform
import pstats
import statistics
import time

import torch
import torch.nn.functional as F

import npuops_norm
import npuops_pool
import npuops_topk
from npuops import InputRNG, native
from npuops.files import replaced
from npuops.functional import built_kernels, coverage, finish_builds, reset_coverage
from npuops.registry import load_registry

FAMILIES = ("norm", "pool", "topk")
PROFILED = (("RMSNormFwd", "W4"), ("AvgPool2dFwd", "W1"), ("MaxPool2dFwd", "W1"))  # short kernels: host-bound
DROP_INS = {  # op -> (ours, torch's), each called with the op's inputs and config
    "RMSNormFwd": (lambda i, c: npuops_norm.rms_norm(i["x"], i["x"].shape[-1:], i["weight"], c["eps"]),
                   lambda i, c: F.rms_norm(i["x"], i["x"].shape[-1:], i["weight"], c["eps"])),
    "LayerNormFwd": (lambda i, c: npuops_norm.layer_norm(i["x"], i["x"].shape[-1:], i["weight"], i["bias"], c["eps"]),
                     lambda i, c: F.layer_norm(i["x"], i["x"].shape[-1:], i["weight"], i["bias"], c["eps"])),
    "L2NormFwd": (lambda i, c: npuops_norm.normalize(i["x"], 2.0, c["dim"], c["eps"]),
                  lambda i, c: F.normalize(i["x"], 2.0, c["dim"], c["eps"])),
    "L1NormFwd": (lambda i, c: npuops_norm.normalize(i["x"], 1.0, c["dim"], c["eps"]),
                  lambda i, c: F.normalize(i["x"], 1.0, c["dim"], c["eps"])),
}
OP_FUNCTIONS = {  # ops with no torch function: ours against the op's torch formulation
    "GemmaRMSNormFwd": npuops_norm.gemma_rms_norm, "GroupRMSNormFwd": npuops_norm.group_rms_norm,
    "FusedAddRMSNormFwd": npuops_norm.fused_add_rms_norm, "FusedAddLayerNormFwd": npuops_norm.fused_add_layer_norm,
    "RMSNormQuantFwd": npuops_norm.rms_norm_quant, "LayerNormQuantFwd": npuops_norm.layer_norm_quant,
    "QKNormFwd": npuops_norm.qk_norm, "AdaLayerNormFwd": npuops_norm.ada_layer_norm,
    "WeightNormFwd": npuops_norm.weight_norm, "TopkSelectorFwd": npuops_topk.topk_selector,
}
POOLS = {  # op -> (ours, torch's): F's signature, called with the workload's F arguments
    "MaxPool1dFwd": (npuops_pool.max_pool1d, F.max_pool1d), "MaxPool2dFwd": (npuops_pool.max_pool2d, F.max_pool2d),
    "MaxPool3dFwd": (npuops_pool.max_pool3d, F.max_pool3d), "AvgPool1dFwd": (npuops_pool.avg_pool1d, F.avg_pool1d),
    "AvgPool2dFwd": (npuops_pool.avg_pool2d, F.avg_pool2d), "AvgPool3dFwd": (npuops_pool.avg_pool3d, F.avg_pool3d),
    "AdaptiveAvgPool2dFwd": (npuops_pool.adaptive_avg_pool2d, F.adaptive_avg_pool2d),
    "AdaptiveMaxPool2dFwd": (npuops_pool.adaptive_max_pool2d, F.adaptive_max_pool2d),
}


def calls(op, w, inputs):
    """(ours, torch's) as callables of no arguments for workload ``w``."""
    cfg = op.config(w)
    if op.name in DROP_INS:
        ours, theirs = DROP_INS[op.name]
        return (lambda: ours(inputs, cfg)), (lambda: theirs(inputs, cfg))
    if op.name in POOLS:
        ours, theirs = POOLS[op.name]
        names = inspect.signature(ours).parameters
        args = {k: v for k, v in cfg.items() if k in names and k != "input"}
        return (lambda: ours(inputs["input"], **args)), (lambda: theirs(inputs["input"], **args))
    fn = OP_FUNCTIONS[op.name]
    tensors = [inputs[n] for n in fn.fn.inputs]
    params = [cfg[p] for p, _ in fn.fn.params]
    formulation = op.torch_impl(w)
    return (lambda: fn(*tensors, *params)), (lambda: formulation(**inputs))


def settled(fn, device):
    """``fn`` called once, then the builds that call started behind it done (a new kernel key
    builds its other launch classes in a thread, whose compiling would hold the GIL against the
    calls measured) and the device idle."""
    fn()
    finish_builds()
    torch.cuda.synchronize(device)


def per_call(fns, device, reps=7):
    """[(host µs, call µs) per call] of each of ``fns``: medians over ``reps`` loops of
    back-to-back calls, once each is :func:`settled`; the functions' loops alternate, so that a
    change in the host's speed during the run (other processes, clock) falls on each alike."""
    counts = []
    for fn in fns:
        settled(fn, device)
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize(device)
        one = time.perf_counter() - start
        counts.append(max(5, min(300, int(3e-3 / max(one, 1e-6)))))
    hosts, walls = [[] for _ in fns], [[] for _ in fns]
    for _ in range(reps):
        for i, (fn, count) in enumerate(zip(fns, counts, strict=True)):
            start = time.perf_counter()
            for _ in range(count):
                fn()
            issued = time.perf_counter()
            torch.cuda.synchronize(device)
            done = time.perf_counter()
            hosts[i].append((issued - start) / count * 1e6)
            walls[i].append((done - start) / count * 1e6)
    return [(statistics.median(h), statistics.median(w)) for h, w in zip(hosts, walls, strict=True)]


def first_calls(name, shapes, make, device):
    """First-call wall time (ms) of each shape and the kernels built doing them."""
    before = built_kernels()
    times = []
    for shape in shapes:
        fn = make(shape)
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
    during = built_kernels() - before
    finish_builds()  # the launch classes the calls started building behind them
    result = {"function": name, "shapes": len(shapes), "built": built_kernels() - before, "built_during_calls": during,
              "first_call_ms": {"max": max(times), "median": statistics.median(times), "first": times[0]},
              "times_ms": times}
    print(f"{name}: {len(shapes)} new shapes built {result['built']} kernels ({during} of them by the time the "
          f"calls ended); first call max {max(times):.1f} ms, median {statistics.median(times):.2f} ms", flush=True)
    return result


def new_shapes(device, families):
    rng = torch.Generator().manual_seed(0)
    rows = sorted({1, 16384, *torch.randint(1, 16385, (200,), generator=rng).tolist()})
    rows = [1, 16384, *[r for r in rows if r not in (1, 16384)][:98]]
    weight = torch.randn(4096, device=device, dtype=torch.bfloat16)

    def norm_call(r):
        x = torch.randn(r, 4096, device=device, dtype=torch.bfloat16)
        return lambda: npuops_norm.rms_norm(x, (4096,), weight, 1e-6)

    sizes = [20 + 12 * i for i in range(20)]

    def pool_call(s):
        x = torch.randn(8, 64, s, s, device=device, dtype=torch.bfloat16)
        return lambda: npuops_pool.max_pool2d(x, 3, 2, 1)

    return [first_calls("rms_norm", rows, norm_call, device) if "norm" in families else None,
            first_calls("max_pool2d", sizes, pool_call, device) if "pool" in families else None]


def profile(registry, device, calls_each=20000, top=18) -> dict[str, str]:
    """cProfile of back-to-back calls of one workload per op of PROFILED (ours), once
    :func:`settled`: where the host time of a call goes, by function (the table, as text)."""
    profiles = {}
    for name, wid in PROFILED:
        op = registry.op(name)
        w = op.workload(wid)
        inputs = op.make_inputs(w, InputRNG(device, seed=1))
        ours, _ = calls(op, w, inputs)
        settled(ours, device)
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(calls_each):
            ours()
        profiler.disable()
        torch.cuda.synchronize(device)
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
        profiles[f"{name} {wid}"] = text.getvalue()
        print(f"-- {name} {wid}: {calls_each} calls\n{text.getvalue()}", flush=True)
    return profiles


def save(results: dict, path: str) -> None:
    """``results`` with the coverage so far into ``path``, replaced whole (never half written)."""
    results["coverage"] = coverage()
    results["torch_fast"] = dict(native.state)  # whether the fast path read tensors through torch's C++ objects
    with replaced(path) as (f,):
        f.write(json.dumps(results, indent=1).encode())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="JSON results file")
    parser.add_argument("--family", action="append", choices=FAMILIES, help="norm, pool, topk (default: all)")
    parser.add_argument("--op", help="only these ops' per-call rows, e.g. L2NormFwd,L1NormFwd (no new shapes)")
    parser.add_argument("--profile", action="store_true",
                        help="also cProfile a few functions' calls (where a call's host time goes)")
    args = parser.parse_args()
    device = torch.device("cuda")
    registry = load_registry()
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "host": platform.processor(),
               "new_shapes": [] if args.op else [r for r in new_shapes(device, args.family or FAMILIES) if r],
               "per_call": []}
    if args.profile:
        results["profiles"] = profile(registry, device)
    reset_coverage()
    save(results, args.out)
    # The drop-ins for torch's functions first, then the ops torch has no function for.
    chosen = set(args.op.split(",")) if args.op else None
    ops = [registry.op(name) for name in (*DROP_INS, *POOLS, *OP_FUNCTIONS)
           if name in registry.ops and (not args.family or registry.op(name).family in args.family)
           and (chosen is None or name in chosen)]
    for op in ops:
        for w in op.workloads:
            try:
                inputs = op.make_inputs(w, InputRNG(device, seed=1))
                ours, theirs = calls(op, w, inputs)
                (ours_host, ours_call), (torch_host, torch_call) = per_call((ours, theirs), device)
            except Exception as exc:  # a row that cannot run is reported, the others go on
                print(f"{op.name:22s} {w.id:4s} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                results["per_call"].append({"op": op.name, "workload": w.id, "error": f"{type(exc).__name__}: {exc}"})
                save(results, args.out)
                torch.cuda.empty_cache()
                continue
            row = {"op": op.name, "workload": w.id, "ours_host_us": ours_host, "ours_call_us": ours_call,
                   "torch_host_us": torch_host, "torch_call_us": torch_call}
            results["per_call"].append(row)
            save(results, args.out)
            print(f"{op.name:22s} {w.id:4s} ours {ours_call:8.2f} us (host {ours_host:6.2f})  "
                  f"torch {torch_call:8.2f} us (host {torch_host:6.2f})  ratio {torch_call / ours_call:5.2f}",
                  flush=True)
            del inputs
    rows = [r for r in results["per_call"] if "error" not in r]
    slower = [r for r in rows if r["ours_call_us"] > r["torch_call_us"]]
    host_over = [r for r in rows if r["ours_host_us"] > 1.2 * r["torch_host_us"]]
    print(f"\nfast path reading tensors through torch's C++ objects: {native.state}")
    print(f"{len(rows)} rows: ours slower per call on {len(slower)}; host cost over 1.2x torch's on {len(host_over)}")
    for r in slower:
        print(f"  slower: {r['op']} {r['workload']}: {r['ours_call_us']:.2f} against {r['torch_call_us']:.2f} us")
    for shapes in results["new_shapes"]:
        print(f"{shapes['function']}: {shapes['shapes']} new shapes built {shapes['built']} kernels; first call "
              f"max {shapes['first_call_ms']['max']:.1f} ms, median {shapes['first_call_ms']['median']:.2f} ms")


if __name__ == "__main__":
    main()
