"""ops.linear / skinny_linear (decode-sized CPU matmul) against an fp64 matmul and reference.linear."""

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
    with pytest.raises(RuntimeError, match="M\\) must be <= 16"):
        op(torch.empty(17, 4), torch.randn(17, 8), w)
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
