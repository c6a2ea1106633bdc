"""Where an implementation's time goes under the timing protocol (cache flush, GPU held, then the
call): each kernel's own time (CUPTI, through torch.profiler) and the span from the first kernel's
start to the last one's end, beside the protocol's event-timed median. The event time includes the
gap between the start event and the first kernel; the span shows the gaps between kernels.

    python scripts/cupti-breakdown.py SpectralNormPowerIterFwd:W8 FusedAddRMSNormFwd:W3 \\
        [--alternatives torch_compile,liger] [--all-variants] [--out breakdown.jsonl]

Ours is timed at its first launch variant (and with --all-variants at every one); the alternatives
named are timed as registered; each is checked against the reference first (a wrong one is reported,
not timed). One JSON line per (workload, implementation, variant). Needs a CUDA GPU.
"""

import argparse
import json
import statistics
import sys

import torch

IGNORED_KERNELS = ("sleep", "spin", "elementwise", "reduce_kernel", "Memset")  # the hold and the flush


def kernel_times(call, device, iterations: int = 20) -> dict:
    """Median span and per-kernel times (µs) of ``call`` over ``iterations`` flushed calls, the
    device held before each as long as the timing protocol holds it."""
    from npuops.timing import hold_seconds, warm_up

    hold_s = hold_seconds(warm_up(call, device, 0.5))
    flush = device.cache_flusher()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        for _ in range(iterations):
            flush()
            device.hold(hold_s)
            call()
        torch.cuda.synchronize()
    events = sorted((e for e in profile.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                    key=lambda e: e.time_range.start)
    calls, current = [], None
    for event in events:
        if "sleep" in event.name or "spin" in event.name:  # the hold starts each call
            current = []
            calls.append(current)
        elif current is not None and not any(name in event.name for name in IGNORED_KERNELS):
            current.append(event)
    spans, per_kernel = [], {}
    for kernels in filter(None, calls):
        spans.append(kernels[-1].time_range.end - kernels[0].time_range.start)
        for i, event in enumerate(kernels):
            per_kernel.setdefault(f"{i}:{event.name[:40]}", []).append(event.time_range.end - event.time_range.start)
    return {"span_us": round(statistics.median(spans), 3),
            "kernels_us": {name: round(statistics.median(times), 3) for name, times in per_kernel.items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="+", help="OP:WORKLOAD, e.g. SpectralNormPowerIterFwd:W8")
    parser.add_argument("--alternatives", default="torch_compile,liger",
                        help="implementations timed beside ours (comma-separated; default %(default)s)")
    parser.add_argument("--all-variants", action="store_true", help="every launch variant of ours")
    parser.add_argument("--out", help="JSON lines file (default: stdout only)")
    args = parser.parse_args()

    from npuops.check import check
    from npuops.data import InputRNG
    from npuops.registry import load_registry
    from npuops.timing import TimingOptions, measure

    registry = load_registry()
    device, cuda = registry.device("cuda"), torch.device("cuda")
    alternatives = set(args.alternatives.split(","))
    out = open(args.out, "w") if args.out else None
    for key in args.workloads:
        op_name, workload = key.split(":")
        op = registry.op(op_name)
        w = op.workload(workload)
        inputs = op.make_inputs(w, InputRNG(cuda, 0))
        for impl in registry.impls_for(op.name):
            if impl.tier != "ours" and impl.name not in alternatives:
                continue
            variants = impl.variants(op, w) if impl.tier == "ours" and impl.variants else [None]
            for config in variants if args.all_variants else variants[:1]:
                fn = impl.build(op, w, cuda) if config is None else impl.build(op, w, cuda, config=config)
                verdict = check(op, w, fn, device, seed=0, nan_fill=impl.nan_fill)
                if not verdict.ok:  # a wrong kernel is not timed
                    print(f"{key} {impl.name} {config}: wrong: {verdict.detail}", file=sys.stderr)
                    continue
                call = lambda fn=fn: fn(**inputs)  # noqa: E731
                event = measure(call, device, "eager", TimingOptions(budget_s=0.5)).median_ms * 1e3
                row = {"op": op_name, "workload": workload, "impl": impl.name, "config": config,
                       "event_us": round(event, 3), **kernel_times(call, device)}
                print(json.dumps(row), flush=True)
                if out:
                    out.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
