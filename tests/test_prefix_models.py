"""Prefix caching changes no result: real models through the engine, with and without the cache.

For tiny Mistral (sliding window 16), tiny Mixtral and SmolLM2 (the real default model), one script of
requests runs on two engines — ``prefix_caching=False`` and ``True`` — and every request's greedy tokens
must be equal and its logits at each sampled step within fp32 tolerance (docs/design.md §5: 1e-4, the
incremental-decode bound); the engine without the cache is checked against transformers in test_engine.py,
test_model_parity.py and test_smollm2.py (whose session fixture runs the SmolLM2 case, see there). The
script covers: a system prompt shared across a batch, a request after the first finished, prefixes ending
exactly on / one off a block boundary, a strict prefix of a cached request, and preemption under a tiny
pool with shared blocks; the cached run must really hit (and preempt).
Shape letters: V vocab, S sampled steps of a request.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from mistral_kernels import load_model
from mistral_kernels.engine import Engine
from mistral_kernels.sampling import SamplingParams

from .helpers.engine import CharTokenizer, ToyModel, tiny_mistral  # noqa: F401  (fixture)
from .helpers.model_parity import COMMON

from .helpers.prefix_models import _run, _script, check_prefix_caching_changes_nothing

transformers = pytest.importorskip("transformers")


def test_tiny_mistral_sliding_window(tiny_mistral) -> None:  # noqa: F811
    model, _ = tiny_mistral
    assert model.config.sliding_window == 16
    check_prefix_caching_changes_nothing(model, 8, pool=5, budget=8)


@pytest.fixture(scope="module")
def tiny_mixtral(tmp_path_factory: pytest.TempPathFactory):
    torch.manual_seed(0)
    hf = transformers.MixtralForCausalLM(transformers.MixtralConfig(num_local_experts=4, num_experts_per_tok=2,
                                                                    rope_theta=1e6, **COMMON)).eval()
    path: Path = tmp_path_factory.mktemp("tiny_mixtral")
    hf.save_pretrained(path)
    model = load_model(path, progress=False)
    assert model.config.is_moe and model.config.sliding_window is None
    return model


def test_tiny_mixtral(tiny_mixtral) -> None:
    check_prefix_caching_changes_nothing(tiny_mixtral, 8, pool=9, budget=16)


@pytest.mark.parametrize("window", [None, 6])
def test_toy_model_flags_stats_and_metrics(window: int | None) -> None:
    """The toy model (next token = hash of the keys read through the block table, NaN in unwritten slots) gives
    the same tokens with the cache; the hit counters reach the stats line and the server's metrics."""
    phases, preempt = _script(50, 4, 3, new=9, new_preempt=12)
    want, _, _ = _run(ToyModel(window=window), phases + [preempt], caching=False, num_blocks=64, bs=4, budget=8)
    got, _, stats = _run(ToyModel(window=window), phases + [preempt], caching=True, num_blocks=64, bs=4, budget=8)
    assert got == want and stats.prefix_hit_tokens > 14 * 4
    from mistral_kernels.cli import build_parser, prefix_cache_stats

    args = build_parser().parse_args(["generate", "--prompt", "x"])
    assert args.enable_prefix_caching
    assert not build_parser().parse_args(["serve", "--no-enable-prefix-caching"]).enable_prefix_caching
    eng = Engine(ToyModel(window=window), CharTokenizer(), num_blocks=16, block_size=4)
    assert prefix_cache_stats(eng) == "prefix cache hit 0.0% (0/0 tok)"
    eng.run([eng.add_request(list(range(10)), SamplingParams(max_new_tokens=3))])
    eng.run([eng.add_request(list(range(9)) + [20], SamplingParams(max_new_tokens=3))])
    assert prefix_cache_stats(eng) == "prefix cache hit 40.0% (8/20 tok)"
    off = Engine(ToyModel(window=window), CharTokenizer(), num_blocks=16, block_size=4, prefix_caching=False)
    assert prefix_cache_stats(off) == "prefix cache off"
    pytest.importorskip("prometheus_client")
    from mistral_kernels.serve.metrics import ServerMetrics

    text = ServerMetrics(eng).render().decode()
    cached = eng.blocks.num_evictable_blocks
    assert cached == 4      # 12 computed positions each: 3 blocks of the 1st + the 2nd's own 3rd block
    for line in ("prefix_cache_queries_total 20.0", "prefix_cache_hits_total 8.0", "kv_blocks_used 0.0",
                 f"kv_blocks_cached {cached}.0", "kv_blocks_total 16.0"):
        assert f"mistral_kernels_{line}\n" in text, line
