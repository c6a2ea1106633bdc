#!/usr/bin/env bash
# Downloads the Python wheels the GPU machine lacks (it has no network) into the git-ignored .whl/;
# carry .whl with .devkit and scripts/h200-session.sh installs them there.
#   scripts/pack-wheels.sh            (from the project root)
set -euo pipefail
root=$(git rev-parse --show-toplevel)
grep -qx '/.whl/' "$root/.git/info/exclude" 2>/dev/null || echo '/.whl/' >> "$root/.git/info/exclude"
# Liger-Kernel: pure Python + Triton (the GPU machine has triton), the norm family's open-source alternative.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 -d "$root/.whl" "liger-kernel==0.8.5"
ls -la "$root/.whl"
