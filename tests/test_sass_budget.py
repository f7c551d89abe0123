"""SASS budgets (scripts/sass_budget.py): every hot CUDA kernel instance, compiled for sm_90 and sm_80, keeps the
bytes per warp-instruction (memory-bound kernels) or the HMMA issue share (tensor-core kernels) of its hot loop
at or above its floor in scripts/sass_budgets.toml. The loop finder and the classifier are checked on
hand-written SASS (always), and the budget check is shown to fail on a deliberately padded loop
(tests/nvcc/sass_padded.cu). Needs nvcc and cuobjdump (skips, saying which is missing, otherwise; CI has both).
Cost: a warm cache (build/sass_budget) takes seconds; a cold one compiles all_kernels.cu for both archs (~2
CPU-minutes each with nvcc 13, plus ~30 s for the launchers' shared-memory helper)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import sass_analysis as sa  # noqa: E402
import sass_budget as sb  # noqa: E402

needs_tools = pytest.mark.skipif(sb.missing_tools() is not None, reason=str(sb.missing_tools()))

# Hand-written sm_90-style SASS (cuobjdump layout): an outer loop 0x30..0x120 holding an inner loop 0x50..0x90
# with a divergent shuffle fall-back out of line (0x140), and a guarded block 0xb0..0xc0 (a rare refresh).
SASS = """
\t\tFunction : _Z4testv
        /*0000*/                   S2R R0, SR_TID.X ;
        /*0010*/                   IMAD.MOV.U32 R2, RZ, RZ, RZ ;
        /*0020*/                   MOV R3, 0x0 ;
        /*0030*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0040*/                   IADD3 R2, R2, 0x10, RZ ;
        /*0050*/                   FFMA R8, R4, R5, R8 ;
        /*0060*/                   BRA.DIV UR4, 0x140 ;
        /*0070*/                   SHFL.BFLY PT, R9, R8, 0x1, 0x1f ;
        /*0080*/                   ISETP.GE.AND P1, PT, R9, 0x4, PT ;
        /*0090*/               @P1 BRA 0x50 ;
        /*00a0*/               @P0 BRA 0xd0 ;
        /*00b0*/                   LDG.E R10, desc[UR4][R2.64] ;
        /*00c0*/                   IADD3 R10, R10, 0x1, RZ ;
        /*00d0*/                   HMMA.16816.F32.BF16 R12, R4, R6, R12 ;
        /*00e0*/                   F2FP.BF16.F32.PACK_AB R11, R8, R9 ;
        /*00f0*/                   ISETP.NE.AND P2, PT, R2, 0x100, PT ;
        /*0100*/                   LDS R1, [R0] ;
        /*0110*/                   NOP ;
        /*0120*/               @P2 BRA 0x30 ;
        /*0130*/                   EXIT ;
        /*0140*/                   SHFL.BFLY PT, R9, R8, 0x1, 0x1f ;
        /*0150*/                   BRA 0x80 ;
        /*0160*/                   BRA 0x160 ;
"""


def _code() -> list[sa.Instr]:
    ((name, code),) = list(sa.functions(iter(SASS.splitlines())))
    assert name == "_Z4testv"
    return code


def test_classes_and_widths() -> None:
    code = {i.addr: i for i in _code()}
    assert code[0x30].cls == "memory" and code[0x30].global_load_bytes() == 512
    assert code[0xb0].global_load_bytes() == 128 and code[0x100].global_load_bytes() == 0  # LDS: not global
    assert [code[a].cls for a in (0x50, 0x40, 0xd0, 0xe0, 0x90, 0x70)] == ["fp", "int", "tensor", "conversion",
                                                                           "control", "int"]
    assert code[0x90].guard == "@P1" and code[0x30].mods == ("E", "128")


def test_loops_from_the_control_flow() -> None:
    code = _code()
    bl = sa.blocks(code)
    found = {code[bl[lp.header].start].addr: lp for lp in sa.loops(bl)}
    # outer and inner; not the unreachable trap `BRA .`, and the out-of-line shuffle fall-back's jump back into
    # the inner loop (0x150 → 0x80) is no back edge: 0x80 does not dominate 0x140
    assert set(found) == {0x30, 0x50}
    assert found[0x30].contains(found[0x50]) and not found[0x50].contains(found[0x30])


def test_hot_loop_per_kind_of_work() -> None:
    code = _code()
    inner = sa.hot_loop(code, "any")  # innermost: the inner loop, without the BRA.DIV fall-back
    assert inner and (inner.first_addr, inner.last_addr, inner.instructions) == (0x50, 0x90, 5)
    tensor = sa.hot_loop(code, "tensor")  # the innermost loop holding HMMA: the outer one, inner loop once
    assert tensor and tensor.hmma == 1 and tensor.first_addr == 0x30 and tensor.last_addr == 0x120
    # most work (the guarded LDG at 0xb0 adds bytes), then longest: every block of 0x30..0x120 but 0x140..
    assert tensor.instructions == 16
    memory = sa.hot_loop(code, "memory")
    assert memory and memory.global_bytes == 512 + 128 and memory.instructions == 16
    assert memory.by_class["memory"] == 3 and memory.by_class["tensor"] == 1


def _padded_table(floor: float) -> sb.Table:
    table = sb.load_table()
    fam = sb.Family("stream_sum_kernel<*", "memory", "tests/nvcc/sass_padded.cu", None, "")
    floors = {("sm_90", "stream_sum_kernel<0>"): floor, ("sm_90", "stream_sum_kernel<16>"): floor}
    return sb.Table(table.gpus, [fam], floors, table.margin)


@needs_tools
def test_padded_loop_fails_its_budget() -> None:
    kernels = sb.measure(ROOT / "tests" / "nvcc" / "sass_padded.cu", "sm_90")
    plain, padded = kernels["stream_sum_kernel<0>"], kernels["stream_sum_kernel<16>"]
    pm, dm = plain.mix("memory"), padded.mix("memory")
    assert pm and dm and pm["global_bytes"] == dm["global_bytes"] == 512  # one LDG.E.128 per lane and iteration
    assert dm["by_class"]["int"] >= pm["by_class"]["int"] + 32  # 16 × (shift, xor, multiply-add) at least
    budget = 16.0  # bytes per warp-instruction
    rows = {r.kernel.name: r for r in sb.evaluate(kernels, _padded_table(budget))}
    assert rows["stream_sum_kernel<0>"].ok, rows["stream_sum_kernel<0>"].figure
    bad = rows["stream_sum_kernel<16>"]
    assert not bad.ok
    msg = bad.violation()
    assert "stream_sum_kernel<16>" in msg and "floor 16.000" in msg and f"{bad.figure:.3f}" in msg


@pytest.fixture(scope="module")
def rows() -> list[sb.Row]:
    if sb.missing_tools():
        pytest.skip(str(sb.missing_tools()))
    return sb.evaluate(sb.measure_all(), sb.load_table())


@needs_tools
def test_every_family_is_measured_on_every_arch(rows: list[sb.Row]) -> None:
    table = sb.load_table()
    for fam in table.families:
        for arch in sb.ARCHS:
            assert any(r.family == fam for r in rows if r.kernel.arch == arch), \
                f"no kernel of {fam.pattern} with a hot loop of kind {fam.kind} on {arch}"


@needs_tools
def test_floors_match_the_measured_kernels(rows: list[sb.Row]) -> None:
    """Every budgeted instance has a floor and every floor names a measured instance (a kernel renamed, removed
    or without its hot loop any more shows up here): `python scripts/sass_budget.py --update-floors`."""
    table = sb.load_table()
    measured = {(r.kernel.arch, r.kernel.name) for r in rows}
    missing = sorted(measured - set(table.floors))
    stale = sorted(set(table.floors) - measured)
    assert not missing and not stale, (f"kernels without a floor: {missing}\nfloors of kernels not measured: {stale}"
                                       "\nrun `python scripts/sass_budget.py --update-floors` and review the diff")


@needs_tools
def test_kernels_meet_their_floors(rows: list[sb.Row]) -> None:
    bad = [r.violation() for r in rows if not r.ok]
    assert not bad, "hot loops below their SASS budget:\n" + "\n".join(bad)


@needs_tools
def test_no_hot_kernel_spills(rows: list[sb.Row]) -> None:
    spills = [f"{r.kernel.name} on {r.kernel.arch}: {r.kernel.spill_bytes} B" for r in rows if r.kernel.spill_bytes]
    assert not spills, spills
