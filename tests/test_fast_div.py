"""FastDiv (csrc/kernels/fast_div.h: n / d as a multiply and a shift, used by the attention kernels for a key's
block) equals the integer divide for every numerator in [0, 2^31): tests/plan/fast_div_check.cpp, compiled
with g++, compares it with `/` over divisors 1 … 4096 at every quotient boundary and the range's ends, and two
million random (n, d) pairs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GXX = shutil.which("g++")


def test_fast_div_matches_the_divide(tmp_path: Path) -> None:
    if GXX is None:
        pytest.skip("g++ not found")
    exe = tmp_path / "fast_div_check"
    r = subprocess.run([GXX, "-std=c++20", "-O2", "-Wall", "-Werror", f"-I{ROOT / 'csrc'}",
                        str(ROOT / "tests/plan/fast_div_check.cpp"), "-o", str(exe)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.startswith("ok "), out.stdout + out.stderr
