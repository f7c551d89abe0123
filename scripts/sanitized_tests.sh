#!/usr/bin/env bash
# Sanitized op tests: builds the extension with AddressSanitizer + UndefinedBehaviorSanitizer
# (CMake MK_SANITIZE=ON: CPU kernels, glue, checks, emulated kernels and the emulator runtime; no CUDA) into
# build/asan, then runs op tests on tiny shapes against it (MISTRAL_KERNELS_LIBRARY) with the sanitizer
# runtimes preloaded into Python. Any report — heap overflow, use after free, UB — aborts the run.
# Default tests: the op fuzz and NaN tests, the attention / MoE / RoPE / norm / linear op tests on the CPU
# and one emulator schedule (the other schedules re-run the same code paths); pass pytest arguments to
# choose others. Environment: VENV (default .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
case $VENV in /*) ;; *) VENV="$PWD/$VENV" ;; esac
PY="$VENV/bin/python"
export PATH="$VENV/bin:$PATH"  # its cmake (>= 3.26) and ninja

cmake -S . -B build/asan -G Ninja -DPython_EXECUTABLE="$PY" -DMK_CUDA=OFF -DMK_SANITIZE=ON \
  -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG" >/dev/null
ninja -C build/asan

runtimes=""
for lib in libasan.so libubsan.so; do
  path=$(g++ -print-file-name="$lib")
  if [ ! -e "$path" ]; then echo "[asan] $lib not found (g++ -print-file-name)" >&2; exit 1; fi
  runtimes="$runtimes $path"
done
if [ $# -eq 0 ]; then
  set -- tests/test_op_fuzz.py tests/test_nan_semantics.py tests/test_attention.py tests/test_moe.py \
    tests/test_moe_expert_ffn.py tests/test_rope.py tests/test_norm.py tests/test_linear.py \
    -k "not emu-reverse and not emu-random"
fi
# detect_leaks=0: CPython and torch keep allocations alive until exit by design.
LD_PRELOAD="${runtimes# }" ASAN_OPTIONS="detect_leaks=0:abort_on_error=1" \
  UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" MISTRAL_KERNELS_LIBRARY="$PWD/build/asan/_C.so" \
  "$PY" -m pytest -q -p no:cacheprovider "$@"
