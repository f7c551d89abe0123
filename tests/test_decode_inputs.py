"""CpuDecodeInputs (mistral_kernels/decode_inputs.py): in-place decode-step index buffers against
AttentionBatch.build (the reference: fresh tensors from the same host lists) over a random run of steps in
which rows change request, tables grow past the allocated width and B changes; its errors; and a decode
through the model with its batch gives the logits of the built batch. Also the model's serial fp32 cast of a
decode step's logits (vs ``Tensor.float()``).

Shape letters: B sequences, V vocab.
"""

from __future__ import annotations

import random

import pytest
import torch

from mistral_kernels.batch import AttentionBatch
from mistral_kernels.config import ModelConfig
from mistral_kernels.decode_inputs import CpuDecodeInputs

from .helpers.model_helpers import random_model

BLOCK, NUM_BLOCKS, MAX_POS, MAX_BATCH = 4, 400, 300, 5


def _check(inputs: CpuDecodeInputs, ids: list[int], tables: list[list[int]], cached: list[int]) -> None:
    got_ids, got = inputs.step(ids, tables, cached)
    ref = AttentionBatch.build(tables, cached, [1] * len(ids), BLOCK, num_blocks=NUM_BLOCKS, max_position=MAX_POS)
    assert got.decode_only and got.logits_indices is None and got.num_decode == 0
    assert torch.equal(got_ids, torch.tensor(ids, dtype=torch.int64))
    for name in ("positions", "slot_mapping", "seq_lens", "cu_seqlens_q"):
        a, b = getattr(got, name), getattr(ref, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert got.block_tables.dtype == torch.int32 and got.block_tables.is_contiguous()
    assert got.block_tables.shape[0] == len(ids) and got.block_tables.shape[1] >= ref.block_tables.shape[1]
    for s, c in enumerate(cached):  # the columns the kernels read: j < ceil(seq_len / block_size)
        n = c // BLOCK + 1
        assert got.block_tables[s, :n].tolist() == tables[s][:n], s


def test_matches_build_over_a_random_run() -> None:
    rng = random.Random(0)
    inputs = CpuDecodeInputs(MAX_BATCH, BLOCK, NUM_BLOCKS, MAX_POS)
    live: dict[int, tuple[list[int], int]] = {}  # request → (table, cached)
    next_rid = 0
    for _ in range(120):
        # requests finish / arrive (rows change), some with tables wider than the initial 16 columns
        for rid in [r for r in live if rng.random() < 0.08]:
            del live[rid]
        while len(live) < rng.randint(1, MAX_BATCH):
            cached = rng.randint(0, 200)
            live[next_rid] = ([rng.randrange(NUM_BLOCKS) for _ in range(cached // BLOCK + 1)], cached)
            next_rid += 1
        order = sorted(live)
        if rng.random() < 0.05:  # a preempted request comes back with other blocks, same length
            rid = order[0]
            table, cached = live[rid]
            live[rid] = ([rng.randrange(NUM_BLOCKS) for _ in table], cached)
        tables = [live[r][0] for r in order]
        cached = [live[r][1] for r in order]
        _check(inputs, [rng.randrange(1000) for _ in order], [list(t) for t in tables], cached)
        for r in order:  # advance one token; a new block when the next position starts one
            table, c = live[r]
            c += 1
            if c // BLOCK >= len(table):
                table = table + [rng.randrange(NUM_BLOCKS)]
            live[r] = (table, c) if c < MAX_POS - 1 else ([0], 0)
    assert inputs.block_tables.shape[1] > CpuDecodeInputs.INITIAL_WIDTH  # the tables were widened on the way


def test_errors_name_the_problem_and_the_row_recovers() -> None:
    inputs = CpuDecodeInputs(2, BLOCK, NUM_BLOCKS, MAX_POS)
    with pytest.raises(ValueError, match=r"need 1 ≤ B ≤ 2 equally long lists"):
        inputs.step([1, 2, 3], [[1], [2], [3]], [0, 0, 0])
    with pytest.raises(ValueError, match=r"need 1 ≤ B ≤ 2 equally long lists"):
        inputs.step([1], [[1], [2]], [0])
    with pytest.raises(ValueError, match=r"position 300, outside the model's positions \[0, 300\)"):
        inputs.step([1], [list(range(80))], [300])
    with pytest.raises(ValueError, match="sequence 0 needs 9 tokens but its block table holds 2 blocks of 4"):
        inputs.step([1], [[5, 6]], [8])
    with pytest.raises(ValueError, match=r"sequence 1's block table holds block 400, outside \[0, 400\)"):
        inputs.step([1, 2], [[5], [7, 400]], [0, 5])
    _check(inputs, [1, 2], [[5], [7, 8]], [1, 5])  # row 1 was left half-written: rewritten in full


CONFIG = ModelConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=48, vocab_size=64,
                     max_position=MAX_POS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_model_decode_with_the_buffers_equals_the_built_batch(dtype: torch.dtype) -> None:
    """Three decode steps of B = 3 through Model.forward (fused CPU decode) with the buffers' batch and with a
    built one, each on its own copy of the same cache: equal logits and caches."""
    model = random_model(CONFIG, seed=3, dtype=dtype)
    cache = model.new_cache(NUM_BLOCKS, BLOCK)
    for t in cache.k + cache.v:
        t.normal_(generator=torch.Generator().manual_seed(4))
    ref_cache = model.new_cache(NUM_BLOCKS, BLOCK)
    for a, b in zip(ref_cache.k + ref_cache.v, cache.k + cache.v):
        a.copy_(b)
    inputs = CpuDecodeInputs(4, BLOCK, NUM_BLOCKS, MAX_POS)
    tables, cached = [[9, 3, 17, 21], [40, 41], [2, 8, 11, 12, 13]], [10, 2, 17]
    for step in range(3):
        ids = [7 + step, 30, 63]
        now = [c + step for c in cached]
        got = model.forward(*inputs.step(ids, tables, now), cache)
        batch = AttentionBatch.build(tables, now, [1, 1, 1], BLOCK)
        want = model.forward(torch.tensor(ids), batch, ref_cache)
        assert torch.equal(got, want)
    for a, b in zip(cache.k + cache.v, ref_cache.k + ref_cache.v):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(1, 49152), (3, 40000), (9, 32768), (2, 5)])
def test_fp32_logits_is_the_fp32_cast(dtype: torch.dtype, shape: tuple[int, int]) -> None:
    """Model.forward's cast of the head's output (serial in pieces for a decode step's logits, mistral_kernels.
    model.fp32_logits) equals ``Tensor.float()`` (the reference), above and below the serial limit."""
    from mistral_kernels.model import fp32_logits

    y = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    got = fp32_logits(y)
    assert got.dtype == torch.float32 and torch.equal(got, y.float())
    assert (got.data_ptr() == y.data_ptr()) == (dtype == torch.float32)
