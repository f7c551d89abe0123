"""moe_qgemm — the expert projections on packed expert stacks over rows grouped by expert — against
reference.moe_qgemm (per segment: the ``gguf`` package's dequantization + fp32 matmul, gate / up rounded to x's
dtype, silu_and_mul): the native CPU op (csrc/cpu/moe_quant.cpp) and the CUDA kernels (csrc/kernels/
moe_qgemm.cuh) under the SIMT emulator in all three schedules. Every format, fp32 / bf16 / fp16, plain and gated
(SwiGLU fused), decode-sized segments (the grouped GEMV) and prefill-sized ones (the grouped tile GEMM; on the
CPU mixed with GEMV segments in one call), empty experts and rows outside every segment.

Shape letters: M rows, G experts, N out features, K in features.

Tolerance: an elementwise bound, not a fudge factor (``absprod`` = |x| · |W[g]|ᵀ, γ = K · 2⁻²⁴, u the unit
roundoff of x's dtype: 2⁻⁸ bf16, 2⁻¹¹ fp16, 0 fp32):
  * one projection: |h - ref| ≤ (u_w + 2γ) · absprod [+ the int8-activation term on the CPU for bf16] where
    u_w = u when the weights may be rounded to x's dtype (the tensor-core GEMM, the CPU's bf16 tiles), then each
    side rounds once to the dtype: + u · (2 |ref| + bound). The int8 term (CPU bf16: the decode GEMV,
    csrc/cpu/isa/quant_kernels.h, and the prefill int8 GEMM with AVX512-VNNI, csrc/cpu/isa/quant_gemm8.h):
    Σ_k (max|x| of k's chunk / 254) · |W[g, n, k]|, chunks of 256 for the K-quants and of 32 otherwise; the
    CUDA grouped GEMV with fp16 / bf16 x likewise with chunks of 16 (csrc/kernels/quant_q8x.cuh).
  * gated: with Δg, Δu the bounds of gate and up, |silu(g)·u − silu(g')·u'| ≤ 1.1·Δg·(|u| + Δu) +
    (|silu(g)| + 1.1·Δg)·Δu (silu is 1.0998-Lipschitz), then the output rounding u · (2 |ref| + bound).
A decoding mistake (a wrong nibble, scale, expert or row) is of the order of absprod itself, far above these.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mistral_kernels.ops import reference
from mistral_kernels.quant_formats import INT8_ROWWISE, QFORMATS
from mistral_kernels.quant_formats import dequantize

from .conftest import Backend
from .helpers.quant_data import FORMATS, Q8_BLOCK, Q8_INT8_DTYPES, int8_activation_bound, random_qweight

gguf = pytest.importorskip("gguf", reason="the gguf package is not installed (the test extra: pip install gguf)")

UNIT = {torch.float32: 0.0, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
# (M, offsets over G experts): expected rows per expert ≤ 8 → the grouped GEMV (MR 2 here), above → the tile
# GEMM; empty experts; rows 0 and 5 of the second layout lie in no segment (→ 0); the third mixes a 3-row and
# a 37-row segment (CPU: one GEMV and one GEMM segment in one call).
LAYOUTS = [(5, [0, 2, 2, 5, 5]), (6, [1, 1, 3, 3, 5]), (40, [0, 3, 3, 40])]
N = 13  # a tail of the GEMV's 4- (plain) and 2-column (gated) blocks and of the GEMM's 64-column tile


def _k_for(name: str) -> int:
    return 37 if name == "INT8_ROWWISE" else 256  # INT8_ROWWISE: a partial 8-unit, rows unfit for 16-byte copies


def _stack(name: str, g: int, n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    parts = [random_qweight(name, n, k, seed=seed + e) for e in range(g)]
    scales = None if parts[0][1] is None else torch.stack([s for _, s in parts])
    return torch.stack([q for q, _ in parts]), scales


def _dense(q: torch.Tensor, qtype: int, s: torch.Tensor | None) -> list[torch.Tensor]:
    return [dequantize(q[e], qtype, None if s is None else s[e]) for e in range(q.shape[0])]


def _proj_bound(x: torch.Tensor, w: torch.Tensor, ref: torch.Tensor, cpu: bool, cuda_gemv: bool,
                chunk: int = 32) -> torch.Tensor:
    """The bound of one projection's rows x [m, K] · w [N, K]ᵀ, after its rounding to x's dtype. cuda_gemv: the
    CUDA grouped GEMV ran (its fp16 / bf16 path quantizes x to int8 per 16, csrc/kernels/quant_q8x.cuh); chunk:
    the CPU's int8 activations' chunk (256 for the K-quants, 32 otherwise; GEMV and int8 GEMM alike)."""
    u = UNIT[x.dtype]
    xf = x.float()
    k = x.shape[1]
    bound = (u + 2 * k * 2.0**-24) * (xf.abs() @ w.abs().T)
    if cpu and x.dtype == torch.bfloat16 and k % chunk == 0:  # int8 activations per chunk
        bound = bound + int8_activation_bound(x, w, chunk, slack=1e-5)
    if cuda_gemv and x.dtype in Q8_INT8_DTYPES and k % Q8_BLOCK == 0:
        bound = bound + int8_activation_bound(x, w)
    return bound + u * (2 * ref.abs() + bound)


def check(backend: Backend, name: str, dtype: torch.dtype, m: int, offsets: list[int], gated: bool,
          seed: int, k: int | None = None, n: int = N, x_offset: int = 0) -> None:
    """x_offset > 0: x is passed as a view that many elements into its storage (not 16-byte aligned)."""
    qtype, k, g = QFORMATS[name].qtype, k or _k_for(name), len(offsets) - 1
    q1, s1 = _stack(name, g, n, k, seed)
    q3, s3 = _stack(name, g, n, k, seed + 50) if gated else (None, None)
    x = (torch.randn(m, k, generator=torch.Generator().manual_seed(seed)) * 0.1).to(dtype)  # fp16: no inf gate·up
    offs = torch.tensor(offsets)
    dev = [None if t is None else t.to(backend.device) for t in (x, offs, q1, s1, q3, s3)]
    if x_offset:
        storage = torch.zeros(x.numel() + x_offset, dtype=dtype, device=backend.device)
        dev[0] = storage[x_offset:].view(x.shape)
        dev[0].copy_(x.to(backend.device))
    got = backend.ops.moe_qgemm(dev[0], dev[1], dev[2], qtype, *dev[3:]).cpu()
    want = reference.moe_qgemm(x, offs, q1, qtype, s1, q3, s3)
    assert got.dtype == dtype and got.shape == (m, n)

    cpu = backend.name == "cpu"
    chunk = 256 if QFORMATS[name].block == 256 else 32
    cuda_gemv = not cpu and name != "INT8_ROWWISE" and -(-m // g) <= 8  # moe_qgemv_rows: the grouped GEMV
    bound = torch.zeros(m, n)
    w1 = _dense(q1, qtype, s1)
    w3 = _dense(q3, qtype, s3) if gated else None
    for e in range(g):
        r0, r1 = offsets[e], offsets[e + 1]
        if r1 == r0:
            continue
        a = x[r0:r1]
        gate = a.float() @ w1[e].T
        db = _proj_bound(a, w1[e], gate, cpu, cuda_gemv, chunk)
        if gated:
            up = a.float() @ w3[e].T
            du = _proj_bound(a, w3[e], up, cpu, cuda_gemv, chunk)
            act = F.silu(gate) * up
            db = 1.1 * db * (up.abs() + du) + (F.silu(gate).abs() + 1.1 * db) * du
            db = db + UNIT[dtype] * (2 * act.abs() + db)
        bound[r0:r1] = db
    err = (got.float() - want.float()).abs()
    worst = int((err - bound).flatten().argmax())
    assert bool((err <= bound + 1e-30).all()), (
        f"{name} {dtype} M={m} offsets={offsets} gated={gated}: |out - ref| = {err.flatten()[worst].item():.3e} "
        f"exceeds the bound {bound.flatten()[worst].item():.3e} at flat index {worst}")
    outside = torch.ones(m, dtype=torch.bool)
    outside[offsets[0]:offsets[-1]] = False
    assert bool((got[outside] == 0).all())  # rows in no segment


@pytest.mark.parametrize("backend", ["cpu", "emu-forward", "emu-reverse", "emu-random", "cuda"], indirect=True)
@pytest.mark.parametrize("name", FORMATS)
def test_every_format_matches_reference(backend: Backend, name: str) -> None:
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for i, (m, offsets) in enumerate(LAYOUTS):
            for gated in (False, True):
                check(backend, name, dtype, m, offsets, gated, seed=10 * i + gated)


@pytest.mark.parametrize("backend", ["cpu", "emu-random", "cuda"], indirect=True)
def test_decode_row_counts_and_large_k(backend: Backend) -> None:
    """Expected rows per expert 1, 4, 8 (GEMV MR 1 / 4 / 8, several slots per expert) and K over several x chunks."""
    for m, offsets in [(2, [0, 1, 1, 2]), (12, [0, 7, 7, 12]), (16, [0, 9, 16])]:
        check(backend, "Q4_K", torch.bfloat16, m, offsets, True, seed=m)
    check(backend, "Q8_0", torch.float32, 8, [0, 8], False, seed=3)  # G = 1, MR 8: one slot
    check(backend, "Q4_1", torch.bfloat16, 8, [0, 3, 8], True, seed=4, k=1280)  # two x chunks (KC 1024 at MR 4)


@pytest.mark.parametrize("backend", ["emu-forward", "cuda"], indirect=True)
def test_tile_gemm_x_view_off_16_bytes(backend: Backend) -> None:
    """The grouped tile GEMM copies x in 16-byte vectors: a view one element into its storage is copied by the
    glue (14 expected rows per expert: the GEMM)."""
    for gated in (False, True):
        check(backend, "Q4_0", torch.bfloat16, 40, [0, 3, 3, 40], gated, seed=8, k=128, x_offset=1)


@pytest.mark.parametrize("backend", ["cpu", "emu-forward", "emu-random"], indirect=True)
@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "INT8_ROWWISE"])
def test_prefill_segments_dequantized_once(backend: Backend, name: str) -> None:
    """> 64 rows per expert, N even, K % 8 == 0: CUDA dequantizes the experts once and runs the tensor-core grouped
    GEMM (glue/moe_quant.h moe_dequant_tc; gated with the SwiGLU fused); fp32 keeps the tile GEMM."""
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        check(backend, name, dtype, 200, [0, 110, 110, 200], True, seed=5, k=256, n=16)
        check(backend, name, dtype, 200, [3, 120, 120, 197], False, seed=6, k=256, n=16)


@pytest.mark.parametrize("backend", ["cpu", "emu-random", "cuda"], indirect=True)
def test_packed_moe_block_matches_fused_reference(backend: Backend) -> None:
    """The whole sparse MoE block on packed experts (router, permute, moe_qgemm, unpermute) vs reference.fused_moe
    on the dequantized experts, fp32: gate | up fused (one format) and unfused (w3 in another format)."""
    from mistral_kernels.packed_moe import packed_moe
    from mistral_kernels.quant_weight import QuantizedWeight

    h, i, e, t = 64, 32, 4, 5
    gen = torch.Generator().manual_seed(7)
    x, gate = torch.randn(t, h, generator=gen), torch.randn(e, h, generator=gen)

    def packed(name: str, n: int, k: int, seed: int) -> QuantizedWeight:
        q, s = _stack(name, e, n, k, seed)
        return QuantizedWeight(q, QFORMATS[name].qtype, (e, n, k), s).to(backend.device)

    for w3_format in ("Q8_0", "Q4_0"):
        w1, w3, w2 = packed("Q8_0", i, h, 1), packed(w3_format, i, h, 11), packed("Q8_0", h, i, 21)
        dev = backend.device
        got = packed_moe(backend.ops, x.to(dev), gate.to(dev), w1, w2, w3, top_k=2).cpu()
        want = reference.fused_moe(x, gate, *(w.to("cpu").dequantize() for w in (w1, w2, w3)), top_k=2)
        torch.testing.assert_close(got, want, atol=1e-5 * want.abs().max().item(), rtol=0)


@pytest.mark.parametrize("backend", ["cpu", "emu-forward"], indirect=True)
def test_bad_inputs_raise(backend: Backend) -> None:
    q8 = QFORMATS["Q8_0"].qtype
    w, _ = _stack("Q8_0", 2, 4, 64, seed=1)
    x = torch.randn(3, 64)
    offs = torch.tensor([0, 1, 3])
    with pytest.raises(RuntimeError, match="qtype 7 has no native kernel"):
        backend.ops.moe_qgemm(x, offs, w, 7)
    with pytest.raises(RuntimeError, match=r"expert_offsets\[2\]=2 breaks"):
        backend.ops.moe_qgemm(x, torch.tensor([0, 3, 2]), w, q8)
    with pytest.raises(RuntimeError, match="expert_offsets needs at least G \\+ 1 = 3"):
        backend.ops.moe_qgemm(x, torch.tensor([0, 3]), w, q8)
    with pytest.raises(RuntimeError, match="up_qweight"):
        backend.ops.moe_qgemm(x, offs, w, q8, None, w[:1].contiguous())
    with pytest.raises(RuntimeError, match="scales"):
        backend.ops.moe_qgemm(x, offs, torch.zeros(2, 4, 64, dtype=torch.int8), INT8_ROWWISE)
    with pytest.raises(RuntimeError, match="K / QK"):
        backend.ops.moe_qgemm(x, offs, w[:, :, :30].contiguous(), q8)
    with pytest.raises(ValueError, match="qweight \\[G, N"):
        backend.ops.moe_qgemm(x, offs, w[0], q8)
