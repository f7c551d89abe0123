"""Helpers of tests/test_moe.py that other tests share."""

from __future__ import annotations

import torch

from mistral_kernels import reference as ref

from ..conftest import Backend, assert_close


def _random_ids(t: int, e: int, k: int, seed: int) -> torch.Tensor:
    """[T, k] int32, k distinct experts per token (like a router's output)."""
    g = torch.Generator().manual_seed(seed)
    return torch.rand(t, e, generator=g).topk(k, dim=-1).indices.to(torch.int32)


def _moe_weights(e: int, h: int, i: int, dtype: torch.dtype, device: str, seed: int) -> tuple[torch.Tensor, ...]:
    """gate [E, H], w1, w3 [E, I, H], w2 [E, H, I], scaled so activations stay O(1)."""
    g = torch.Generator().manual_seed(seed)
    gate = torch.randn(e, h, generator=g) / h**0.5
    w1 = torch.randn(e, i, h, generator=g) / h**0.5
    w3 = torch.randn(e, i, h, generator=g) / h**0.5
    w2 = torch.randn(e, h, i, generator=g) / i**0.5
    return tuple(w.to(dtype).to(device) for w in (gate, w1, w2, w3))


def _check_permutation_properties(x: torch.Tensor, ids: torch.Tensor, num_experts: int, permuted: torch.Tensor,
                                  offsets: torch.Tensor, inv: torch.Tensor) -> None:
    t, k = ids.shape
    ids, offsets, inv, permuted, x = ids.cpu().long(), offsets.cpu(), inv.cpu().long(), permuted.cpu(), x.cpu()
    # every (t, j) appears exactly once
    assert torch.equal(torch.sort(inv.flatten()).values, torch.arange(t * k))
    # segments match the histogram of topk_ids
    assert torch.equal(offsets.diff(), torch.bincount(ids.flatten(), minlength=num_experts))
    assert int(offsets[0]) == 0 and int(offsets[-1]) == t * k
    # row inv[t, j] holds x[t] and lies in expert ids[t, j]'s segment
    assert torch.equal(permuted[inv.flatten()], x.repeat_interleave(k, dim=0))
    seg = torch.searchsorted(offsets, inv, right=True) - 1
    assert torch.equal(seg, ids)
    # stable: inside a segment the token index increases
    token_of_row = torch.empty(t * k, dtype=torch.long)
    token_of_row[inv.flatten()] = torch.arange(t).repeat_interleave(k)
    for e in range(num_experts):
        toks = token_of_row[int(offsets[e]) : int(offsets[e + 1])]
        assert bool((toks.diff() > 0).all())


def _check_fused(backend: Backend, t: int, h: int, i: int, e: int, k: int, dtype: torch.dtype, seed: int) -> None:
    gate, w1, w2, w3 = _moe_weights(e, h, i, dtype, backend.device, seed)
    x = torch.randn(t, h, generator=torch.Generator().manual_seed(seed + 1)).to(dtype).to(backend.device)
    out = backend.ops.fused_moe(x, gate, w1, w2, w3, top_k=k)
    expect = ref.fused_moe(x.cpu(), gate.cpu(), w1.cpu(), w2.cpu(), w3.cpu(), top_k=k)
    assert out.shape == x.shape and out.dtype == dtype
    if dtype == torch.float32:
        assert_close(out, expect, atol=1e-4, rtol=1e-4)  # three chained GEMMs, different summation orders
    else:
        assert_close(out, expect)
