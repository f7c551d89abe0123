"""fused_moe's bounded memory and router path: the tokens are processed in chunks of at most kMoeChunkTokens
(csrc/checks/moe.h; MK_MOE_CHUNK_TOKENS overrides it for these tests), and the router GEMM goes through the dense
GEMM path (at::mm, cuBLAS on CUDA) instead of a one-block grouped-GEMM launch. Results with tiny chunks are
compared with reference.fused_moe, which sees all tokens at once.

Shape letters: T tokens, H hidden, I intermediate, E experts, k top-k, C tokens per chunk.
"""

from __future__ import annotations

import pytest
import torch

from mistral_kernels import reference as ref

from .conftest import Backend, _make_backend, assert_close
from .helpers.moe import _moe_weights


@pytest.fixture(params=["cpu", "emu-forward", "emu-reverse", "emu-random", "cuda"])
def chunked(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Backend:
    return _make_backend(request.param, monkeypatch)


def _fused(backend: Backend, t: int, h: int, i: int, e: int, k: int, dtype: torch.dtype,
           seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gate, w1, w2, w3 = _moe_weights(e, h, i, dtype, backend.device, seed)
    x = torch.randn(t, h, generator=torch.Generator().manual_seed(seed + 1)).to(dtype).to(backend.device)
    out = backend.ops.fused_moe(x, gate, w1, w2, w3, top_k=k)
    expect = ref.fused_moe(x.cpu(), gate.cpu(), w1.cpu(), w2.cpu(), w3.cpu(), top_k=k)
    return out, expect


# C = 3 with T = 7: chunks of 3, 3, 1 tokens (a last partial chunk); C = 1: one token per chunk.
# fp32 only on every backend: the chunk loop is the same code for every dtype, and the bf16 reference costs
# ~30 ms per tiny matmul on this CPU; one bf16 case below.
@pytest.mark.parametrize("chunk,t", [(3, 7), (1, 5)])
@pytest.mark.parametrize("e,k", [(8, 2), (64, 6)])
def test_tiny_chunks_match_reference(chunked: Backend, monkeypatch: pytest.MonkeyPatch, chunk: int, t: int, e: int,
                                     k: int) -> None:
    monkeypatch.setenv("MK_MOE_CHUNK_TOKENS", str(chunk))
    out, expect = _fused(chunked, t, 16, 24, e, k, torch.float32, seed=t + e)
    assert_close(out, expect, atol=1e-4, rtol=1e-4)  # three chained GEMMs, different summation orders


@pytest.mark.parametrize("name", ["cpu", "emu-forward", "cuda"])
def test_tiny_chunks_bf16(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv("MK_MOE_CHUNK_TOKENS", "2")
    out, expect = _fused(_make_backend(name, monkeypatch), 5, 16, 24, 8, 2, torch.bfloat16, seed=2)
    assert_close(out, expect)


def test_prefill_in_chunks_native(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU, T = 160 in chunks of 96 and 64 tokens (~24 / 16 rows per expert: ATen's GEMM and skinny_linear)."""
    monkeypatch.setenv("MK_MOE_CHUNK_TOKENS", "96")
    out, expect = _fused(_make_backend("cpu", monkeypatch), 160, 64, 96, 8, 2, torch.float32, seed=3)
    assert_close(out, expect, atol=1e-4, rtol=1e-4)


@pytest.fixture
def stats(monkeypatch: pytest.MonkeyPatch) -> Backend:
    backend = _make_backend("emu-forward", monkeypatch)
    monkeypatch.setenv("MK_SIMT_STATS", "1")
    backend.ops.simt_stats(reset=True)
    return backend


def test_one_router_launch_per_chunk(stats: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MK_MOE_CHUNK_TOKENS", "3")
    out, expect = _fused(stats, 7, 16, 24, 8, 2, torch.float32, seed=0)
    assert_close(out, expect, atol=1e-4, rtol=1e-4)
    kernels = [s.kernel for s in stats.ops.simt_stats()]
    assert sum("topk_softmax_kernel" in name for name in kernels) == 3, kernels  # ceil(7 / 3) chunks
    assert sum("moe_unpermute_kernel" in name for name in kernels) == 3, kernels


@pytest.mark.parametrize("e,k", [(8, 2), (64, 6)])
def test_decode_router_is_not_a_one_block_gemm(stats: Backend, e: int, k: int) -> None:
    """T = 1: the gate GEMM [1, H] x [H, E] runs as a dense GEMM (at::mm) before any emulated launch; the
    first kernel is the softmax / top-k, and nothing before it was a one-block grouped GEMM."""
    out, expect = _fused(stats, 1, 32, 48, e, k, torch.float32, seed=e)
    assert_close(out, expect, atol=1e-4, rtol=1e-4)
    launches = stats.ops.simt_stats()
    assert launches and "topk_softmax_kernel" in launches[0].kernel, [s.kernel for s in launches]


@pytest.mark.parametrize("value", ["0", "-2", "4k"])
def test_bad_chunk_env(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    for name in ("cpu", "emu-forward"):
        backend = _make_backend(name, monkeypatch)
        monkeypatch.setenv("MK_MOE_CHUNK_TOKENS", value)
        gate, w1, w2, w3 = _moe_weights(8, 16, 24, torch.float32, "cpu", 0)
        with pytest.raises(RuntimeError, match="MK_MOE_CHUNK_TOKENS must be a positive integer"):
            backend.ops.fused_moe(torch.randn(2, 16), gate, w1, w2, w3, top_k=2)
