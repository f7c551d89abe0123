"""Mutation tests of the SIMT emulator's hardware checks: each check must make a test fail on a
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

import concurrent.futures
import re
import shutil
from pathlib import Path

import pytest

from .helpers.emulator import CSRC, GXX, _clean_env, _run, _run_program, build  # noqa: F401  (build: fixture)

pytestmark = pytest.mark.skipif(GXX is None, reason="g++ not found")

PROGRAM = "test_prefill_tc_pipeline"


def mutated_csrc(root: Path, kernel: str, *edits: tuple[str, str, bool]) -> Path:
    """A copy of csrc/kernels with each (regex, replacement, required) edit applied to `kernel` (a required
    regex must match exactly once, an optional one at most once); simt/ and abi.h link to the real ones.
    Returns the directory to put first on the include path."""
    kernels = root / "kernels"
    shutil.copytree(CSRC / "kernels", kernels)
    (root / "simt").symlink_to(CSRC / "simt")
    (root / "abi.h").symlink_to(CSRC / "abi.h")
    path = kernels / kernel
    text = path.read_text()
    for pattern, replacement, required in edits:
        text, n = re.subn(pattern, replacement, text, flags=re.MULTILINE)
        assert n == 1 or (n == 0 and not required), \
            f"mutation site /{pattern}/ found {n} times in csrc/kernels/{kernel} (update this test)"
    path.write_text(text)
    return root


MUTANTS = {  # name: (program, kernel file, edits)
    "stage_reuse": (PROGRAM, "paged_prefill_tc.cuh", [(r"^\s*__syncthreads\(\);[^\n]*refills[^\n]*\n", "", True)]),
    # no K/V tile, and no wait after the loop either (a kernel may add one to retire the Q group)
    "unwaited_q": (PROGRAM, "paged_prefill_tc.cuh", [
        (r"const int ntiles = [^;]*;", "const int ntiles = 0;", True),
        (r"^\s*simt::cp_async_wait<0>\(\);\n(?=(?:\s*__syncthreads\(\);\n)?\s*if \(!warp_rows\) return;)", "", False),
    ]),
    "int32_row": ("test_int64_addressing", "common.cuh",
                  [(r"\{ return s \* slot_stride; \}", "{ return static_cast<int32_t>(s * slot_stride); }", True)]),
}


@pytest.fixture(scope="module")
def binaries(build, tmp_path_factory) -> dict[str, Path]:  # noqa: F811
    """The control programs and every mutant, compiled two at a time."""
    jobs = {"control": (PROGRAM, None), "int64": ("test_int64_addressing", None)}
    for name, (program, kernel, edits) in MUTANTS.items():
        jobs[name] = (program, mutated_csrc(tmp_path_factory.mktemp(name), kernel, *edits))
    build(PROGRAM)  # the emulator runtime objects, once, before the parallel compiles
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = {name: pool.submit(build, program, include=inc) for name, (program, inc) in jobs.items()}
        return {name: f.result() for name, f in futures.items()}


def test_control_program_passes(binaries) -> None:
    _run_program(binaries["control"])


def test_prefill_tc_without_stage_reuse_barrier_fails(binaries) -> None:
    r = _run([str(binaries["stage_reuse"])], env=_clean_env())
    assert r.returncode != 0, "removing the stage-reuse barrier went unnoticed:\n" + r.stdout
    assert re.search(r"out\[i\d+ h\d+ d\d+\] = nan", r.stderr), r.stderr[-3000:]


def test_prefill_tc_with_unwaited_q_group_faults(binaries) -> None:
    r = _run([str(binaries["unwaited_q"])], env=_clean_env())
    assert r.returncode != 0
    assert "cp.async still pending at thread exit: threadIdx (" in r.stderr, r.stderr[-3000:]
    assert re.search(r"of blockIdx \(0,0,0\) has \d+ copies in flight", r.stderr), r.stderr[-3000:]
    assert "paged_prefill_tc_kernel" in r.stderr


def test_int64_addressing_program_passes(binaries) -> None:
    """Decode (fp16, fp32), tensor-core and SIMT prefill over caches of > 2^31 elements vs naive attention."""
    _run_program(binaries["int64"])


def test_int32_row_offset_fails_int64_addressing(binaries) -> None:
    r = _run([str(binaries["int32_row"])], env=_clean_env())
    assert r.returncode != 0, "a 32-bit row offset went unnoticed:\n" + r.stdout
