"""The generated code of the pool kernel that takes its sizes at launch against the per-shape
kernel it replaces as the default, without a GPU: both built for sm_90a as the GPU builds them,
their CUDA C compiled to PTX by nvcc (TileLang's flags) and to SASS by ptxas for the register
count. Per kernel: registers, SASS instructions (where nvdisasm is found) and PTX instructions of
one thread (straight-line code: per thread, not per loop trip, for the kernels compared here), outputs a thread computes, global loads and stores
by width, 64-bit integer instructions (address arithmetic), divisions and remainders.

    python scripts/pool-kernel-code.py            # needs nvcc (CUDA toolkit), no GPU
    python scripts/pool-kernel-code.py --source   # also print each kernel's CUDA C
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


from npuops.kernels import compile_kernel
from npuops.registry import load_registry

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins" / "pool" / "tests"))
from test_pool import make_workload  # noqa: E402

CASES = [  # rows of whole vectors (the vectors kernel before) and not (the window kernel before)
    ("MaxPool2dFwd", (32, 64, 112, 112), "bf16", dict(kernel_size=3, stride=2, padding=1)),
    ("MaxPool2dFwd", (32, 64, 111, 111), "bf16", dict(kernel_size=3, stride=2, padding=1)),
    ("AvgPool2dFwd", (2, 64, 112, 112), "f16", dict(kernel_size=3, stride=2, padding=1)),
    ("MaxPool3dFwd", (2, 64, 16, 56, 56), "bf16", dict(kernel_size=3, stride=2, padding=1)),
    ("AvgPool1dFwd", (4, 128, 4096), "f16", dict(kernel_size=3, stride=2, padding=1)),
]


def ptx_stats(source: str) -> dict:
    from tilelang.env import CUTLASS_INCLUDE_DIR, TILELANG_TEMPLATE_PATH

    flags = ["-O3", "-arch=sm_90a", "-std=c++20", f"-I{TILELANG_TEMPLATE_PATH}", f"-I{CUTLASS_INCLUDE_DIR}"]
    with tempfile.TemporaryDirectory() as tmp:
        cu = Path(tmp, "k.cu")
        cu.write_text(source)
        subprocess.run(["nvcc", "-ptx", *flags, str(cu), "-o", f"{tmp}/k.ptx"], check=True, capture_output=True)
        ptxas = subprocess.run(["nvcc", "-cubin", *flags, "--ptxas-options=-v", str(cu), "-o", f"{tmp}/k.cubin"],
                               check=True, capture_output=True, text=True)
        ptx = Path(tmp, "k.ptx").read_text()
        # SASS instructions (NOPs, padding, left out) where nvdisasm is found (NVDISASM, PATH; pip
        # install nvidia-cuda-nvdisasm has one): what the SM issues, after ptxas.
        nvdisasm = os.environ.get("NVDISASM") or shutil.which("nvdisasm")
        sass = None
        if nvdisasm:
            listing = subprocess.run([nvdisasm, "-c", f"{tmp}/k.cubin"], check=True, capture_output=True, text=True).stdout
            sass = len([line for line in listing.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", line) and "NOP" not in line])
    body = ptx[ptx.index(".entry"):]
    lines = [line.strip() for line in body.splitlines()]
    instructions = [line for line in lines if line and not line.startswith(("//", ".", "{", "}", "$", ")"))
                    and not line.endswith(":")]
    ops = collections.Counter(re.sub(r"^@!?%p\d+\s+", "", line).split()[0].rstrip(";") for line in instructions)

    def count(pattern):
        return sum(n for op, n in ops.items() if re.search(pattern, op))

    return {"registers": int(re.search(r"Used (\d+) registers", ptxas.stderr).group(1)), "ptx": len(instructions), "sass": sass,
            "ld.v4": count(r"^ld\.global.*\.v4"), "ld.scalar": count(r"^ld\.global(?!.*\.v\d)"),
            "st.vector": count(r"^st\.global.*\.v\d"), "st.scalar": count(r"^st\.global(?!.*\.v\d)"),
            "64-bit int": count(r"\.(s|u)64$|\.wide\.") , "div/rem": count(r"^(div|rem)\.(s|u)")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", action="store_true", help="print each kernel's CUDA C")
    args = parser.parse_args()
    from npuops_pool.pool_kernel import pool_kernel, shape_variants

    registry = load_registry(strict=True)
    header = (f"{'workload':44} {'kernel':16} {'outputs':>7} {'regs':>4} {'sass':>5} {'ptx':>5} {'ld.v4':>5} {'ld.1':>4} "
              f"{'st.v':>4} {'st.1':>4} {'i64':>4} {'div':>3}")
    print(header)
    for op_name, shape, dtype, params in CASES:
        op = registry.op(op_name)
        w = make_workload(op_name, shape, dtype, **params)
        for config in (op.tilelang_variants(w)[0], shape_variants(op.pooling(w), w.dtype_of("input"))[0]):
            spec = pool_kernel(op.pooling(w), w.shapes["input"], w.dtype_of("input"), **config)
            source = compile_kernel(spec.prim_func, arch="sm_90a", pass_configs=spec.pass_configs).get_kernel_source()
            s = ptx_stats(source)
            outputs = spec.config.get("outputs", 1) * spec.config.get("march", 1)
            if spec.config["kernel"] == "rows":
                outputs = "loop"
            print(f"{op_name + ' ' + str(shape) + ' ' + dtype:44} {spec.config['kernel']:16} {outputs!s:>7} "
                  f"{s['registers']:>4} {s['sass'] or '-':>5} {s['ptx']:>5} {s['ld.v4']:>5} {s['ld.scalar']:>4} {s['st.vector']:>4} "
                  f"{s['st.scalar']:>4} {s['64-bit int']:>4} {s['div/rem']:>3}", flush=True)
            if args.source:
                print(source[source.index("__launch_bounds__"):])


if __name__ == "__main__":
    main()
