"""ops.qlinear on CPU (csrc/cpu/quant.cpp) against reference.qlinear: the ``gguf`` package's own dequantization
followed by a fp32 matmul. Random packed weights: tests/helpers/quant_data.py.

Shape letters: M rows of x, K in features, N out features, QK elements per block.

Tolerances (bounds, not fudge factors; ``absprod`` = |x| · |W|ᵀ, γ = K · 2⁻²⁴):
  * fp32 x: the activations are not quantized, so both sides compute the same fp32 dot products in a different
    order: |out - ref| ≤ 2γ · absprod.
  * bf16 x, M ≤ 16 (GEMV): on the SIMD levels the activations are quantized to int8, per 32 for the 32-blocks
    and per 256 for the K-quants (csrc/cpu/isa/quant_codes.h: |x - dx·q| ≤ dx / 2 with dx = max|x| / 127 over
    the chunk), so |out - ref| ≤ Σ_k (max|x| of k's chunk / 254) · |W[n, k]| + 2γ · absprod — the bound applies
    to every format (those computed exactly, INT8_ROWWISE and everything at the generic level, are well inside
    it); then each side rounds once to bf16 (≤ 2⁻⁸ relative each). The per-256 path is also checked against
    an independent numpy model of its quantization (test_qlinear_kquant_int8_matches_numpy_model), tightly.
  * bf16 x, M > 16 (prefill) at the AVX512-VNNI level (avx512bf16), every block format: the int8 GEMM
    (csrc/cpu/isa/quant_gemm8.h), x quantized as the GEMV's: the same bound.
  * bf16 x, M > 16 (prefill) elsewhere: the dequantized tile is bf16, so every weight is rounded (≤ 2⁻⁹
    relative) before the GEMM: |out - ref| ≤ (2⁻⁹ + 2γ) · absprod, then the two bf16 roundings.
  * fp16 x: converted to fp32 (exact), fp32 path, one fp16 rounding each side (≤ 2⁻¹¹ relative).
Any decoding mistake (a wrong nibble, scale or bit) is of the order of absprod itself, far above these bounds.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch


from mistral_kernels import ops, reference
from mistral_kernels._library import cpu_isa, cpu_isa_supported, set_cpu_isa
from mistral_kernels.quant_formats import INT8_ROWWISE, QFORMATS
from mistral_kernels.quant_formats import dequantize

from .helpers.quant_data import FORMATS, random_qweight

GEMV_MAX_M = 16  # kGemvMaxM in csrc/cpu/quant.cpp: larger M takes a GEMM
GEMM8_FORMATS = ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")  # the int8 GEMM's (isa/quant_gemm8.cpp)


def _int8_chunk(name: str, m: int, dtype: torch.dtype) -> int | None:
    """The chunk of the int8 activations of bf16 x on M = m rows of format ``name`` at the running level, None
    where the activations are not quantized (fp32 / fp16 x, or the dequantized-tile GEMM)."""
    if dtype != torch.bfloat16:
        return None
    chunk = 256 if QFORMATS[name].block == 256 else 32  # per 256 for the K-quants, per 32 for the 32-blocks
    if m <= GEMV_MAX_M:
        return chunk
    return chunk if cpu_isa() == "avx512bf16" and name in GEMM8_FORMATS else None


def _k_for(name: str) -> int:
    """K a multiple of QK but of nothing bigger (3 blocks); INT8_ROWWISE (QK 1): an odd K with a SIMD tail."""
    qk = QFORMATS[name].block
    return 37 if qk == 1 else 3 * qk


def _check(name: str, x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor | None, out: torch.Tensor) -> None:
    qtype = QFORMATS[name].qtype
    w = dequantize(qweight, qtype, scales)
    expect = reference.qlinear(x, qweight, qtype, scales)
    assert out.shape == expect.shape and out.dtype == x.dtype
    m, k = x.shape[-2] if x.dim() > 1 else 1, x.shape[-1]
    absprod = x.float().abs() @ w.abs().T
    gamma = k * 2.0**-24
    chunk = _int8_chunk(name, m, x.dtype)
    w_rel = 2.0**-9 if x.dtype == torch.bfloat16 and m > GEMV_MAX_M and chunk is None else 0.0
    bound = (w_rel + 2 * gamma) * absprod + 1e-30
    if chunk is not None and k % chunk == 0:  # int8 activations
        chunk_max = x.float().abs().reshape(x.shape[0], k // chunk, chunk).amax(-1)
        bound = bound + (chunk_max.repeat_interleave(chunk, dim=1) / 254 * (1 + 1e-5)) @ w.abs().T
    out_rel = {torch.float32: 0.0, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}[x.dtype]
    bound = bound + out_rel * (2 * expect.float().abs() + bound)
    err = (out.float() - expect.float()).abs()
    worst = int((err - bound).flatten().argmax())
    assert bool((err <= bound).all()), (
        f"{name} {tuple(x.shape)} {x.dtype}: |out - ref| = {err.flatten()[worst].item():.3e} exceeds the bound "
        f"{bound.flatten()[worst].item():.3e} at flat index {worst}"
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M", [1, 3, 16, 17, 40, 64])  # prefill: x in blocks of 16 rows, pairs + a lone block
@pytest.mark.parametrize("name", FORMATS)
def test_qlinear_matches_gguf_dequantize_matmul(name: str, M: int, dtype: torch.dtype) -> None:
    k = _k_for(name)
    for n in (7, 33):
        qweight, scales = random_qweight(name, n, k, seed=n * 100 + M)
        x = torch.randn(M, k, generator=torch.Generator().manual_seed(M + n)).to(dtype)
        _check(name, x, qweight, scales, ops.qlinear(x, qweight, QFORMATS[name].qtype, scales))


@pytest.mark.parametrize("name", FORMATS)
def test_qlinear_fp16_leading_dims_and_out(name: str) -> None:
    k = _k_for(name)
    qweight, scales = random_qweight(name, 9, k, seed=5)
    for shape in ((2, 3, k), (3, 7, k)):  # 6 rows: GEMV; 21 rows: GEMM
        x = torch.randn(shape, generator=torch.Generator().manual_seed(shape[1])).half()
        out = torch.empty(*shape[:-1], 9, dtype=torch.float16)
        assert ops.qlinear(x, qweight, QFORMATS[name].qtype, scales, out=out) is out
        _check(name, x.reshape(-1, k), qweight, scales, out.reshape(-1, 9))


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"])
def test_qlinear_int8_rows_long_k_and_row_invariance(name: str) -> None:
    # bf16 x at M <= 16 on the int8 paths with K spanning whole groups of 256 and, for the 32-blocks, a tail (K = 576:
    # SmolLM2's, 2 groups + 2 blocks; K = 608: 2 groups + 3 blocks; the AVX512-VNNI kernel arranges each group's
    # lanes by block, the tail per chunk): within the bound, random bytes included (extreme codes and scales), a NaN
    # row NaN, and every row of an M-row call equal bit for bit to the same row alone — the property that makes a
    # speculative verify row equal the plain decode of its token.
    qk = QFORMATS[name].block
    qtype = QFORMATS[name].qtype
    for k in ((576, 608, 1024) if qk == 32 else (768, 1280)):
        for random_bytes in (False, True):
            qweight, _ = random_qweight(name, 19, k, seed=k + random_bytes, random_bytes=random_bytes)
            g = torch.Generator().manual_seed(k)
            x = (torch.randn(16, k, generator=g) * torch.rand(16, k, generator=g) * 3).to(torch.bfloat16)
            x[2, k // 3] = float("nan")
            for m in (1, 2, 3, 5, 8, 16):
                out = ops.qlinear(x[:m], qweight, qtype)
                if m > 2:
                    assert out[2].isnan().all(), (name, k, m)
                keep = torch.arange(m) != 2
                _check(name, x[:m][keep], qweight, None, out[keep])
                for i in range(m):
                    if i != 2:
                        alone = ops.qlinear(x[i:i + 1], qweight, qtype)
                        assert torch.equal(out[i], alone[0]), (name, k, m, i, random_bytes)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qlinear_prefill_spans_several_weight_tiles(dtype: torch.dtype) -> None:
    # The GEMM path decodes W in equal tiles, a multiple of the thread count of them, the last one partial: fp32 x
    # <= ~1 MB dequantized (kTileBytes): N = 700 rows of K = 768 are 3 tiles of 240 rows at 1 thread, 4 of 176 at
    # 2; bf16 x on the int8 GEMM <= 512 KB decoded (kTile8Bytes, ~940 bytes a row): 2 tiles of 350 at 1 or 2.
    qweight, _ = random_qweight("Q4_K", 700, 768, seed=1)
    x = torch.randn(20, 768, generator=torch.Generator().manual_seed(2)).to(dtype)
    _check("Q4_K", x, qweight, None, ops.qlinear(x, qweight, QFORMATS["Q4_K"].qtype))


def test_qlinear_independent_of_thread_count() -> None:
    qweight, _ = random_qweight("Q4_0", 3000, 96, seed=3)
    x = torch.randn(3, 96, generator=torch.Generator().manual_seed(3))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ops.qlinear(x, qweight, QFORMATS["Q4_0"].qtype)
        torch.set_num_threads(max(2, threads))
        many = ops.qlinear(x, qweight, QFORMATS["Q4_0"].qtype)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, many)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", FORMATS)
def test_qlinear_nan_activations_give_nan_rows(name: str, dtype: torch.dtype) -> None:
    # A NaN in a row of x makes that row of the output NaN (as the fp32 matmul's), on every path; other rows
    # are untouched. (The int8 path checks finiteness per 32 activations before quantizing them.)
    k = _k_for(name)
    qweight, scales = random_qweight(name, 5, k, seed=7)
    for m in (3, 20):  # GEMV, GEMM
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(dtype)
        x[1, k // 2] = float("nan")
        out = ops.qlinear(x, qweight, QFORMATS[name].qtype, scales)
        assert out[1].isnan().all(), (name, m, out[1])
        keep = torch.arange(m) != 1
        _check(name, x[keep], qweight, scales, out[keep])


@pytest.mark.parametrize("name", ["Q8_0", "Q6_K", "Q5_K", "Q4_1"])
def test_qlinear_int8_path_extreme_codes_do_not_saturate(name: str) -> None:
    # bf16 x at M <= 16 takes the int8 path where the level has one; AVX2 sums pairs of code x activation
    # products in int16 (vpmaddubsw). Random blocks hold the extreme codes (Q8_0's -128, Q6_K's -32 / 31, Q5_K's
    # 31), and activations of equal magnitude quantize to +-127 exactly (no quantization error): a saturated
    # pair sum would be off by far more than the bound.
    k = _k_for(name)
    qweight, scales = random_qweight(name, 9, k, seed=11, random_bytes=True)
    g = torch.Generator().manual_seed(12)
    x = (torch.where(torch.rand(2, k, generator=g) < 0.5, -3.0, 3.0)).to(torch.bfloat16)
    _check(name, x, qweight, scales, ops.qlinear(x, qweight, QFORMATS[name].qtype, scales))


def test_qlinear_bad_inputs_name_the_argument() -> None:
    op = torch.ops.mistral_kernels.qlinear
    q4, _ = random_qweight("Q4_0", 4, 64, seed=0)  # [4, 2 · 18]
    i8, s8 = random_qweight("INT8_ROWWISE", 4, 64, seed=0)
    x, out = torch.randn(2, 64), torch.empty(2, 4)
    q4_0, q4_k = QFORMATS["Q4_0"].qtype, QFORMATS["Q4_K"].qtype
    cases = [
        ((out, x, q4, None, 6), r"qtype 6 has no native kernel"),  # Q5_0: dequantized at load instead
        ((out, x, q4, None, q4_k), r"K = x.shape\[1\] = 64 must be a multiple of 256 for Q4_K"),
        ((out, x, q4[:, :-1].contiguous(), None, q4_0), r"qweight"),  # wrong row bytes
        ((out, x, q4.view(torch.int8), None, q4_0), r"qweight"),  # packed blocks are uint8
        ((out, x, q4, torch.ones(4), q4_0), r"scales must be None for Q4_0"),
        ((out, x, i8, None, INT8_ROWWISE), r"scales \[N\] fp32 is required for INT8_ROWWISE"),
        ((out, x, i8, s8[:3].contiguous(), INT8_ROWWISE), r"scales"),
        ((out, x, i8, s8.double(), INT8_ROWWISE), r"scales"),
        ((out, x[:, :63].contiguous(), i8, s8, INT8_ROWWISE), r"qweight"),  # K mismatch
        ((torch.empty(2, 5), x, q4, None, q4_0), r"out must be \[M, N\]"),
        ((torch.empty(2, 4, dtype=torch.bfloat16), x, q4, None, q4_0), r"out"),
        ((out, x.int(), q4, None, q4_0), r"x"),
        ((out, x.t().contiguous().t(), q4, None, q4_0), r"x"),  # not contiguous
    ]
    for args, message in cases:
        with pytest.raises(RuntimeError, match=message):
            op(*args)


def test_qlinear_empty_shapes() -> None:
    q4, _ = random_qweight("Q4_0", 4, 64, seed=0)
    assert ops.qlinear(torch.randn(0, 64), q4, QFORMATS["Q4_0"].qtype).shape == (0, 4)
    empty_w = torch.empty(0, 36, dtype=torch.uint8)
    assert ops.qlinear(torch.randn(3, 64), empty_w, QFORMATS["Q4_0"].qtype).shape == (3, 0)


def _q8k_model(x: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """x [M, K] (bf16) as the per-256 int8 path (or per ``chunk``) sees it, written independently in numpy: per
    256, amax = max |x|,
    q = round-half-even(x · fp32(127 / amax)) (one fp32 product, as the kernel), then dk · q with dk = amax / 127
    in fp32; returned as float64 [M, K]."""
    xf = x.float().numpy().reshape(x.shape[0], -1, chunk)
    amax = np.abs(xf).max(-1, keepdims=True)
    inv = np.zeros_like(amax)
    np.divide(np.float32(127), amax, out=inv, where=amax > 0)  # fp32 / fp32, as the kernel
    q = np.rint((xf * inv).astype(np.float32))
    assert np.abs(q).max() <= 127
    dk = (amax / np.float32(127)).astype(np.float32)
    return torch.from_numpy((q.astype(np.float64) * dk.astype(np.float64)).reshape(x.shape[0], -1))


@pytest.mark.parametrize("M", [1, 2, 3, 5, 8, 16])
@pytest.mark.parametrize("name", ["Q4_K", "Q5_K", "Q6_K"])
def test_qlinear_kquant_int8_matches_numpy_model(name: str, M: int) -> None:
    # bf16 x at M <= 16 on a SIMD level: the K-quants' int8 path (activations per 256, integer sums per
    # super-block). Against the gguf package's dequantized W times x quantized by _q8k_model in float64: the
    # integer sums are exact, what remains is fp32 rounding of the per-block scale products and the sums:
    # |out - model| <= 2^-16 · Σ |w| · |dk · q| (a wrong code, scale, min or bit moves the sum by ~1/K of that,
    # K = 768: 2^-9.6 — far above), then one bf16 rounding (2^-8 relative). Every ISA level (the generic one
    # in portable C++) runs this path: scripts/isa_tests.sh runs this file at each.
    k = 3 * 256
    qtype = QFORMATS[name].qtype
    for n in (5, 37):
        for random_bytes in (False, True):  # random bytes: extreme codes and scales (Q6_K's -128 scale)
            qweight, _ = random_qweight(name, n, k, seed=n + M, random_bytes=random_bytes)
            g = torch.Generator().manual_seed(M * 7 + n)
            x = (torch.randn(M, k, generator=g) * torch.rand(M, k, generator=g) * 4).to(torch.bfloat16)
            x[0, :256] = 0.0  # an all-zero super-block: dk = 0
            w = dequantize(qweight, qtype, None).double()
            xm = _q8k_model(x)
            model = xm @ w.T
            absq = xm.abs() @ w.abs().T
            out = ops.qlinear(x, qweight, qtype)
            bound = 2.0**-16 * absq + 2.0**-8 * (model.abs() + 2.0**-16 * absq) + 1e-30
            err = (out.double() - model).abs()
            assert bool((err <= bound).all()), (name, M, n, random_bytes, float((err / bound).max()))
            # and the general bound against the exact product
            _check(name, x, qweight, None, out)


def _with_gemm8_level() -> None:
    """Runs the rest of a test at the level with the int8 GEMM (avx512bf16), or skips where this CPU lacks it."""
    if not cpu_isa_supported("avx512bf16"):
        pytest.skip("the int8 prefill GEMM needs AVX512-VNNI (the avx512bf16 level); this CPU has no such level")
    set_cpu_isa("avx512bf16")


@pytest.mark.parametrize("name", GEMM8_FORMATS)
def test_qlinear_prefill_int8_matches_numpy_model_and_rows_do_not_depend_on_m(name: str) -> None:
    # bf16 x at M > 16 on the int8 GEMM (csrc/cpu/isa/quant_gemm8.h). (1) Against the gguf package's dequantized
    # W times x quantized per chunk by the numpy model, in float64: the integer sums are exact, what remains is
    # fp32 rounding of the per-chunk products and the sum over K / 32 chunks: |out - model| <= 2^-16 · Σ |w| ·
    # |dx · q|, then one bf16 rounding (a wrong code, scale, offset or lane is ~1/K of the sum: far above).
    # (2) Each row of x gives the same result bit for bit whatever M and wherever the row sits among the 16
    # lanes of its block (rows 5.. of x as rows 0.. of a shorter call), a NaN row NaN and the others untouched.
    # Random bytes cover the extreme codes and scales (Q8_0's -128, Q6_K's -32 / 31 and -128 scale).
    _with_gemm8_level()
    try:
        qtype = QFORMATS[name].qtype
        k = 768 if QFORMATS[name].block == 256 else 576
        for random_bytes in (False, True):
            qweight, _ = random_qweight(name, 37, k, seed=k + random_bytes, random_bytes=random_bytes)
            g = torch.Generator().manual_seed(5)
            x = (torch.randn(48, k, generator=g) * torch.rand(48, k, generator=g) * 4).to(torch.bfloat16)
            x[0, :256] = 0.0  # all-zero chunks: dx = 0
            x[9, k // 3] = float("nan")
            w = dequantize(qweight, qtype, None).double()
            keep = torch.arange(48) != 9
            xm = _q8k_model(x[keep], _int8_chunk(name, 48, torch.bfloat16))
            out = ops.qlinear(x, qweight, qtype)
            assert out[9].isnan().all(), name
            model, absq = xm @ w.T, xm.abs() @ w.abs().T
            bound = 2.0**-16 * absq + 2.0**-8 * (model.abs() + 2.0**-16 * absq) + 1e-30
            err = (out[keep].double() - model).abs()
            assert bool((err <= bound).all()), (name, random_bytes, float((err / bound).max()))
            for lo, hi in ((0, 17), (0, 33), (5, 40), (20, 48)):
                part = ops.qlinear(x[lo:hi], qweight, qtype)
                torch.testing.assert_close(part, out[lo:hi], rtol=0, atol=0, equal_nan=True,
                                           msg=lambda m: f"{name} {random_bytes} rows {lo}:{hi}: {m}")
    finally:
        set_cpu_isa(None)
