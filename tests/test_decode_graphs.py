"""The padded static-buffer decode runner (mistral_kernels/decode_graphs.py) against the plain forward.

Reference: Model.forward on the unpadded batch (AttentionBatch.build) over a copy of the same cache. For
every bucket, a step of B sequences padded up to it gives the same logits, writes the same cache slots and
nothing else (never-written slots hold NaN; padded rows have slot -1 and seq_len 0). Steps run from the
largest bucket down, so stale rows and block-table columns of earlier steps sit in the static buffers. On
CPU the runner is eager; on a GPU (skipped here) the same comparison runs through captured CUDA graphs.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import mistral_kernels
from mistral_kernels.batch import AttentionBatch
from mistral_kernels.config import ModelConfig
from mistral_kernels.decode_graphs import DecodeGraphRunner, decode_buckets

from .helpers.model_helpers import random_model

DENSE = ModelConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=48, vocab_size=64,
                    max_position=96, sliding_window=20)
MOE = ModelConfig(dim=32, n_layers=1, n_heads=4, n_kv_heads=1, head_dim=16, hidden_dim=24, vocab_size=64,
                  max_position=96, num_experts=4, top_k=2)
EMU = ModelConfig(dim=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=64, hidden_dim=48, vocab_size=64,
                  max_position=96, sliding_window=20)  # head_dim 64: a size the CUDA kernels are built for
BLOCK, NUM_BLOCKS = 4, 300


def test_buckets() -> None:
    assert decode_buckets(1) == [1]
    assert decode_buckets(8) == [1, 2, 4, 8]
    assert decode_buckets(6) == [1, 2, 4, 6]
    assert decode_buckets(20) == [1, 2, 4, 8, 16, 20]
    with pytest.raises(ValueError, match="max_batch must be >= 1"):
        decode_buckets(0)


def _steps(max_batch: int, seed: int) -> list[tuple[list[int], list[list[int]], list[int]]]:
    """One decode step per (bucket, B) — B = the bucket and the smallest B that needs it — largest first:
    (token ids, block tables, cached lengths) with disjoint shuffled blocks per sequence."""
    g = torch.Generator().manual_seed(seed)
    buckets = decode_buckets(max_batch)
    sizes = sorted({s for i, bp in enumerate(buckets) for s in (bp, buckets[i - 1] + 1 if i else 1)}, reverse=True)
    steps = []
    for b in sizes:
        blocks = torch.randperm(NUM_BLOCKS, generator=g).tolist()
        cached = torch.randint(0, 50, (b,), generator=g).tolist()
        tables = []
        for c in cached:
            n = (c + 1 + BLOCK - 1) // BLOCK
            tables.append([blocks.pop() for _ in range(n)])
        steps.append((torch.randint(0, 64, (b,), generator=g).tolist(), tables, cached))
    return steps


def _run(config: ModelConfig, device: str, kernels: object, max_batch: int, capture: bool) -> None:
    model = random_model(config, device=device, kernels=kernels, seed=2)
    cache = model.new_cache(NUM_BLOCKS, BLOCK)
    for t in cache.k + cache.v:  # random K/V everywhere a sequence may read; NaN would show a stray read
        t.copy_(torch.randn(t.shape, generator=torch.Generator().manual_seed(7)))
    runner = DecodeGraphRunner(model, cache, NUM_BLOCKS, BLOCK, max_batch, capture=capture)
    assert runner.captured == (runner.buckets if capture else [])
    ref_cache = type(cache)(k=[t.clone() for t in cache.k], v=[t.clone() for t in cache.v])
    for ids, tables, cached in _steps(max_batch, seed=5):
        written = [t[p // BLOCK] * BLOCK + p % BLOCK for t, p in zip(tables, cached)]
        for t in cache.k + cache.v + ref_cache.k + ref_cache.v:  # the new slots: NaN until written
            t.view(-1, *t.shape[2:])[written] = float("nan")
        got = runner.forward(ids, tables, cached)
        batch = AttentionBatch.build(tables, cached, [1] * len(ids), BLOCK, device)
        want = model.forward(torch.tensor(ids, device=device), batch, ref_cache)
        assert got.shape == want.shape == (len(ids), config.vocab_size)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        for a, r in zip(cache.k + cache.v, ref_cache.k + ref_cache.v):  # same slots written, nothing else
            assert torch.equal(a, r)


@pytest.mark.parametrize("config", [DENSE, MOE], ids=["dense-window", "moe"])
def test_padded_runner_equals_unpadded_forward_cpu(config: ModelConfig) -> None:
    _run(config, "cpu", None, max_batch=20, capture=False)


def test_padded_runner_with_the_emulated_cuda_kernels() -> None:
    if not mistral_kernels.emulator_compiled():
        pytest.skip("emulated kernels not built (MK_EMU=OFF); .ci/run requires them")
    from mistral_kernels import emulated

    _run(EMU, "cpu", emulated, max_batch=4, capture=False)


def test_padded_runner_rejects_bad_steps() -> None:
    model = random_model(DENSE, seed=2)
    runner = DecodeGraphRunner(model, model.new_cache(8, BLOCK), 8, BLOCK, 4, capture=False)
    with pytest.raises(ValueError, match="5 sequences exceed the largest bucket 4"):
        runner.forward([1] * 5, [[0]] * 5, [0] * 5)
    with pytest.raises(ValueError, match=r"block 8, outside \[0, 8\)"):
        runner.forward([1], [[8]], [0])
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA model"):
        DecodeGraphRunner(model, model.new_cache(8, BLOCK), 8, BLOCK, 4, capture=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (the eager runner is tested on CPU above)")
@pytest.mark.parametrize("config", [DENSE, MOE], ids=["dense-window", "moe"])
def test_cuda_graphs_equal_unpadded_forward(config: ModelConfig) -> None:
    if not mistral_kernels.cuda_compiled():
        pytest.skip("CUDA kernels not built")
    # the CUDA attention kernels take head_dim 64 / 80 / 96 / 128 / 256 only (test_attention.py)
    _run(dataclasses.replace(config, head_dim=64), "cuda", None, max_batch=20, capture=True)
