"""The SIMT emulator (csrc/simt) itself: standalone C++ test programs (tests/emu/*.cpp) compiled with g++
against the emulator runtime and run here, in the fast-switch, ucontext and AddressSanitizer builds;
16-bit float conversions against numpy / torch; the PTX wrappers of portable.cuh through nvcc.

No torch is needed by the C++ programs; a compiler is (the tests skip without g++ / nvcc).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from .helpers.emulator import CSRC, CXXFLAGS, EMU_TESTS, GXX, _clean_env, _compile, _nvcc, _run, _run_program, build


pytestmark = pytest.mark.skipif(GXX is None, reason="g++ not found")


@pytest.mark.parametrize("program", ["test_collectives", "test_tensor_core", "test_schedules", "test_failures",
                                     "test_threads", "test_cp_async"])
def test_emulator_program(build, program):
    """Barrier, shuffles, votes, smem, atomics / mma + ldmatrix + cp.async vs naive references / a missing
    __syncthreads exposed by reverse+random schedules / DEADLOCK reports (incl. a collective split across two
    call sites) and invalid configs / OS threads / cp.async poison at issue, copy at wait, pending at exit."""
    _run_program(build(program))


@pytest.mark.parametrize("program", ["test_collectives", "test_schedules", "test_failures"])
def test_ucontext_fallback(build, program):
    _run_program(build(program, "ucontext"))


def test_tests_run_under_default_schedule_env(build):
    """The programs set MK_SIMT_SCHEDULE per launch; an inherited value must not change the outcome."""
    _run_program(build("test_collectives"), MK_SIMT_SCHEDULE="reverse", MK_SIMT_THREADS="2")


def test_memory_efficiency_counters(build):
    """MK_SIMT_STATS on the real kernels, every access instrumented: decode K/V loads ≥ 90 % sector efficiency,
    tensor-core prefill ldmatrix and shared stores conflict-free (D 64/128/256), grouped-GEMM weight loads
    coalesced; the per-site report is printed (pytest -s shows it)."""
    r = _run_program(build("test_mem_efficiency", "stats"))
    print(r.stdout)
    assert r.stdout.count("shared stores worst") == 5 and "grouped_gemm bf16" in r.stdout


# ---- AddressSanitizer ------------------------------------------------------------------------------------
_ASAN_ENV = {"ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0"}


def test_asan_in_bounds_kernel_is_clean(build):
    r = _run_program(build("test_asan", "asan"), "inbounds", **_ASAN_ENV)
    assert "AddressSanitizer" not in r.stderr


def test_asan_reports_out_of_bounds_read_with_thread(build):
    exe = build("test_asan", "asan")
    r = _run([str(exe), "oob"], env=_clean_env(**_ASAN_ENV))
    assert r.returncode != 0
    assert "ERROR: AddressSanitizer: heap-buffer-overflow" in r.stderr
    assert "READ of size 4" in r.stderr and "copy_kernel" in r.stderr
    assert "happened in kernel copy_kernel(float const*, float*, int, bool), blockIdx (2,0,0), threadIdx (5,0,0)" in r.stderr


# ---- 16-bit floats --------------------------------------------------------------------------------------
def _special_and_random_floats() -> np.ndarray:
    rng = np.random.default_rng(0)
    random_bits = rng.integers(0, 2**32, size=20000, dtype=np.uint64).astype(np.uint32)
    # around the half range edges and rounding ties: 1 + k·2^-11, 65504 .. 65536, subnormal boundaries
    edges = np.array([0.0, -0.0, 1.0, 1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-8, 1 + 3 * 2**-8, 65504.0, 65519.99,
                      65520.0, 65536.0, 2**-14, 2**-24, 2**-25, 1.5 * 2**-25, 2**-26, 6e-8, 3.4e38, np.inf, -np.inf,
                      np.nan, 1e-40, -1e-45], dtype=np.float32).view(np.uint32)
    scaled = (rng.standard_normal(20000) * np.float32(2.0) ** rng.integers(-30, 20, 20000)).astype(np.float32)
    return np.concatenate([edges, random_bits, scaled.view(np.uint32)])


def test_fp16_bf16_narrowing_matches_numpy_and_torch(build):
    torch = pytest.importorskip("torch")
    bits = _special_and_random_floats()
    r = subprocess.run([str(build("fp16_dump")), "narrow"], input="\n".join(f"{b:08x}" for b in bits),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = np.array([[int(x, 16) for x in line.split()] for line in r.stdout.split("\n") if line], dtype=np.uint32)
    f = bits.view(np.float32)
    nan = np.isnan(f)
    with np.errstate(over="ignore"):  # overflow to ±inf is the expected rounding
        half_ref = f.astype(np.float16).view(np.uint16).astype(np.uint32)
    bf16_ref = torch.from_numpy(f.copy()).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16).astype(np.uint32)
    assert np.array_equal(got[~nan, 0], half_ref[~nan])
    assert np.array_equal(got[~nan, 1], bf16_ref[~nan])
    assert np.all(got[nan] == 0x7FFF)  # CUDA's canonical NaN


def test_fp16_bf16_widening_is_exact(build):
    r = subprocess.run([str(build("fp16_dump")), "widen"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = np.array([[int(x, 16) for x in line.split()] for line in r.stdout.split("\n") if line], dtype=np.uint32)
    all16 = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    half_ref = all16.view(np.float16).astype(np.float32)
    bf16_ref = (all16.astype(np.uint32) << 16).view(np.float32)
    got_half, got_bf16 = got[:, 0].view(np.float32), got[:, 1].view(np.float32)
    ok = ~np.isnan(half_ref)
    assert np.array_equal(got[ok, 0], half_ref[ok].view(np.uint32)) and np.all(np.isnan(got_half[~ok]))
    ok = ~np.isnan(bf16_ref)
    assert np.array_equal(got[ok, 1], bf16_ref[ok].view(np.uint32)) and np.all(np.isnan(got_bf16[~ok]))


PTX_INSTRUCTIONS = [
    "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
    *(f"ldmatrix.sync.aligned.m8n8.x{n}{t}.shared.b16" for n in (1, 2, 4) for t in ("", ".trans")),
    "cp.async.ca.shared.global", "cp.async.cg.shared.global", "cp.async.commit_group", "cp.async.wait_group",
]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_ptx_wrappers_compile_with_nvcc(arch, tmp_path):
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found")
    src = EMU_TESTS / "ptx_wrappers.cu"
    base = [nvcc, "-std=c++20", f"-arch={arch}", f"-I{CSRC}", "-Werror", "all-warnings"]
    _compile([*base, "-c", str(src), "-o", str(tmp_path / "w.o")])  # includes ptxas: the PTX assembles
    _compile([*base, "-ptx", str(src), "-o", str(tmp_path / "w.ptx")])
    ptx = (tmp_path / "w.ptx").read_text()
    missing = [i for i in PTX_INSTRUCTIONS if i not in ptx]
    assert not missing, f"instructions not emitted: {missing}"


def test_ptx_wrappers_compile_with_gxx(tmp_path):
    _compile([GXX, *CXXFLAGS, "-Werror", "-x", "c++", "-c", str(EMU_TESTS / "ptx_wrappers.cu"), "-o",
              str(tmp_path / "w.o")])


# ---- through the torch module -----------------------------------------------------------------------------
def test_emulated_op_reports_emulator_errors_as_python_exceptions(monkeypatch):
    """A failing emulated launch becomes a RuntimeError carrying the emulator's message, not an abort."""
    torch = pytest.importorskip("torch")
    import mistral_kernels

    if not mistral_kernels.emulator_compiled():
        pytest.skip("emulated kernels not built")
    from mistral_kernels import emulated, reference

    x, w = torch.randn(3, 64), torch.randn(64)
    monkeypatch.setenv("MK_SIMT_SCHEDULE", "sideways")
    with pytest.raises(RuntimeError, match="rms_norm.*MK_SIMT_SCHEDULE='sideways'"):
        emulated.rms_norm(x, w)
    monkeypatch.setenv("MK_SIMT_SCHEDULE", "random")
    torch.testing.assert_close(emulated.rms_norm(x, w), reference.rms_norm(x, w), atol=1e-5, rtol=1e-5)
