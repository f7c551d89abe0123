"""KV block manager: allocation, growth, freeing, sliding-window freeing (O(W) memory), and that the attention
kernels never read blocks freed by the window (poisoned with NaN and reused by another sequence)."""

from __future__ import annotations

import pytest
import torch

import mistral_kernels
from mistral_kernels import reference
from mistral_kernels.cache import FREED, BlockManager, OutOfBlocksError, blocks_for


def test_allocate_grow_free_no_leak() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    bm.allocate("a", 0, 5)                      # positions 0-4 -> 2 blocks
    assert len(bm.block_table("a")) == 2 and bm.num_free_blocks == 6
    bm.allocate("a", 5, 8)                      # still 2 blocks
    assert bm.num_free_blocks == 6
    bm.allocate("a", 8, 9)                      # third block
    bm.allocate("b", 0, 12)
    tables = bm.block_table("a") + bm.block_table("b")
    assert len(set(tables)) == len(tables) == 6  # distinct physical blocks
    bm.free("a")
    bm.free("b")
    assert bm.num_free_blocks == 8 and not bm.has("a")


def test_out_of_blocks_changes_nothing() -> None:
    bm = BlockManager(num_blocks=3, block_size=4)
    bm.allocate("a", 0, 8)
    with pytest.raises(OutOfBlocksError, match="needs 2 more KV blocks, 1 free"):
        bm.allocate("b", 0, 8)
    assert bm.num_free_blocks == 1 and not bm.has("b")
    with pytest.raises(OutOfBlocksError):
        bm.allocate("a", 8, 16)
    assert bm.block_table("a") == bm.block_table("a")[:2] and bm.num_free_blocks == 1


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="power of two"):
        BlockManager(4, 12)
    with pytest.raises(ValueError, match="num_blocks"):
        BlockManager(0, 16)
    with pytest.raises(ValueError, match="sliding_window"):
        BlockManager(4, 16, sliding_window=0)


def test_sliding_window_worked_example() -> None:
    # Module docstring example: block_size 4, W 6, 13 tokens, next query at 13 -> blocks 0, 1 freed.
    bm = BlockManager(num_blocks=16, block_size=4, sliding_window=6)
    bm.allocate("s", 0, 13)
    table = list(bm.block_table("s"))
    assert len(table) == 4 and bm.num_free_blocks == 12
    assert bm.free_outside_window("s", 13) == 2
    assert bm.block_table("s") == [FREED, FREED, table[2], table[3]]
    assert bm.num_free_blocks == 14 and bm.num_owned("s") == 2


def test_sliding_window_memory_is_O_of_W() -> None:
    w, bs = 10, 4
    bm = BlockManager(num_blocks=6, block_size=bs, sliding_window=w)   # 24 slots, far fewer than 200 tokens
    bm.allocate("s", 0, 7)                                             # prefill 7 tokens
    most = 0
    for pos in range(7, 200):                                          # decode one token at a time
        bm.allocate("s", pos, pos + 1)
        most = max(most, bm.num_owned("s"))
        table = bm.block_table("s")
        assert len(table) == blocks_for(pos + 1, bs)                   # logical positions preserved
        first = max(0, pos - w + 1)
        live = [table[blk] for blk in range(first // bs, pos // bs + 1)]  # blocks the query reads
        assert set(live) <= bm.owned_blocks("s") and len(set(live)) == len(live)
    assert most <= bm.max_blocks_per_sequence(200) == blocks_for(w, bs) + 1
    bm.free("s")
    assert bm.num_free_blocks == 6


def test_window_skips_materialising_old_blocks() -> None:
    # A chunk whose first query is far along never allocates the blocks already outside its window.
    bm = BlockManager(num_blocks=4, block_size=4, sliding_window=4)
    bm.allocate("s", 20, 24)       # positions 0..23 logically, queries from 20 see keys 17..23
    assert bm.block_table("s")[:4] == [FREED] * 4 and bm.num_owned("s") == 2


@pytest.mark.parametrize("dtype", [torch.float32])
def test_freed_blocks_are_never_read_by_attention(dtype: torch.dtype) -> None:
    """Sequence a runs with W=8; its out-of-window blocks are freed, handed to sequence b and filled with NaN.
    Decode and prefill attention over a's (partly FREED) table must equal the reference on an intact cache."""
    torch.manual_seed(0)
    hq, hkv, d, bs, w = 4, 2, 64, 8, 8
    bm = BlockManager(11, bs, sliding_window=w)
    k_cache = torch.randn(bm.num_physical_blocks, bs, hkv, d, dtype=dtype)
    v_cache = torch.randn(bm.num_physical_blocks, bs, hkv, d, dtype=dtype)
    length = 40
    bm.allocate("a", 0, length)                     # every block materialised (prefill from 0)
    intact_table = list(bm.block_table("a"))
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    # The next step's first query sits at length-3 (a 3-token chunk; decode of the last one reads a subset):
    # blocks below (length-3-w+1)//bs = 3 are freed...
    freed = bm.free_outside_window("a", length - 3)
    assert freed == 3
    # ...and reused by b, which fills them with NaN.
    bm.allocate("b", 0, freed * bs)
    for blk in bm.block_table("b"):
        k_cache[blk] = float("nan")
        v_cache[blk] = float("nan")
    table = torch.tensor([bm.block_table("a")], dtype=torch.int32)
    assert (table == FREED).sum() >= 3
    seq_lens = torch.tensor([length], dtype=torch.int32)
    q = torch.randn(1, hq, d, dtype=dtype)
    scale = d ** -0.5
    out = mistral_kernels.ops.paged_decode_attention(q, k_cache, v_cache, table, seq_lens, scale, w)
    want = reference.paged_decode_attention(q, k_ref, v_ref, torch.tensor([intact_table], dtype=torch.int32),
                                            seq_lens, scale, w)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, want, atol=1e-4, rtol=1e-4)
    # Prefill of the last 3 positions (a chunk) over the same table.
    qp = torch.randn(3, hq, d, dtype=dtype)
    cu = torch.tensor([0, 3], dtype=torch.int32)
    out_p = mistral_kernels.ops.paged_prefill_attention(qp, k_cache, v_cache, table, cu, seq_lens, scale, w)
    want_p = reference.paged_prefill_attention(qp, k_ref, v_ref, torch.tensor([intact_table], dtype=torch.int32),
                                               cu, seq_lens, scale, w)
    assert torch.isfinite(out_p).all()
    torch.testing.assert_close(out_p, want_p, atol=1e-4, rtol=1e-4)
