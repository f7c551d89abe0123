#!/usr/bin/env bash
# Sets up a working checkout from nothing: creates .venv, installs torch and the dependencies, builds and
# installs mistral-kernels (CPU kernels + SIMT-emulated CUDA kernels + real CUDA kernels when a CUDA toolkit
# is present). Idempotent: a second run reuses the venv and rebuilds incrementally (build/ is kept).
#
# Environment: VENV (default .venv), PYTHON (default python3), TORCH_SPEC (default torch==2.14.1, a CUDA build),
# CUDA_HOME (default: the first /usr/local/cuda*/ with bin/nvcc), TORCH_CUDA_ARCH_LIST (default "8.0;9.0"),
# MK_REQUIRE_CUDA=1 to fail instead of building CPU-only when no toolkit is found.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.14.1}

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV" >&2
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade pip
echo "[setup] installing $TORCH_SPEC and build tools" >&2
"${PIP[@]}" install -q "$TORCH_SPEC" "scikit-build-core>=0.10" ninja "cmake>=3.26"

# The nvcc on PATH may be a wrapper script: point CUDA_HOME at the toolkit itself.
if [ -z "${CUDA_HOME:-}" ]; then
  for d in /usr/local/cuda /usr/local/cuda-*; do
    if [ -x "$d/bin/nvcc" ]; then CUDA_HOME=$d; break; fi
  done
fi
CMAKE_ARGS=()
if [ -n "${CUDA_HOME:-}" ]; then
  export CUDA_HOME PATH="$CUDA_HOME/bin:$PATH"
  export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-8.0;9.0}
  echo "[setup] CUDA toolkit: $CUDA_HOME (archs $TORCH_CUDA_ARCH_LIST)" >&2
else
  echo "[setup] no CUDA toolkit found: building the CPU + emulated kernels only" >&2
fi
if [ "${MK_REQUIRE_CUDA:-0}" = 1 ]; then CMAKE_ARGS+=(-C cmake.define.MK_CUDA=ON); fi

echo "[setup] building and installing mistral-kernels (first build with CUDA: a few minutes)" >&2
"${PIP[@]}" install -q --no-build-isolation "${CMAKE_ARGS[@]}" ".[test,serve]"
"$VENV/bin/python" -c "import mistral_kernels as mk; print(f'[setup] mistral_kernels {mk.__version__}: cuda_compiled={mk.cuda_compiled()} emulator_compiled={mk.emulator_compiled()}')" >&2
