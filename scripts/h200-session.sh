#!/usr/bin/env bash
# One device call that installs, benchmarks and runs the GPU tests, writing everything under $OUT.
# From the project root, with the device tool:
#   run(carry=[".devkit", ".whl"], command="NPUOPS_GIT_REVISION=$(rev) bash scripts/h200-session.sh RESULTS ARGS...")
# RESULTS names the results file ($OUT/RESULTS.jsonl, reports beside it); ARGS go to `npuops run`
# (e.g. --op RMSNormFwd,LayerNormFwd). CORE_GPU_TESTS (default tests; empty: none) and GPU_TESTS
# (default plugins) pick the tests marked gpu, paths split on spaces; GPU_TESTS_K, a pytest -k
# expression for the plugins' tests (spaces kept: "LayerNorm or FusedAdd");
# RUN_TIMEOUT / TEST_TIMEOUT (seconds) keep the call inside the device's 10-minute limit;
# TEST_WORKERS (default 6) pytest-xdist workers share the GPU (the device image has pytest-xdist).
# .devkit comes from ../shared/devkit/pack-tilelang; .whl from scripts/pack-wheels.sh (liger-kernel);
# .kcache (optional: carry it too where the tree, .devkit and it fit the device's 64 MiB) from
# scripts/warm-kernel-cache.py: the catalog's kernels precompiled; without it they compile there (16 jobs).
# It leaves six files in $OUT (calibrate.log, RESULTS.jsonl / .md / .html, the worker logs, gpu-tests.log);
# the device tool returns eight a call, so a second run in the same call must clear or bundle the first's.
set -uo pipefail
name=$1; shift
export PYTHONUNBUFFERED=1 TILELANG_CACHE_DIR=${TILELANG_CACHE_DIR:-/tmp/tilelang-cache}
source .devkit/activate.sh
if [ -f .kcache/cache.tar.xz ]; then  # kernels compiled ahead (scripts/warm-kernel-cache.py)
  mkdir -p "$TILELANG_CACHE_DIR" && tar -xJf .kcache/cache.tar.xz -C "$TILELANG_CACHE_DIR"
fi
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/wheels .whl/*.whl
  export PYTHONPATH=/tmp/wheels:$PYTHONPATH
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . -e plugins/norm -e plugins/conv \
  -e plugins/pool -e plugins/topk -e examples/npuops-example
python3 -m npuops.cli calibrate > "$OUT/calibrate.log" 2>&1
mkdir -p /tmp/run
start=$(date +%s)
timeout "${RUN_TIMEOUT:-300}" python3 -m npuops.cli run --jobs 16 --no-progress --out "/tmp/run/$name.jsonl" "$@" 2>&1 | tail -3
echo "run wall: $(( $(date +%s) - start )) s"
cp "/tmp/run/$name.jsonl" "$OUT/"
tar czf "$OUT/$name-worker-logs.tgz" -C /tmp/run "$name.jsonl.logs"
python3 -m npuops.cli report "$OUT/$name.jsonl" --format markdown -o "$OUT/$name.md"
python3 -m npuops.cli report "$OUT/$name.jsonl" --format html -o "$OUT/$name.html"
# The core's GPU tests time things: alone. The plugins' compile their own kernels (most of their
# time): xdist workers compile in parallel.
gpu_tests() {
  if [ -n "${CORE_GPU_TESTS-tests}" ]; then python3 -m pytest -v -rf --tb=short -m gpu ${CORE_GPU_TESTS-tests}; fi
  python3 -m pytest -n "${TEST_WORKERS:-6}" -v -rf --tb=short -m gpu ${GPU_TESTS_K:+-k "$GPU_TESTS_K"} ${GPU_TESTS:-plugins}
}
export -f gpu_tests
timeout "${TEST_TIMEOUT:-150}" bash -c gpu_tests 2>&1 | tee "$OUT/gpu-tests.log" | grep -E "PASSED|FAILED|ERROR|passed|failed" | tail -40
