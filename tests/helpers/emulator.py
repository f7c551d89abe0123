"""Helpers of tests/test_emulator.py that other tests share."""

from __future__ import annotations

import concurrent.futures
import itertools
import os
import shutil
import subprocess
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "csrc"
EMU_TESTS = ROOT / "tests" / "emu"
RUNTIME = sorted((CSRC / "simt").glob("emu_*.cpp"))
GXX = shutil.which("g++")

# -rdynamic: kernel names in reports come from dladdr, which needs the executable's symbols exported.
# -fsanitize=alignment: misaligned typed accesses fail the launch (csrc/simt/emu_align.cpp), as in the module.
CXXFLAGS = ["-std=c++20", "-O1", "-g", "-rdynamic", "-Wall", "-Wno-unknown-pragmas", f"-I{CSRC}", f"-I{EMU_TESTS}",
            "-fsanitize=alignment", "-fno-sanitize-recover=alignment"]
VARIANTS = {
    "fast": [],  # hand-written x86-64 context switch
    "ucontext": ["-DMK_SIMT_UCONTEXT=1"],  # the portable fallback
    "asan": ["-fsanitize=address", "-fno-omit-frame-pointer"],
}

# Program-only flags (the runtime objects stay the "fast" ones): "stats" instruments every load and store of
# the program's kernels for the MK_SIMT_STATS counters (outline calls into csrc/simt/emu_stats.cpp).
PROGRAM_VARIANTS = {
    "stats": ["-fsanitize=kernel-address", "--param=asan-instrumentation-with-call-threshold=0",
              "--param=asan-stack=0", "--param=asan-globals=0"],
}


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=kw.pop("timeout", 120), **kw)


def _compile(cmd: list[str]) -> None:
    r = _run(cmd, timeout=300)
    assert r.returncode == 0, f"compile failed: {' '.join(cmd)}\n{r.stderr[-4000:]}"


@pytest.fixture(scope="session")
def build(tmp_path_factory):
    """build(program, variant, include=None) -> path of tests/emu/<program>.cpp linked with the emulator
    runtime. `include`: a directory searched before csrc (a mutated copy of csrc, tests/test_emu_mutations.py)."""
    out = tmp_path_factory.mktemp("emu")
    objects: dict[str, list[Path]] = {}
    binaries: dict[tuple[str, str, str], Path] = {}
    serial = itertools.count()

    def runtime(variant: str) -> list[Path]:
        if variant not in objects:
            objs = [out / f"{src.stem}.{variant}.o" for src in RUNTIME]
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                list(pool.map(lambda so: _compile([GXX, *CXXFLAGS, *VARIANTS[variant], "-c", str(so[0]), "-o", str(so[1])]),
                              zip(RUNTIME, objs)))
            objects[variant] = objs
        return objects[variant]

    def get(program: str, variant: str = "fast", include: Path | None = None) -> Path:
        key = (program, variant, str(include or ""))
        if key not in binaries:
            exe = out / f"{program}.{variant}.{next(serial)}"  # unique even when built from two threads
            first = [f"-I{include}"] if include else []
            flags = PROGRAM_VARIANTS[variant] if variant in PROGRAM_VARIANTS else VARIANTS[variant]
            rt = runtime("fast" if variant in PROGRAM_VARIANTS else variant)
            _compile([GXX, *first, *CXXFLAGS, *flags, str(EMU_TESTS / f"{program}.cpp"), *map(str, rt), "-lpthread",
                      "-o", str(exe)])
            binaries[key] = exe
        return binaries[key]

    return get


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MK_SIMT_")}
    env.update(extra)
    return env


def _run_program(exe: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    r = _run([str(exe), *args], env=_clean_env(**env))
    assert r.returncode == 0, f"{exe.name} failed (rc {r.returncode}):\n{r.stdout}\n{r.stderr[-6000:]}"
    assert f"{exe.name.split('.')[0]}: ok" in r.stdout
    return r


# ---- the PTX wrappers under nvcc and g++ ----------------------------------------------------------------
def _nvcc() -> str | None:
    for candidate in (shutil.which("nvcc"), os.path.join(os.environ.get("CUDA_HOME", ""), "bin", "nvcc"),
                      *sorted(map(str, Path("/usr/local").glob("cuda*/bin/nvcc")), reverse=True)):
        if candidate and os.path.isfile(candidate):
            return candidate
    return None
