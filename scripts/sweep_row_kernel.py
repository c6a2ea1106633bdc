"""Sweep the row-norm kernel's launch configuration on a GPU: for each given catalog workload, every
(threads per row, minimum blocks per SM) that fits, each checked against the reference before it
is timed (cold L2, held GPU: the benchmark's eager regime). Writes one JSON record per variant.

    python scripts/sweep_row_kernel.py OUT.jsonl RMSNormFwd/W2 LayerNormFwd/W5 ...

Compiles in parallel worker processes first (TileLang caches the kernels on disk), then times in
this one. The launch rule in ``npuops_norm.rowwise_kernel`` (ELEMENTS_PER_THREAD, MIN_BLOCKS_PER_SM) was
read off its results (benchmarks/h200-row-kernel-sweep.jsonl).
"""

import functools
import json
import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor

import torch

THREADS = (128, 256, 512, 1024)
MIN_BLOCKS = (1, 2, 4)
MAX_THREADS_PER_SM = 2048


def variants(op, w):
    hidden = w.shapes["x"][-1] * op.row_norm(w).segments
    single_row = w.shapes["x"][:-1] == (1,) * (len(w.shapes["x"]) - 1)
    for threads in THREADS:
        per_thread = -(-hidden // threads)
        if not 2 <= per_thread <= 64:
            continue
        for blocks in (1,) if single_row else MIN_BLOCKS:
            if threads * blocks <= MAX_THREADS_PER_SM:
                yield threads, blocks


def spec_for(key, threads, blocks):
    from npuops.registry import load_registry
    from npuops_norm.rowwise_kernel import rowwise_kernel

    op_name, wid = key.split("/")
    op = load_registry().op(op_name)
    w = op.workload(wid)
    return op, w, rowwise_kernel(op.row_norm(w), w.shapes["x"], w.dtype_of("x"), samples=op.kernel_samples(w),
                                 threads=threads, min_blocks=blocks)


def compile_one(job):
    from npuops.kernels import compile_kernel

    try:
        compile_kernel(spec_for(*job)[2].prim_func)
        return None
    except Exception as exc:  # reported with the variant; the sweep goes on
        return f"{type(exc).__name__}: {exc}"[:300]


def main(out_path, keys):
    from npuops.check import check
    from npuops.data import InputRNG
    from npuops.registry import load_registry
    from npuops.timing import measure

    registry = load_registry()
    device = registry.device("cuda")
    jobs = []
    for key in keys:
        op_name, wid = key.split("/")
        op = registry.op(op_name)
        jobs += [(key, t, b) for t, b in variants(op, op.workload(wid))]
    with ProcessPoolExecutor(16, mp_context=multiprocessing.get_context("spawn")) as pool:
        errors = dict(zip(jobs, pool.map(compile_one, jobs)))
    with open(out_path, "w") as out:
        for job in jobs:
            key, threads, blocks = job
            record = {"workload": key, "threads": threads, "min_blocks": blocks}
            if errors[job]:
                record["error"] = errors[job]
            else:
                op, w, spec = spec_for(*job)
                fn = spec.compile(device.torch_device())
                result = check(op, w, fn, device, seed=5)
                record["ok"] = result.ok
                if result.ok:
                    inputs = op.make_inputs(w, InputRNG(device.torch_device(), seed=7))
                    record["ms"] = measure(functools.partial(fn, **inputs), device, "eager").median_ms
                    record["bytes"] = op.cost(w).bytes
            out.write(json.dumps(record) + "\n")
            out.flush()
            print(json.dumps(record), flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
