"""Helpers of tests/test_attention.py that other tests share."""

from __future__ import annotations

import dataclasses

import torch

from mistral_kernels import reference as ref

from ..conftest import assert_close


ATTN_TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4)}  # docs/design.md §5: attention fp32 1e-4


def _tol(dtype: torch.dtype) -> dict[str, float]:
    return ATTN_TOL.get(dtype, {})


@dataclasses.dataclass
class Paged:
    k_cache: torch.Tensor  # [N, S, Hkv, D], NaN in every slot no sequence owns
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # int32 [B, M], shuffled physical blocks
    seq_lens: torch.Tensor  # int32 [B]


def make_paged(seq_lens: list[int], hkv: int, d: int, s: int, dtype: torch.dtype, g: torch.Generator,
               spare_blocks: int = 3, extra_table_cols: int = 1) -> Paged:
    """Random K/V for each sequence written (by the reference) into shuffled physical blocks."""
    need = [(n + s - 1) // s for n in seq_lens]
    m = max(need + [1]) + extra_table_cols
    n_blocks = sum(need) + spare_blocks
    perm = torch.randperm(n_blocks, generator=g).int()
    k_cache = torch.full((n_blocks, s, hkv, d), float("nan"), dtype=dtype)
    v_cache = torch.full_like(k_cache, float("nan"))
    # unused table entries hold garbage ids: they must never be read
    tables = torch.full((len(seq_lens), m), -7, dtype=torch.int32)
    used = 0
    for b, n in enumerate(seq_lens):
        tables[b, : need[b]] = perm[used : used + need[b]]
        used += need[b]
        j = torch.arange(n)
        slots = tables[b].long()[j // s] * s + j % s
        k = torch.randn(n, hkv, d, generator=g).to(dtype)
        v = torch.randn(n, hkv, d, generator=g).to(dtype)
        ref.reshape_and_cache(k, v, k_cache, v_cache, slots)
    return Paged(k_cache, v_cache, tables, torch.tensor(seq_lens, dtype=torch.int32))


def _to(p: Paged, dev: str) -> Paged:
    return Paged(*(getattr(p, f.name).to(dev) for f in dataclasses.fields(p)))


def _check_decode(ops_mod: object, dev: str, seq_lens: list[int], hq: int, hkv: int, d: int, s: int,
                  dtype: torch.dtype, window: int | None, seed: int, partition_size: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    p = make_paged(seq_lens, hkv, d, s, dtype, g)
    q = torch.randn(len(seq_lens), hq, d, generator=g).to(dtype)
    scale = d**-0.5
    expect = ref.paged_decode_attention(q, p.k_cache, p.v_cache, p.block_tables, p.seq_lens, scale, window)
    pd = _to(p, dev)
    got = ops_mod.paged_decode_attention(q.to(dev), pd.k_cache, pd.v_cache, pd.block_tables, pd.seq_lens, scale,
                                         window, partition_size=partition_size)
    assert got.shape == q.shape and got.dtype == dtype
    assert torch.isfinite(got.cpu().float()).all(), "NaN from unused cache slots leaked into the output"
    assert_close(got, expect, **_tol(dtype))
    return got.cpu()


def _check_prefill(ops_mod: object, dev: str, seq_lens: list[int], q_lens: list[int], hq: int, hkv: int, d: int,
                   s: int, dtype: torch.dtype, window: int | None, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    p = make_paged(seq_lens, hkv, d, s, dtype, g)
    cu = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    q = torch.randn(int(cu[-1]), hq, d, generator=g).to(dtype)
    scale = d**-0.5
    expect = ref.paged_prefill_attention(q, p.k_cache, p.v_cache, p.block_tables, cu, p.seq_lens, scale, window)
    pd = _to(p, dev)
    got = ops_mod.paged_prefill_attention(q.to(dev), pd.k_cache, pd.v_cache, pd.block_tables, cu.to(dev),
                                          pd.seq_lens, scale, window)
    assert got.shape == q.shape and got.dtype == dtype
    assert torch.isfinite(got.cpu().float()).all(), "NaN from unused cache slots leaked into the output"
    assert_close(got, expect, **_tol(dtype))
