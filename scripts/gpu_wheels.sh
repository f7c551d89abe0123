#!/usr/bin/env bash
# scripts/gpu_wheels.sh — the small wheels an offline GPU machine needs for scripts/gpu_check.sh, downloaded
# here (with network) into wheels/ (git-ignored); the GPU run carries that folder and installs each wheel on
# its own (MK_WHEELS_DIR=wheels). Wheels without dependencies for the device's Python (3.12 by default)
# (the device image has numpy, pyyaml, tqdm, pytest, transformers, ...).
#
#   bash scripts/gpu_wheels.sh            # gguf (the quantized cuda tests and benchmarks), llguidance (grammars)
#   bash scripts/gpu_wheels.sh --extras   # + pytest-xdist, pytest-timeout, execnet (in case the image lacks them)
#
# Environment: PYTHON (default python3: any python with pip), WHEELS_DIR (default wheels), PY_VERSION (3.12).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
DIR=${WHEELS_DIR:-wheels}
PY_VERSION=${PY_VERSION:-3.12}
SPECS=("gguf==0.19.0" "llguidance==1.9.1")
for arg in "$@"; do
  case "$arg" in
    --extras) SPECS+=("pytest-xdist" "pytest-timeout" "execnet") ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "gpu_wheels.sh: unknown argument $arg (use --extras or --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$DIR"
for spec in "${SPECS[@]}"; do
  "$PYTHON" -m pip download --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version "$PY_VERSION" -d "$DIR" "$spec"
done
ls -l "$DIR"
echo "carry '$DIR' with the GPU run and set MK_WHEELS_DIR=$DIR (README: GPU check on an offline machine)" >&2
