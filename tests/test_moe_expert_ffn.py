"""moe_expert_ffn: the grouped SwiGLU experts over device-side segments (used by expert parallelism)."""

from __future__ import annotations

import pytest
import torch

from mistral_kernels import ops, reference as ref

from .conftest import Backend, assert_close


def _weights(G: int, H: int, I: int, dtype: torch.dtype, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    w1 = torch.randn(G, I, H, generator=g) / H**0.5
    w3 = torch.randn(G, I, H, generator=g) / H**0.5
    w2 = torch.randn(G, H, I, generator=g) / I**0.5
    return tuple(w.to(dtype) for w in (w1, w2, w3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("offsets", [[0, 2, 2, 7], [0, 3, 5, 7], [0, 0, 0, 7], [0, 7, 7, 7], [0, 1, 4]])
def test_matches_reference(backend: Backend, dtype: torch.dtype, offsets: list[int]) -> None:
    g = torch.Generator().manual_seed(len(offsets) * 10 + offsets[1])
    M, H, I = 7, 32, 48
    G = 2  # experts with weights; a third bucket (if any) is another rank's: must come out as zeros
    x = torch.randn(M, H, generator=g).to(dtype)
    w1, w2, w3 = _weights(G, H, I, dtype, g)
    off = torch.tensor(offsets)
    expect = ref.moe_expert_ffn(x, off, w1, w2, w3)
    dev = backend.device
    got = backend.ops.moe_expert_ffn(x.to(dev), off.to(dev), w1.to(dev), w2.to(dev), w3.to(dev))
    assert_close(got, expect)
    assert torch.equal(got[offsets[G]:].cpu(), torch.zeros(M - offsets[G], H, dtype=dtype))


def test_composes_to_fused_moe() -> None:
    """router → permute → moe_expert_ffn → unpermute is fused_moe."""
    g = torch.Generator().manual_seed(3)
    T, H, I, E, k = 9, 32, 40, 4, 2
    x = torch.randn(T, H, generator=g)
    gate = torch.randn(E, H, generator=g)
    w1, w2, w3 = _weights(E, H, I, torch.float32, g)
    w, ids = ops.topk_softmax(ops.linear(x, gate), k)
    permuted, offsets, inv_perm = ops.moe_permute(x, ids, E)
    y = ops.moe_unpermute(ops.moe_expert_ffn(permuted, offsets, w1, w2, w3), w, inv_perm)
    torch.testing.assert_close(y, ops.fused_moe(x, gate, w1, w2, w3, k), atol=1e-5, rtol=1e-5)


def test_bad_inputs(backend_one_schedule: Backend) -> None:
    ops_, dev = backend_one_schedule.ops, backend_one_schedule.device
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 16, generator=g).to(dev)
    w1, w2, w3 = (w.to(dev) for w in _weights(2, 16, 8, torch.float32, g))
    with pytest.raises(RuntimeError, match="at least G \\+ 1 = 3"):
        ops_.moe_expert_ffn(x, torch.tensor([0, 5], device=dev), w1, w2, w3)
    with pytest.raises((RuntimeError, ValueError), match="expert_offsets"):
        ops_.moe_expert_ffn(x, torch.tensor([0, 4, 2], device=dev), w1, w2, w3)
    with pytest.raises((RuntimeError, ValueError), match="expert_offsets"):
        ops_.moe_expert_ffn(x, torch.tensor([0, 2, 6], device=dev), w1, w2, w3)
    with pytest.raises(RuntimeError, match="expert_offsets must have dtype"):
        ops_.moe_expert_ffn(x, torch.tensor([0, 2, 5], dtype=torch.int32, device=dev), w1, w2, w3)
    with pytest.raises(RuntimeError, match="w2 must be"):
        ops_.moe_expert_ffn(x, torch.tensor([0, 2, 5], device=dev), w1, w2[:, :, :4], w3)
