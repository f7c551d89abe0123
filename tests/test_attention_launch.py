"""Launch limits and grid shapes of the attention kernels (CUDA grid and split-K limits), against mistral_kernels.reference.

- a batch of more than 65535 decode sequences (grid.y limit: the launch is split into chunks);
- partition_size far beyond the keys (clamped to one partition, not truncated to int → zeros);
- block tables of more than 32 blocks (the decode kernel's per-warp window of block ids);
- many ragged prefill sequences, empty ones included, through the work-list grid (SIMT fp32 and
  tensor-core bf16 kernels), and a mixed batch: its decode rows through the decode kernel (split-K) and
  through the prefill kernel agree with the reference and with each other; the model sends the leading
  decode rows of a mixed step to the decode kernel, and the runner puts every decode row of a mixed step
  first (any order of decodes and prefill chunks), logits back in batch order.
The plans themselves: tests/test_attention_plan.py.
"""

from __future__ import annotations

import dataclasses
import importlib
import unittest.mock

import pytest
import torch

import mistral_kernels
from mistral_kernels import ops, reference as ref
from mistral_kernels.batch import AttentionBatch
from mistral_kernels.config import ModelConfig

from .conftest import Backend, assert_close
from .helpers.model_helpers import random_model
from .helpers.attention import _check_decode, _check_prefill, _to, make_paged


def test_decode_more_than_65535_sequences(backend_one_schedule: Backend) -> None:
    """65537 sequences (3 distinct ones repeated): the grid.y limit is 65535."""
    be = backend_one_schedule
    g = torch.Generator().manual_seed(1)
    p = make_paged([5, 0, 8], 1, 64, 8, torch.float32, g, extra_table_cols=0)
    q3 = torch.randn(3, 1, 64, generator=g)
    want3 = ref.paged_decode_attention(q3, p.k_cache, p.v_cache, p.block_tables, p.seq_lens, 0.125)
    n = 65537
    pick = torch.arange(n) % 3
    pd = _to(p, be.device)
    got = be.ops.paged_decode_attention(q3[pick].to(be.device), pd.k_cache, pd.v_cache, pd.block_tables[pick.to(be.device)],
                                        pd.seq_lens[pick.to(be.device)], 0.125)
    assert_close(got, want3[pick], torch.float32, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("partition_size", [2**31, 2**40, 1])
def test_decode_partition_size_is_clamped(backend_one_schedule: Backend, partition_size: int) -> None:
    be = backend_one_schedule
    _check_decode(be.ops, be.device, [40, 3, 0], 4, 2, 64, 8, torch.float32, None, seed=2,
                  partition_size=partition_size)


@pytest.mark.parametrize("s, window, partition_size", [(1, None, 0), (2, 101, 64), (3, None, 32)])
def test_decode_block_table_window(backend: Backend, s: int, window: int | None, partition_size: int) -> None:
    """Sequences over more than 32 small blocks: the kernel holds 32 block ids per warp and reloads the window
    as its chunks move on (a window start inside a block, split-K partitions starting mid-block)."""
    _check_decode(backend.ops, backend.device, [150, 67, 3], 8, 2, 64, s, torch.float32, window, seed=s,
                  partition_size=partition_size)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_many_ragged_sequences(backend: Backend, dtype: torch.dtype) -> None:
    """11 sequences, some without new tokens, one spanning several 64-row tiles (G = 2)."""
    if not backend.supports(dtype):
        pytest.skip(f"{backend.name} does not support {dtype}")
    q_lens = [3, 0, 1, 40, 0, 7, 1, 33, 2, 0, 5]
    seq_lens = [q + c for q, c in zip(q_lens, [0, 4, 9, 0, 0, 12, 30, 1, 0, 2, 5])]
    _check_prefill(backend.ops, backend.device, seq_lens, q_lens, 4, 2, 64, 8, dtype, None, seed=11)


def test_mixed_batch_through_both_kernels(backend_one_schedule: Backend) -> None:
    """A step of 3 decode rows + one prefill chunk: the decode rows through the decode kernel (split-K) equal
    the same rows through the prefill kernel, and both equal the reference."""
    be = backend_one_schedule
    g = torch.Generator().manual_seed(5)
    seq_lens, q_lens = [50, 9, 77, 30], [1, 1, 1, 12]
    p = make_paged(seq_lens, 2, 64, 8, torch.float32, g)
    q = torch.randn(sum(q_lens), 4, 64, generator=g)
    cu = torch.tensor([0, 1, 2, 3, 15], dtype=torch.int32)
    want = ref.paged_prefill_attention(q, p.k_cache, p.v_cache, p.block_tables, cu, p.seq_lens, 0.125, 20)
    pd = _to(p, be.device)
    pre = be.ops.paged_prefill_attention(q.to(be.device), pd.k_cache, pd.v_cache, pd.block_tables, cu.to(be.device),
                                         pd.seq_lens, 0.125, 20)
    dec = be.ops.paged_decode_attention(q[:3].to(be.device), pd.k_cache, pd.v_cache, pd.block_tables[:3],
                                        pd.seq_lens[:3], 0.125, 20, partition_size=32)
    assert_close(pre, want, torch.float32, atol=1e-4, rtol=1e-4)
    assert_close(dec, want[:3], torch.float32, atol=1e-4, rtol=1e-4)
    assert_close(dec, pre[:3].cpu(), torch.float32, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kernels", ["cpu", "emu"])
def test_model_mixed_step_routes_leading_decodes_to_the_decode_kernel(kernels: str) -> None:
    """A step of 2 decodes then a prefill chunk: AttentionBatch marks the 2 leading decodes, the model sends
    them through paged_decode_attention; the logits equal those of the same step through the prefill kernel
    alone (which tests/test_attention.py checks against the reference)."""
    if kernels == "emu" and not mistral_kernels.emulator_compiled():
        pytest.skip("emulated kernels not built")
    mod = ops if kernels == "cpu" else importlib.import_module("mistral_kernels.emulated")
    cfg = ModelConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64, hidden_dim=48, vocab_size=64,
                      max_position=128, sliding_window=24)
    model = random_model(cfg, kernels=mod, seed=4)
    cache = model.new_cache(40, 8)
    g = torch.Generator().manual_seed(6)
    for t in cache.k + cache.v:
        t.copy_(torch.randn(t.shape, generator=g))
    tables, cached, new = [[3, 9, 4, 12, 2], [7, 1], [20, 21, 22]], [37, 15, 10], [1, 1, 9]
    batch = AttentionBatch.build(tables, cached, new, 8, logits_sequences=[0, 1, 2], num_blocks=40, max_position=128)
    assert (batch.num_decode, batch.prefill_cu_seqlens_q.tolist(), batch.decode_only) == (2, [0, 9], False)
    ids = torch.randint(0, 64, (11,), generator=g)
    calls: list[str] = []
    decode = mod.paged_decode_attention

    def spy(*a: object, **kw: object) -> torch.Tensor:
        calls.append("decode")
        return decode(*a, **kw)

    k0, v0 = [t.clone() for t in cache.k], [t.clone() for t in cache.v]
    with unittest.mock.patch.object(mod, "paged_decode_attention", spy):
        got = model.forward(ids, batch, cache)
    assert calls == ["decode"] * cfg.n_layers
    cache.k, cache.v = k0, v0
    want = model.forward(ids, dataclasses.replace(batch, num_decode=0, prefill_cu_seqlens_q=None), cache)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kernels", ["cpu", "emu"])
def test_runner_mixed_step_sends_every_decode_to_the_decode_kernel(kernels: str) -> None:
    """Chunks in the order decode, prefill (samples), decode, prefill (mid-prompt, no sample): the runner puts
    both decodes first, so each layer calls paged_decode_attention once with both decode rows; the logits,
    back in batch order, equal the same step through the reference ops (mistral_kernels.reference)."""
    from mistral_kernels import reference
    from mistral_kernels.request import Request, RequestTimings
    from mistral_kernels.runner import ModelRunner
    from mistral_kernels.sampling import SamplingParams
    from mistral_kernels.scheduler import ScheduledChunk, SchedulerOutput

    if kernels == "emu" and not mistral_kernels.emulator_compiled():
        pytest.skip("emulated kernels not built")
    mod = ops if kernels == "cpu" else importlib.import_module("mistral_kernels.emulated")
    cfg = ModelConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64, hidden_dim=48, vocab_size=64,
                      max_position=128, sliding_window=24)
    runner = ModelRunner(random_model(cfg, kernels=mod, seed=4), 40, 8, enforce_eager=True)
    g = torch.Generator().manual_seed(6)
    for t in runner.cache.k + runner.cache.v:
        t.copy_(torch.randn(t.shape, generator=g))
    k0, v0 = [t.clone() for t in runner.cache.k], [t.clone() for t in runner.cache.v]
    spec = [([3, 9, 4, 12, 2], 37, 1, True), ([20, 21, 22], 10, 9, True), ([7, 1], 15, 1, True),
            ([30, 31], 0, 13, False)]  # (block_table, num_cached, num_new, samples)
    chunks = [ScheduledChunk(Request(i, [0], SamplingParams(), None, RequestTimings()), cached, new,
                             torch.randint(0, 64, (new,), generator=g).tolist(), table, samples, new == 1)
              for i, (table, cached, new, samples) in enumerate(spec)]
    decode_rows: list[int] = []
    seen: list[torch.Tensor] = []
    decode = mod.paged_decode_attention

    def decode_spy(q: torch.Tensor, *a: object, **kw: object) -> torch.Tensor:
        decode_rows.append(q.shape[0])
        return decode(q, *a, **kw)

    def sample_spy(logits: torch.Tensor, *a: object, **kw: object) -> torch.Tensor:
        seen.append(logits)
        return logits.argmax(-1)

    with (unittest.mock.patch.object(mod, "paged_decode_attention", decode_spy),
          unittest.mock.patch("mistral_kernels.runner.sample", sample_spy)):
        ids, logprobs = runner.execute(SchedulerOutput(chunks, 8, 0))
    assert logprobs is None  # no request asked for them
    assert decode_rows == [2] * cfg.n_layers
    ref_model = random_model(cfg, kernels=reference, seed=4)
    cache = ref_model.new_cache(40, 8)
    cache.k, cache.v = k0, v0
    batch = AttentionBatch.build([c.block_table for c in chunks], [c.num_cached for c in chunks],
                                 [c.num_new for c in chunks], 8, logits_sequences=[0, 1, 2])
    want = ref_model.forward(torch.tensor([t for c in chunks for t in c.token_ids]),
                             dataclasses.replace(batch, num_decode=0, prefill_cu_seqlens_q=None), cache)  # [3, V]
    (got,) = seen
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert ids == want.argmax(-1).tolist()
