"""ops.linear / skinny_linear (the CPU's dense matmul: the decode GEMV, and fp32 prefill by the tile GEMM) against an
fp64 matmul and reference.linear."""

from __future__ import annotations

import pytest
import torch

import mistral_kernels
from mistral_kernels import ops, reference


# Tolerances against the fp64 product of the rounded inputs: fp32 / fp16 / bf16 outputs are rounded once.
_TOL = {torch.float32: (1e-4, 1e-5), torch.float16: (2e-3, 1e-3), torch.bfloat16: (2e-2, 1e-2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("M", [1, 2, 3, 4, 5, 8, 16])
@pytest.mark.parametrize("N,K", [(1, 1), (5, 7), (17, 33), (1000, 576), (67, 1000)])
def test_skinny_linear_matches_matmul(dtype: torch.dtype, M: int, N: int, K: int) -> None:
    g = torch.Generator().manual_seed(M * 1000 + N + K)
    x = torch.randn(M, K, generator=g).to(dtype)
    w = torch.randn(N, K, generator=g).to(dtype)
    expect = x.double() @ w.double().T
    got = ops.linear(x, w)
    assert got.shape == (M, N) and got.dtype == dtype
    atol, rtol = _TOL[dtype]
    torch.testing.assert_close(got.double(), expect, atol=atol * K**0.5, rtol=rtol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1, 64), (7, 64), (2, 3, 64), (40, 64)])
def test_linear_matches_reference(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    g = torch.Generator().manual_seed(len(shape) * 100 + shape[0])
    x, w = torch.randn(shape, generator=g).to(dtype), torch.randn(48, 64, generator=g).to(dtype)
    atol, rtol = _TOL[dtype]
    torch.testing.assert_close(ops.linear(x, w), reference.linear(x, w), atol=atol * 8, rtol=rtol * 2)


def test_linear_batched_leading_dims_and_out() -> None:
    x = torch.randn(2, 3, 64)
    w = torch.randn(40, 64)
    out = torch.empty(2, 3, 40)
    assert ops.linear(x, w, out=out) is out
    torch.testing.assert_close(out, x @ w.T, atol=1e-4, rtol=1e-5)
    big = torch.randn(40, 64)  # M > 16 goes to torch's GEMM
    torch.testing.assert_close(ops.linear(big, w), big @ w.T, atol=1e-4, rtol=1e-5)


def test_skinny_linear_independent_of_thread_count() -> None:
    x = torch.randn(3, 576, dtype=torch.bfloat16)
    w = torch.randn(3000, 576, dtype=torch.bfloat16)
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ops.linear(x, w)
        torch.set_num_threads(max(2, n))
        many = ops.linear(x, w)
    finally:
        torch.set_num_threads(n)
    assert torch.equal(one, many)


def test_skinny_linear_bad_inputs() -> None:
    op = torch.ops.mistral_kernels.skinny_linear
    x, w = torch.randn(2, 8), torch.randn(4, 8)
    with pytest.raises(RuntimeError, match="weight.shape\\[1\\]"):
        op(torch.empty(2, 4), x, torch.randn(4, 9))
    with pytest.raises(RuntimeError, match="weight has dtype"):
        op(torch.empty(2, 4), x, w.bfloat16())
    with pytest.raises(RuntimeError, match="out.shape\\[1\\]"):
        op(torch.empty(2, 5), x, w)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16bit_conversions_every_value(dtype: torch.dtype) -> None:
    """x [3, 1] · W [65536, 1]ᵀ with W = every 16-bit pattern: each product is exact in fp32, so the kernel's
    16-bit → fp32 → 16-bit conversions must give torch's rounding (nearest even; subnormals, overflow to
    Inf, NaN) bit for bit, at whatever CPU ISA level runs (scripts/isa_tests.sh). One documented exception:
    AVX512_BF16's vdpbf16ps treats bf16 subnormals (|v| < 2^-126) as zero (inputs and results)."""
    w = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype).reshape(-1, 1)
    x = torch.tensor([[1.0], [0.1], [3.0]]).to(dtype)
    got = ops.linear(x, w)
    expect = (x.float() @ w.float().T).to(dtype)
    nan = expect.isnan()
    assert torch.equal(got.isnan(), nan)
    exact = ~nan
    if dtype == torch.bfloat16 and mistral_kernels.cpu_isa() == "avx512bf16":
        tiny = (w.float().abs() < 2.0**-126).T | (expect.float().abs() < 2.0**-126)
        assert torch.all((got[tiny & exact] == 0) | (got[tiny & exact] == expect[tiny & exact]))
        exact &= ~tiny
    assert torch.equal(got[exact], expect[exact])


# ------------------------------------------------------------------ out: owned memory, named errors
def _packed(n: int = 8, k: int = 64) -> object:
    from mistral_kernels.quant_formats import QFORMATS
    from mistral_kernels.quant_weight import FusedWeight, QuantizedWeight

    from .helpers.quant_data import random_qweight

    q8 = QuantizedWeight(random_qweight("Q8_0", n, k, seed=1)[0], QFORMATS["Q8_0"].qtype, (n, k))
    q4 = QuantizedWeight(random_qweight("Q4_0", n, k, seed=2)[0], QFORMATS["Q4_0"].qtype, (n, k))
    return FusedWeight((q8, q4))


@pytest.mark.parametrize("rows", [3, 40])  # the skinny kernel and the torch GEMM path
def test_linear_refuses_an_out_whose_elements_share_memory(rows: int) -> None:
    x, w = torch.randn(rows, 64), torch.randn(8, 64)
    for out in (torch.empty(8).expand(rows, 8),                       # stride-0 rows
                torch.empty(rows + 8).as_strided((rows, 8), (1, 1))):  # rows overlapping
        with pytest.raises(ValueError, match="linear: out must be contiguous"):
            ops.linear(x, w, out=out)


def test_packed_linear_checks_out_and_names_it() -> None:
    x, w = torch.randn(3, 64), _packed()
    with pytest.raises(ValueError, match=r"linear: out must be torch.float32 \[3, 16\]"):
        ops.linear(x, w, out=torch.empty(3, 8))                        # too small
    with pytest.raises(ValueError, match="linear: out must be contiguous"):
        ops.linear(x, w, out=torch.empty(16).expand(3, 16))            # stride 0
    big = torch.randn(3, 64)
    with pytest.raises(ValueError, match="linear: out shares memory with x"):
        ops.linear(big, w, out=big.view(-1)[:48].view(3, 16))          # contiguous, inside x
    want = ops.linear(x, w)
    out = torch.empty(3, 16)
    assert ops.linear(x, w, out=out) is out and torch.equal(out, want)


def test_qlinear_out_of_the_wrong_type_is_named() -> None:
    from mistral_kernels.quant_formats import QFORMATS

    from .helpers.quant_data import random_qweight

    q, _ = random_qweight("Q8_0", 8, 64, seed=3)
    with pytest.raises(TypeError, match="qlinear: out must be a torch.Tensor, got list"):
        ops.qlinear(torch.randn(2, 64), q, QFORMATS["Q8_0"].qtype, out=[0.0] * 16)
    with pytest.raises(ValueError, match="qlinear: out must be contiguous"):
        ops.qlinear(torch.randn(2, 64), q, QFORMATS["Q8_0"].qtype, out=torch.empty(8).expand(2, 8))


@pytest.mark.parametrize("M,N,K", [(17, 5, 7), (40, 33, 576), (73, 1000, 576), (42, 576, 1536), (17, 9, 1)])
def test_linear_fp32_prefill_tile_gemm(M: int, N: int, K: int) -> None:
    # fp32 x above 16 rows takes the fp32 tile GEMM (csrc/cpu/linear.cpp: x packed in 16-row blocks, pairs and a
    # lone block, W in place in tiles of 8-row multiples, tails of both): against the fp64 product, each output
    # one fp32 chain over K (|err| <= (K + 2) · 2^-24 · Σ|x||w|); a row does not depend on M, its position or the
    # thread count.
    g = torch.Generator().manual_seed(M * 7 + N + K)
    x, w = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g)
    got = ops.linear(x, w)
    expect = x.double() @ w.double().T
    bound = (K + 2) * 2.0**-24 * (x.double().abs() @ w.double().abs().T) + 1e-30
    assert bool(((got.double() - expect).abs() <= bound).all())
    if not mistral_kernels.cpu_isa().startswith("avx512"):
        return  # other levels take ATen's GEMM, which promises no invariance
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ops.linear(x, w)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, got)
    bigger = ops.linear(torch.cat([torch.randn(5, K, generator=g), x]), w)  # the rows in other lanes / blocks
    assert torch.equal(bigger[5:], got)
