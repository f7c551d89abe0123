"""Resources of every CUDA kernel instance we build (what the emulator cannot see):
tests/nvcc/all_kernels.cu (every launcher of csrc/kernels for fp32 / fp16 / bf16 and every head_dim) compiled
by nvcc for sm_80 and sm_90 with -Xptxas -v, its PTX kept for the launch bounds (.maxntid / .minnctapersm),
and tests/nvcc/dyn_smem.cpp (g++) for the dynamic shared memory each launcher requests. Per kernel and arch:
  * 0 bytes of spill stores / loads;
  * registers ≤ 255 and registers × threads ≤ 65,536 (a block fits the register file);
  * static shared memory ≤ 48 KB; static + dynamic ≤ the opt-in limit of every GPU the cubin runs on
    (sm_80 cubins: A100 163 KiB and sm_86 / sm_89 99 KiB; sm_90: H100 227 KiB);
  * where a kernel header promises a minimum of resident blocks (__launch_bounds__' second argument), the
    register allocation allows that many blocks per SM.
KNOWN lists today's violations (kernels owned elsewhere): a new one fails, a fixed one only warns.
Skips only when nvcc is absent (CI has it).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from .helpers.emulator import GXX, _nvcc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import sass_budget  # noqa: E402
SRC = ROOT / "tests" / "nvcc" / "all_kernels.cu"
ARCHS = ("sm_80", "sm_90")
# GPUs each cubin runs on → per-block opt-in shared memory limit (bytes).
SMEM_LIMIT = {"sm_80": {"sm_80": 163 * 1024, "sm_86": 99 * 1024, "sm_89": 99 * 1024}, "sm_90": {"sm_90": 227 * 1024}}
STATIC_SMEM_LIMIT = 48 * 1024
REGS_PER_SM = 65536

# (kernel, GPU) → why it violates; a fixed kernel warns until it is removed from here.
KNOWN = {
    ("paged_prefill_kernel<float, 256>", "sm_86"): "smem: fp32 D 256 SIMT prefill needs 139,264 B > 99 KiB",
    ("paged_prefill_kernel<float, 256>", "sm_89"): "smem: fp32 D 256 SIMT prefill needs 139,264 B > 99 KiB",
}


def _head_dims() -> tuple[int, ...]:
    """MK_HEAD_DIMS of csrc/kernels/common.cuh: the head dims the attention launchers dispatch over."""
    text = (ROOT / "csrc" / "kernels" / "common.cuh").read_text()
    m = re.search(r"^#define MK_HEAD_DIMS\(X\)((?: X\(\d+\))+)$", text, re.MULTILINE)
    assert m, "#define MK_HEAD_DIMS(X) X(64) ... not found in csrc/kernels/common.cuh"
    return tuple(int(d) for d in re.findall(r"X\((\d+)\)", m.group(1)))


HEAD_DIMS = _head_dims()


@dataclasses.dataclass
class Kernel:
    name: str  # demangled, without namespace and parameters: "paged_prefill_tc_kernel<__half, 64>"
    arch: str
    registers: int
    spill_stores: int
    spill_loads: int
    static_smem: int
    max_threads: int  # .maxntid (x·y·z)
    min_blocks: int  # .minnctapersm, 0 if none
    dynamic_smem: int = 0


_short = sass_budget.short_name  # one demangled-name rule for both checks


def _compile(arch: str) -> tuple[str, str]:
    """(ptxas -v report, PTX) of all_kernels.cu for arch: the cubin scripts/sass_budget.py builds with the CUDA
    flags of the module's build (cached under build/sass_budget by source hash, shared with
    tests/test_sass_budget.py)."""
    out = sass_budget.compiled(SRC, arch)
    return (out / "ptxas.txt").read_text(), next(out.glob("*.ptx")).read_text()


def _parse(arch: str, report: str, ptx: str) -> dict[str, Kernel]:
    bounds: dict[str, tuple[int, int]] = {}
    for m in re.finditer(r"\.entry (\S+)\((.*?)\{", ptx, re.DOTALL):
        body = m.group(2)
        ntid = re.search(r"\.maxntid (\d+), (\d+), (\d+)", body)
        cta = re.search(r"\.minnctapersm (\d+)", body)
        threads = int(ntid[1]) * int(ntid[2]) * int(ntid[3]) if ntid else 0
        bounds[m.group(1)] = (threads, int(cta[1]) if cta else 0)
    blocks = re.split(r"ptxas info\s*: Compiling entry function '([^']+)' for '(sm_\d+)'", report)
    mangled = [blocks[i] for i in range(1, len(blocks) - 2, 3)]
    demangled = subprocess.run(["c++filt"], input="\n".join(mangled), capture_output=True, text=True).stdout.split("\n")
    kernels = {}
    for j, i in enumerate(range(1, len(blocks) - 2, 3)):
        text = blocks[i + 2]
        spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)
        regs = re.search(r"Used (\d+) registers", text)
        smem = re.search(r"(\d+) bytes smem", text)
        assert spill and regs, f"unparsed ptxas report for {blocks[i]}:\n{text}"
        threads, min_blocks = bounds.get(blocks[i], (0, 0))
        k = Kernel(_short(demangled[j]), arch, int(regs[1]), int(spill[1]), int(spill[2]),
                   int(smem[1]) if smem else 0, threads, min_blocks)
        kernels[k.name] = k
    return kernels


@pytest.fixture(scope="module")
def kernels() -> list[Kernel]:
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found")
    if GXX is None:
        pytest.skip("g++ not found")
    with concurrent.futures.ThreadPoolExecutor(3) as pool:  # both archs and the g++ helper at once
        futures = {a: pool.submit(_compile, a) for a in ARCHS}
        dynamic = sass_budget.dynamic_smem()  # tests/nvcc/dyn_smem.cpp, built by g++ and run (cached)
        results = {a: f.result() for a, f in futures.items()}
    out = []
    for arch, (report, ptx) in results.items():
        parsed = _parse(arch, report, ptx)
        unknown = set(dynamic) - set(parsed)
        assert not unknown, f"dyn_smem.cpp names kernels nvcc did not build for {arch}: {sorted(unknown)}"
        for k in parsed.values():
            k.dynamic_smem = int(dynamic.get(k.name, 0))
            out.append(k)
    return out


def _check(found: dict[tuple[str, str], str], kind: str) -> None:
    known = {k: v for k, v in KNOWN.items() if v.startswith(kind)}
    new = {k: v for k, v in found.items() if k not in known}
    gone = [k for k in known if k not in found]
    assert not new, f"{kind} violations:\n" + "\n".join(f"  {k[0]} on {k[1]}: {v}" for k, v in sorted(new.items()))
    if gone:  # fixed elsewhere (kernels change on other branches): say so, do not fail
        warnings.warn(f"KNOWN {kind} violations no longer occur, remove them from KNOWN: {gone}", stacklevel=2)


def test_head_dim_list_is_read() -> None:
    """The parse found a list (no hand copy here): distinct, increasing, multiples of 16 (the mma k-step)."""
    assert len(HEAD_DIMS) >= 2, HEAD_DIMS
    assert list(HEAD_DIMS) == sorted(set(HEAD_DIMS)), HEAD_DIMS
    assert all(d % 16 == 0 for d in HEAD_DIMS), HEAD_DIMS


def test_every_kernel_instance_is_built(kernels: list[Kernel]) -> None:
    names = {(k.name, k.arch) for k in kernels}
    for arch in ARCHS:
        for d in HEAD_DIMS:
            for t in ("float", "__half", "__nv_bfloat16"):
                assert (f"paged_prefill_kernel<{t}, {d}>", arch) in names
                assert any(n.startswith(f"paged_decode_kernel<{t}, {d},") and a == arch for n, a in names)
            for t in ("__half", "__nv_bfloat16"):
                assert (f"paged_prefill_tc_kernel<{t}, {d}>", arch) in names
        for family in ("rms_norm_kernel", "silu_and_mul_kernel", "rotary_embedding_kernel", "reshape_and_cache_kernel",
                       "rotary_embedding_and_cache_kernel",
                       "grouped_gemm_nt_kernel", "topk_softmax_kernel", "moe_scatter_kernel", "moe_unpermute_kernel",
                       "moe_columns_kernel", "moe_offsets_kernel", "moe_rank_kernel",
                       "paged_decode_reduce_kernel", "quant_gemv_kernel", "quant_gemm_kernel",
                       "moe_qgemv_kernel", "moe_qgemm_kernel", "quant_gemv_q8_kernel", "moe_qgemv_q8_kernel",
                       "quantize_x_q8_kernel", "quant_dequantize_kernel"):
            assert any(n.startswith(family) and a == arch for n, a in names), f"{family} missing for {arch}"
    assert all(k.max_threads > 0 for k in kernels), [k.name for k in kernels if not k.max_threads]


def test_no_register_spills(kernels: list[Kernel]) -> None:
    _check({(k.name, k.arch): f"spills: {k.spill_stores} bytes" for k in kernels if k.spill_stores or k.spill_loads},
           "spills")


def test_registers_fit_the_block(kernels: list[Kernel]) -> None:
    bad = [f"{k.name} on {k.arch}: {k.registers} registers × {k.max_threads} threads" for k in kernels
           if k.registers > 255 or k.registers * k.max_threads > REGS_PER_SM]
    assert not bad, "\n".join(bad)


def test_shared_memory_fits_every_target(kernels: list[Kernel]) -> None:
    static = [f"{k.name} on {k.arch}: {k.static_smem} B static" for k in kernels if k.static_smem > STATIC_SMEM_LIMIT]
    assert not static, "\n".join(static)
    _check({(k.name, gpu): f"smem: {k.static_smem} + {k.dynamic_smem} B > {limit}"
            for k in kernels for gpu, limit in SMEM_LIMIT[k.arch].items()
            if k.static_smem + k.dynamic_smem > limit}, "smem")


def test_promised_blocks_per_sm(kernels: list[Kernel]) -> None:
    """__launch_bounds__(threads, min_blocks): the register allocation (per warp, 256-register granules)
    must let min_blocks blocks reside on one SM."""
    bad = []
    for k in kernels:
        if not k.min_blocks:
            continue
        per_warp = -(-k.registers * 32 // 256) * 256
        resident = REGS_PER_SM // (per_warp * -(-k.max_threads // 32))
        if resident < k.min_blocks:
            bad.append(f"{k.name} on {k.arch}: {k.registers} registers allow {resident} blocks, header promises "
                       f"{k.min_blocks}")
    assert any(k.min_blocks for k in kernels), "no kernel promises blocks per SM: .minnctapersm not parsed"
    assert not bad, "\n".join(bad)
