"""NaN / Inf semantics of the attention and router kernels on every backend (docs/design.md §3),
against mistral_kernels.reference, which defines them:

  * NaN in q or in the K row of a key a query sees → that query's output row is NaN;
  * NaN / Inf in the V row of a visible key → NaN / Inf in the output columns it is in;
  * keys a query cannot see (causal mask, sliding window, past seq_lens) never matter, whatever they hold
    — also inside one tile of the prefill kernels, where masked probabilities must not multiply V;
  * a row that sees no key is 0;
  * the router ranks NaN probabilities last: k distinct experts, the same ids on every backend.

Shape letters: B sequences, Tq packed queries, Hq / Hkv heads, D head_dim, N blocks, S block_size, E experts.
"""

from __future__ import annotations

import pytest
import torch

from mistral_kernels import reference as ref

from .conftest import TOL

NAN, INF = float("nan"), float("inf")
N, S, HQ, HKV, D = 12, 4, 4, 2, 64


def _check(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert torch.equal(actual.float().isnan(), expected.float().isnan()), "NaN positions differ from the reference"
    torch.testing.assert_close(actual.float(), expected.float(), equal_nan=True, **TOL[dtype])


def _caches(dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(N, S, HKV, D, generator=g).to(dtype)
    v = torch.randn(N, S, HKV, D, generator=g).to(dtype)
    return k, v


def _poison(cache: torch.Tensor, tables: torch.Tensor, b: int, key: int, kvh: int, cols: slice, value: float) -> None:
    cache[int(tables[b, key // S]), key % S, kvh, cols] = value


# (description, which cache, sequence, key, kv head, columns, value): placements for decode, seq_lens
# [9, 14], window 5 where set — sequence 1's query (position 13) sees keys 9 … 13.
DECODE_PLACEMENTS = [
    ("V NaN, visible key, one column", "v", 1, 12, 0, slice(3, 4), NAN),
    ("K NaN, visible key", "k", 0, 4, 1, slice(0, D), NAN),
    ("V Inf, visible key", "v", 0, 8, 1, slice(5, 7), INF),
    ("K and V NaN, windowed-out key", "kv", 1, 3, 0, slice(0, D), NAN),
    ("K Inf, windowed-out key", "k", 1, 8, 1, slice(0, D), INF),
    ("V NaN past seq_lens", "v", 0, 10, 0, slice(0, D), NAN),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("partition_size", [0, 3])
def test_decode_nan_placements(backend, dtype, window, partition_size):
    if not backend.supports(dtype):
        pytest.skip(f"{backend.name} has no {dtype}")
    kc, vc = _caches(dtype, 1)
    tables = torch.tensor([[3, 0, 7, 9], [5, 1, 11, 2]], dtype=torch.int32)
    lens = torch.tensor([9, 14], dtype=torch.int32)
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, HQ, D, generator=g).to(dtype)
    q[0, 3, 10] = NAN  # q NaN: row (0, 3) only
    for _, which, b, key, kvh, cols, value in DECODE_PLACEMENTS:
        if "k" in which:
            _poison(kc, tables, b, key, kvh, cols, value)
        if "v" in which:
            _poison(vc, tables, b, key, kvh, cols, value)
    out = backend.ops.paged_decode_attention(q, kc, vc, tables, lens, D**-0.5, window, partition_size=partition_size)
    expected = ref.paged_decode_attention(q, kc, vc, tables, lens, D**-0.5, window)
    _check(out, expected, dtype)
    assert out.float().isnan().any() and not out.float().isnan().all()  # the placements matter


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 6])
def test_prefill_masked_keys_do_not_leak(backend, dtype, window):
    """A 20-token prefill (one tile of every kernel holds rows before and after the poisoned keys)."""
    if not backend.supports(dtype):
        pytest.skip(f"{backend.name} has no {dtype}")
    kc, vc = _caches(dtype, 3)
    tables = torch.tensor([[4, 0, 8, 2, 10, 6]], dtype=torch.int32)
    lens = torch.tensor([22], dtype=torch.int32)  # 2 cached + 20 new tokens: positions 2 … 21
    cu = torch.tensor([0, 20], dtype=torch.int32)
    q = torch.randn(20, HQ, D, generator=torch.Generator().manual_seed(4)).to(dtype)
    _poison(vc, tables, 0, 9, 0, slice(5, 6), NAN)   # V NaN at key 9: rows at positions ≥ 9 only
    _poison(vc, tables, 0, 12, 1, slice(0, 2), INF)  # V Inf at key 12: positions ≥ 12 (window: ≤ 17)
    _poison(kc, tables, 0, 15, 1, slice(0, D), NAN)  # K NaN at key 15: rows of kv head 1 at ≥ 15 are NaN
    _poison(vc, tables, 0, 22, 0, slice(0, D), NAN)  # past seq_lens: never seen
    q[17, 0, 3] = NAN  # one q row
    out = backend.ops.paged_prefill_attention(q, kc, vc, tables, cu, lens, D**-0.5, window)
    expected = ref.paged_prefill_attention(q, kc, vc, tables, cu, lens, D**-0.5, window)
    _check(out, expected, dtype)
    # rows before position 9 (q rows 0 … 6) are finite: the NaN / Inf of later keys did not reach them
    assert out[:7].float().isfinite().all()


def test_nan_q_propagates_not_zero(backend):
    """A regression: an all-NaN q must give NaN, not the 0 of a row that saw no key (decode and prefill)."""
    kc, vc = _caches(torch.float32, 5)
    tables = torch.tensor([[0, 1, 2]], dtype=torch.int32)
    q = torch.full((1, HQ, D), NAN)
    out = backend.ops.paged_decode_attention(q, kc, vc, tables, torch.tensor([7], dtype=torch.int32), 0.1)
    assert out.isnan().all()
    out = backend.ops.paged_prefill_attention(q, kc, vc, tables, torch.tensor([0, 1], dtype=torch.int32),
                                              torch.tensor([7], dtype=torch.int32), 0.1)
    assert out.isnan().all()
    empty = backend.ops.paged_decode_attention(q, kc, vc, tables, torch.tensor([0], dtype=torch.int32), 0.1)
    assert torch.equal(empty, torch.zeros_like(empty))  # no visible key: 0 even for a NaN q


@pytest.mark.parametrize("num_experts", [8, 40])  # the router's one-register and shared-memory paths
def test_topk_softmax_nan_inf_logits(backend, num_experts):
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(6, num_experts, generator=g)
    logits[0, 3] = NAN
    logits[1, :] = NAN
    logits[2, 5] = INF
    logits[3, :] = -INF
    logits[4, 1::2] = -INF
    for renormalize in (True, False):
        w, ids = backend.ops.topk_softmax(logits, 4, renormalize)
        w_ref, ids_ref = ref.topk_softmax(logits, 4, renormalize)
        assert torch.equal(ids, ids_ref)
        assert all(len(set(row.tolist())) == 4 for row in ids)  # distinct experts, NaN rows too
        torch.testing.assert_close(w, w_ref, equal_nan=True)
