"""The build itself: every schema has a kernel on every backend that was built, each backend's build of
the shared C++ headers keeps its own symbols, and the CUDA build really contains SASS for sm_80 and sm_90
(parsed from the module's .nv_fatbin ELF section)."""

from __future__ import annotations

import os
import platform
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
import torch

import mistral_kernels

_ELF_CUBIN, _FATBIN_MAGIC = 2, 0xBA55ED50
CPU_ONLY_OPS = {"skinny_linear", "decode_layers"}  # by design (csrc/registration.cpp kCpuOnlySchemas)


def _op_names(ns: str) -> list[str]:
    return sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith(ns + "::"))


def _fatbin_archs(path: str) -> set[tuple[int, int]]:
    """(kind, sm) of every entry of the .nv_fatbin section (kind 1 = PTX, 2 = cubin)."""
    data = open(path, "rb").read()
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = sections[shstrndx][4]

    def name(off: int) -> str:
        return data[strtab + off : data.index(b"\0", strtab + off)].decode()

    found: set[tuple[int, int]] = set()
    for sec in sections:
        if name(sec[0]) != ".nv_fatbin":
            continue
        p, end = sec[4], sec[4] + sec[5]
        while p + 16 <= end:
            magic, _, hsz, fsz = struct.unpack_from("<IHHQ", data, p)
            if magic != _FATBIN_MAGIC:
                p += 8
                continue
            q = p + hsz
            while q < p + hsz + fsz:
                kind, _, ehsz, padded = struct.unpack_from("<HHII", data, q)
                found.add((kind, struct.unpack_from("<I", data, q + 28)[0]))
                q += ehsz + padded
            p += hsz + fsz
    return found


def test_every_schema_has_cpu_kernels() -> None:
    names = _op_names("mistral_kernels")
    assert "mistral_kernels::rms_norm" in names
    for n in names:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(n, "CPU"), f"{n} has no CPU kernel"


def test_emulated_namespace_mirrors_the_ops() -> None:
    if not mistral_kernels.emulator_compiled():
        pytest.skip("built with MK_EMU=OFF")
    native = {n.split("::")[1] for n in _op_names("mistral_kernels")} - CPU_ONLY_OPS
    emulated = {n.split("::")[1] for n in _op_names("mistral_kernels_emu")}
    assert emulated == native
    for n in emulated:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"mistral_kernels_emu::{n}", "CPU"), n


def _mk_namespaces(path: str) -> set[str]:
    """The namespaces directly inside mk of every symbol the module defines (from the mangled names:
    _ZN2mk7abi_emu4glue8rms_norm... → abi_emu)."""
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) not found")
    r = subprocess.run([nm, "--defined-only", path], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    found: set[str] = set()
    for line in r.stdout.splitlines():
        for m in re.finditer(r"N2mk(\d+)", line.split()[-1]):
            found.add(line.split()[-1][m.end() : m.end() + int(m.group(1))])
    return found


def test_backends_keep_their_symbols_apart() -> None:
    """csrc/abi.h: csrc/kernels, glue and checks are compiled into _C.so once per backend, each build in
    its own inline namespace of mk, so that the inline functions and templates of two builds never merge."""
    spaces = _mk_namespaces(str(mistral_kernels.library_path()))
    expected = {"abi_cpu", "cpu"}  # the shared headers as built for csrc/cpu; the CPU kernels' own namespace
    # csrc/cpu/isa: the shared headers once more per CPU ISA level (x86-64: four; elsewhere generic only), in
    # abi_cpu_<level> (present when a symbol of them is not inlined away)
    levels = mistral_kernels.CPU_ISA_LEVELS if platform.machine() in ("x86_64", "AMD64") else ("generic",)
    per_level = {f"abi_cpu_{level}" for level in levels}
    if mistral_kernels.emulator_compiled():
        expected.add("abi_emu")
    if mistral_kernels.cuda_compiled():
        expected.add("abi_cuda")
    assert expected <= spaces <= expected | per_level, (
        f"namespaces directly inside mk: {sorted(spaces)}, expected {sorted(expected)} (+ some of {sorted(per_level)})")


def test_cpu_kernels_built_per_isa_level() -> None:
    """csrc/cpu/isa: each level's copy of the CPU kernels in its own namespace mk::cpu::isa_<level>."""
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) not found")
    r = subprocess.run([nm, "--defined-only", str(mistral_kernels.library_path())], capture_output=True, text=True,
                       timeout=120)
    found = {r.stdout[m.end() : m.end() + int(m.group(1))] for m in re.finditer(r"N2mk3cpu(\d+)", r.stdout)}
    levels = mistral_kernels.CPU_ISA_LEVELS if platform.machine() in ("x86_64", "AMD64") else ("generic",)
    assert {f"isa_{level}" for level in levels} <= found, sorted(found)


def _libstdcxx_guard():
    """cmake/check_libstdcxx.py, the post-link guard, imported from the source tree."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "cmake" / "check_libstdcxx.py"
    spec = importlib.util.spec_from_file_location("check_libstdcxx", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_library_has_no_private_libstdcxx() -> None:
    """cmake/libstdcxx.cmake: _C.so uses the libstdc++.so.6 torch loads; a private static copy of the iostream
    code made every TORCH_CHECK message that formats a number segfault (GPU machine, /opt/gcc toolchain)."""
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) not found")
    assert _libstdcxx_guard().copied_members(nm, str(mistral_kernels.library_path())) == []
    with pytest.raises(RuntimeError, match=r"weight.shape\[0\] must be 64 \(H = x.shape\[-1\]\), got shape \[63\]"):
        mistral_kernels.ops.rms_norm(torch.randn(4, 64), torch.ones(63))  # the numbers survive formatting


def test_libstdcxx_guard_catches_a_static_copy(tmp_path: Path) -> None:
    """The guard fails a shared library linked with a static libstdc++ (what the /opt/gcc driver did)."""
    nm, cxx = shutil.which("nm"), shutil.which("g++")
    if nm is None or cxx is None:
        pytest.skip("nm or g++ not found")
    src = tmp_path / "probe.cc"
    src.write_text("#include <sstream>\nstd::string f(long v) { std::ostringstream s; s << v; return s.str(); }\n")
    guard = _libstdcxx_guard()
    for flags, copied in (([], False), (["-static-libstdc++"], True)):
        lib = tmp_path / f"probe{len(flags)}.so"
        subprocess.run([cxx, "-fPIC", "-shared", *flags, str(src), "-o", str(lib)], check=True, timeout=120)
        assert bool(guard.copied_members(nm, str(lib))) == copied, flags


def test_cuda_build_is_real() -> None:
    if not mistral_kernels.cuda_compiled():
        if os.environ.get("MK_REQUIRE_CUDA") == "1":
            pytest.fail("MK_REQUIRE_CUDA=1 but the CUDA kernels were not built")
        pytest.skip("CPU-only build")
    for n in _op_names("mistral_kernels"):
        if n.split("::")[1] not in CPU_ONLY_OPS:
            assert torch._C._dispatch_has_kernel_for_dispatch_key(n, "CUDA"), f"{n} has no CUDA kernel"
    archs = _fatbin_archs(str(mistral_kernels.library_path()))
    # scripts/gpu_check.sh builds for its GPU only (MK_EXPECTED_CUDA_ARCHS=9.0); a release build has both.
    expected = os.environ.get("MK_EXPECTED_CUDA_ARCHS", "8.0;9.0").split(";")
    want = {(_ELF_CUBIN, int(a.replace(".", ""))) for a in expected}
    assert want <= archs, f"fatbin entries (kind, sm): {sorted(archs)}, expected sm {expected}"
