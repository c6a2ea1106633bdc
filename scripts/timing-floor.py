"""The floor of npuops' timing protocol on this machine's accelerator: an empty kernel and device
copies of many sizes, measured exactly as `npuops run` measures an implementation (cold cache,
device held before the start event, per launch and in graph replay).

    python scripts/timing-floor.py OUT.json

What no kernel of a given size can beat as timed here: a copy moving as many bytes as a workload
is the honest ceiling for a bandwidth-bound op of that size (the calibrated copy rate is measured
on 1 GiB, where launch and tail no longer count).
"""

import json
import sys

import torch

from npuops.registry import load_registry
from npuops.timing import REGIMES, measure

COPY_MIB = (0.0625, 1, 8, 16, 32, 64, 128, 256, 1024)  # bytes moved: twice the tensor's


def main(out: str) -> int:
    device = load_registry().device()
    rows = []

    def record(name: str, moved: int, call) -> None:
        for regime in REGIMES if device.graphs else ("eager",):
            t = measure(call, device, regime)
            row = {"what": name, "bytes_moved": moved, "regime": regime, "median_us": t.median_ms * 1e3,
                   "min_us": t.min_ms * 1e3, "tb_per_s": moved / (t.median_ms / 1e3) / 1e12 if moved else None}
            print(json.dumps(row), flush=True)
            rows.append(row)

    if device.name == "cuda":
        record("empty kernel (torch.cuda._sleep(0))", 0, lambda: torch.cuda._sleep(0))
    for mib in COPY_MIB:
        src = torch.randn(int(mib * 2**20) // 8, device=device.torch_device())
        dst = torch.empty_like(src)
        record(f"copy of {mib} MiB moved", 2 * src.nbytes, lambda dst=dst, src=src: dst.copy_(src))
    with open(out, "w") as f:
        json.dump({"device": device.describe(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
