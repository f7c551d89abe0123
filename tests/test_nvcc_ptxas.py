"""Register spills of the tensor-core prefill kernels: tests/nvcc/prefill_tc_kernels.cu (every fp16 / bf16 ×
head_dim instantiation of launch_paged_prefill_tc) compiled by nvcc for sm_80 and sm_90 with -Xptxas -v;
every kernel must report 0 bytes of spill stores and loads. Skips only when nvcc is absent (CI has it).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from .test_emulator import _nvcc

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "tests" / "nvcc" / "prefill_tc_kernels.cu"
ARCHS = ("sm_80", "sm_90")


def _head_dims() -> tuple[int, ...]:
    """MK_HEAD_DIMS of csrc/kernels/common.cuh: the head dims launch_paged_prefill_tc dispatches over."""
    text = (ROOT / "csrc" / "kernels" / "common.cuh").read_text()
    m = re.search(r"^#define MK_HEAD_DIMS\(X\)((?: X\(\d+\))+)$", text, re.MULTILINE)
    assert m, "#define MK_HEAD_DIMS(X) X(64) ... not found in csrc/kernels/common.cuh"
    return tuple(int(d) for d in re.findall(r"X\((\d+)\)", m.group(1)))


HEAD_DIMS = _head_dims()


def _ptxas_report(out: str) -> dict[tuple[str, str], str]:
    """{(mangled kernel, arch): its ptxas -v lines} from nvcc's combined output."""
    blocks = re.split(r"ptxas info\s*: Compiling entry function '([^']+)' for '(sm_\d+)'", out)
    return {(blocks[i], blocks[i + 1]): blocks[i + 2] for i in range(1, len(blocks) - 2, 3)}


def test_head_dim_list_is_read() -> None:
    assert HEAD_DIMS == (64, 80, 96, 128, 256)


def test_prefill_tc_kernels_do_not_spill(tmp_path: Path) -> None:
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found")
    gencode = [f"-gencode=arch=compute_{a[3:]},code={a}" for a in ARCHS]
    cmd = [nvcc, "-std=c++20", f"-I{ROOT / 'csrc'}", "-Xptxas", "-v", *gencode, "-c", str(SRC), "-o",
           str(tmp_path / "k.o")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"nvcc failed:\n{r.stderr[-4000:]}"
    report = _ptxas_report(r.stdout + r.stderr)
    for arch in ARCHS:
        for dtype in ("6__half", "13__nv_bfloat16"):  # the mangled template argument
            for d in HEAD_DIMS:
                key = next((k for k in report if k[1] == arch and f"paged_prefill_tc_kernelI{dtype}Li{d}E" in k[0]),
                           None)
                assert key is not None, f"no ptxas report for {dtype} D {d} on {arch}:\n{r.stderr[-3000:]}"
                lines = report[key]
                assert re.search(r"\b0 bytes spill stores, 0 bytes spill loads", lines), \
                    f"{key[0]} spills on {arch}: {lines.strip()}"
                regs = re.search(r"Used (\d+) registers", lines)
                assert regs and int(regs.group(1)) <= 255, lines
