#!/usr/bin/env bash
# CPU ISA levels in CI: the CPU op tests (cpu backend) once per ISA level this CPU supports other than its
# default one (the README test command runs that), forced with MK_CPU_ISA (one pytest process per level),
# then the SmolLM2 parity at every level in one process (tests/test_cpu_isa.py, MK_ISA_TESTS=1). Levels the
# CPU lacks are reported and left out.
# Environment: PYTHON (default .venv/bin/python); MISTRAL_KERNELS_LIBRARY as for the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

levels=$("$PY" -c "import mistral_kernels as mk; print(' '.join(mk.CPU_ISA_LEVELS))")
default=$(env -u MK_CPU_ISA "$PY" -c "import mistral_kernels as mk; print(mk.cpu_isa())")
for level in $levels; do
  if [ "$level" = "$default" ]; then
    echo "[isa] $level: this CPU's default level, tested by the main suite" >&2
    continue
  fi
  if [ "$("$PY" -c "import mistral_kernels as mk; print(int(mk.cpu_isa_supported('$level')))")" != 1 ]; then
    echo "[isa] $level: not supported by this CPU, left out" >&2
    continue
  fi
  start=$(date +%s)
  MK_CPU_ISA=$level "$PY" -m pytest -q -p no:cacheprovider tests/test_norm.py tests/test_rope.py tests/test_linear.py \
    tests/test_attention.py tests/test_moe.py tests/test_moe_expert_ffn.py tests/test_cpu_decode.py \
    tests/test_quant_linear.py tests/test_moe_qgemm.py tests/test_cpu_decode_packed.py \
    -k "(cpu or linear) and not large and not transformers"
  echo "[isa] $level: op tests took $(( $(date +%s) - start )) s" >&2
done
MK_ISA_TESTS=1 "$PY" -m pytest -q -p no:cacheprovider tests/test_cpu_isa.py
