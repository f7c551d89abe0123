"""Mutation tests of the SIMT emulator's hardware checks (issue 16): each check must make a test fail on a
kernel that has the bug it targets. The real kernel is mutated textually into a temporary copy of csrc/
(never a switch in csrc/kernels), and the standalone program tests/emu/test_prefill_tc_pipeline.cpp is
compiled against the copy; the same program against the real kernel is the control and must pass.

  stage-reuse barrier  paged_prefill_tc.cuh without its trailing __syncthreads: a warp that skips a tile
                       prefetches into the stage the other warps still read — cp.async poisons its
                       destination at issue, so they read NaN.
  empty key range      the same kernel with no K/V tile to visit: the Q group is never waited for, the
                       threads exit with copies in flight — a fault naming blockIdx / threadIdx.
  int32 row offset     common.cuh's PagedKV::row truncated to 32 bits: tests/emu/test_int64_addressing.cpp
                       (caches of > 2^31 elements, virtual memory only) must fail.
Checks exercised by small kernels of their own: tests/emu/test_failures.cpp (a collective split across two
call sites), tests/emu/test_cp_async.cpp (poison / copy-at-wait / pending at exit).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from .test_emulator import CSRC, GXX, _clean_env, _run, _run_program, build  # noqa: F401  (build: fixture)

pytestmark = pytest.mark.skipif(GXX is None, reason="g++ not found")

PROGRAM = "test_prefill_tc_pipeline"


def mutated_csrc(root: Path, kernel: str, pattern: str, replacement: str) -> Path:
    """A copy of csrc/kernels with `pattern` (a regex that must match exactly once) replaced in `kernel`;
    simt/ and abi.h link to the real ones. Returns the directory to put first on the include path."""
    kernels = root / "kernels"
    shutil.copytree(CSRC / "kernels", kernels)
    (root / "simt").symlink_to(CSRC / "simt")
    (root / "abi.h").symlink_to(CSRC / "abi.h")
    path = kernels / kernel
    text, n = re.subn(pattern, replacement, path.read_text(), flags=re.MULTILINE)
    assert n == 1, f"mutation site /{pattern}/ found {n} times in csrc/kernels/{kernel} (update this test)"
    path.write_text(text)
    return root


def test_control_program_passes(build) -> None:  # noqa: F811
    _run_program(build(PROGRAM))


def test_prefill_tc_without_stage_reuse_barrier_fails(build, tmp_path) -> None:  # noqa: F811
    inc = mutated_csrc(tmp_path, "paged_prefill_tc.cuh", r"^\s*__syncthreads\(\);[^\n]*refills[^\n]*\n", "")
    r = _run([str(build(PROGRAM, include=inc))], env=_clean_env())
    assert r.returncode != 0, "removing the stage-reuse barrier went unnoticed:\n" + r.stdout
    assert re.search(r"out\[i\d+ h\d+ d\d+\] = nan", r.stderr), r.stderr[-3000:]


def test_prefill_tc_with_unwaited_q_group_faults(build, tmp_path) -> None:  # noqa: F811
    inc = mutated_csrc(tmp_path, "paged_prefill_tc.cuh", r"const int ntiles = [^;]*;", "const int ntiles = 0;")
    r = _run([str(build(PROGRAM, include=inc))], env=_clean_env())
    assert r.returncode != 0
    assert "cp.async still pending at thread exit: threadIdx (" in r.stderr, r.stderr[-3000:]
    assert re.search(r"of blockIdx \(0,0,0\) has \d+ copies in flight", r.stderr), r.stderr[-3000:]
    assert "paged_prefill_tc_kernel" in r.stderr


def test_int64_addressing_program_passes(build) -> None:  # noqa: F811
    """Decode (fp16, fp32), tensor-core and SIMT prefill over caches of > 2^31 elements vs naive attention."""
    _run_program(build("test_int64_addressing"))


def test_int32_row_offset_fails_int64_addressing(build, tmp_path) -> None:  # noqa: F811
    inc = mutated_csrc(tmp_path, "common.cuh", r"\{ return s \* slot_stride; \}",
                       "{ return static_cast<int32_t>(s * slot_stride); }")
    r = _run([str(build("test_int64_addressing", include=inc))], env=_clean_env())
    assert r.returncode != 0, "a 32-bit row offset went unnoticed:\n" + r.stdout
