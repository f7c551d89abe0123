"""Speculative decoding on tiny random models with the real kernels: greedy outputs token-identical with and
without n-gram speculation — the CPU's fused decode step (verify rows as single-token rows of one sequence),
the per-op layers, a sliding window and per-layer windows, batches under continuous batching, prefix caching,
forced preemption — and with the emulated CUDA kernels (padded decode runner) on a tiny case."""

from __future__ import annotations

import pytest
import torch

import mistral_kernels
from mistral_kernels.config import ModelConfig
from mistral_kernels.engine import Engine
from mistral_kernels.sampling import SamplingParams
from mistral_kernels.speculative import SpeculativeConfig
from mistral_kernels.speculative.draft import DraftProposer, check_same_vocabulary

from .helpers.model_helpers import random_model
from .helpers.speculative import PoolChecker, run_engine

WINDOW = ModelConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=48, vocab_size=24,
                     max_position=160, sliding_window=10, eos_token_ids=())
LAYERS = ModelConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=48, vocab_size=24,
                     max_position=160, eos_token_ids=()).with_layer_windows((9, None))
EMU = ModelConfig(dim=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=64, hidden_dim=48, vocab_size=24,
                  max_position=96, sliding_window=12, eos_token_ids=())  # head_dim 64: built for the CUDA kernels


def _model(config: ModelConfig, **kw):
    m = random_model(config, seed=5, **kw)
    m.lm_head.mul_(6.0)  # sharper logits: greedy outputs settle into loops the n-gram proposer predicts
    return m


def _jobs(n: int, vocab: int, max_new: int = 40) -> list:
    g = torch.Generator().manual_seed(n)
    jobs = []
    for i in range(n):
        motif = torch.randint(0, vocab, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g).tolist()
        prompt = (motif * 4)[:int(torch.randint(3, 20, (1,), generator=g))]
        stop = (int(torch.randint(0, vocab, (1,), generator=g)),) if i % 3 == 2 else ()
        jobs.append((prompt, SamplingParams(max_new_tokens=max_new - i % 7, stop_token_ids=stop)))
    return jobs


def _compare(model, jobs, *, max_batch: int, num_blocks: int = 300, budget: int = 64, k: int = 4,
             enforce_eager: bool | None = None, paths: dict | None = None, draft=None) -> Engine:
    def make(spec):
        def engine() -> Engine:
            proposer = None if spec is None or draft is None else DraftProposer(draft, num_blocks, 4)
            e = Engine(model, None, num_blocks=num_blocks, block_size=4, max_batch=max_batch,
                       max_tokens_per_step=budget, eos_ids=[], enforce_eager=enforce_eager, speculative=spec,
                       proposer=proposer)
            if paths is not None and spec is not None:  # count the verify steps of the chunked-prefill path
                mixed = e.runner._forward_mixed

                def counted(chunks, block_size):
                    key = "mixed" if any(c.draft for c in chunks) else "other"
                    paths[key] = paths.get(key, 0) + 1
                    return mixed(chunks, block_size)
                e.runner._forward_mixed = counted
            return e
        return engine

    want, _, _ = run_engine(make(None), jobs)
    spec = SpeculativeConfig(num_tokens=k, max_batch=8, max_rows=200, method="draft" if draft is not None else "ngram",
                             draft_model="given" if draft is not None else None, row_cost=0.1)
    got, streamed, engine = run_engine(make(spec), jobs, check=PoolChecker())
    for w, g in zip(want, got):
        assert (g.token_ids, g.finish_reason, g.stop_reason) == (w.token_ids, w.finish_reason, w.stop_reason)
    assert streamed == [c.token_ids for c in got]
    assert engine.stats.spec_accepted_tokens > 0 and engine.blocks.num_used_blocks == 0
    return engine


@pytest.mark.parametrize("batch", [1, 4, 8])
@pytest.mark.parametrize("config", [WINDOW, LAYERS], ids=["window", "layer-windows"])
def test_greedy_identical_fused_cpu_decode(config: ModelConfig, batch: int) -> None:
    model = _model(config)
    assert model.cpu_decode is not None  # verify steps run as fused decode steps
    _compare(model, _jobs(9, config.vocab_size), max_batch=batch)


def test_greedy_identical_per_op_layers_and_forced_preemption() -> None:
    model = _model(WINDOW, fused_cpu_decode=False)
    engine = _compare(model, _jobs(8, WINDOW.vocab_size, max_new=60), max_batch=6, num_blocks=12, budget=16)
    assert engine.stats.preemptions > 0


def test_greedy_identical_mixed_prefill_and_verify_steps() -> None:
    """More proposal rows than the decode buffers hold and prefill chunks in the same steps: the chunked-prefill
    path verifies (causal among the new rows, windows respected)."""
    model = _model(LAYERS)
    paths: dict[str, int] = {}
    _compare(model, _jobs(8, LAYERS.vocab_size), max_batch=8, budget=24, k=8, paths=paths)
    assert paths.get("mixed", 0) > 0


def test_greedy_identical_with_the_emulated_cuda_kernels() -> None:
    if not mistral_kernels.emulator_compiled():
        pytest.skip("emulated kernels not built (MK_EMU=OFF); .ci/run requires them")
    from mistral_kernels import emulated

    model = random_model(EMU, kernels=emulated, seed=5)
    model.lm_head.mul_(6.0)
    engine = _compare(model, _jobs(3, EMU.vocab_size, max_new=14), max_batch=2, num_blocks=40, k=3,
                      enforce_eager=False)
    assert engine.runner.decode_graphs is not None  # verify rows through the padded decode runner


@pytest.mark.parametrize("which", ["same", "other", "windowed"])
def test_greedy_identical_with_a_draft_model(which: str) -> None:
    """The draft proposes with its own paged cache kept in step with the accepted tokens: the target itself
    (everything accepted), another random model (mostly rejected), another with a short window."""
    model = _model(WINDOW)
    draft = {"same": lambda: model, "other": lambda: random_model(WINDOW.replace(n_layers=1), seed=9),
             "windowed": lambda: random_model(WINDOW.replace(n_layers=1, sliding_window=5), seed=9)}[which]()
    engine = _compare(model, _jobs(7, WINDOW.vocab_size), max_batch=4, num_blocks=60, budget=24, draft=draft)
    s = engine.stats
    if which == "same":
        assert s.spec_accepted_tokens == s.spec_proposed_tokens > 50
    else:
        assert s.spec_accepted_tokens < s.spec_proposed_tokens


def test_draft_vocabulary_is_checked() -> None:
    from .helpers.engine import CharTokenizer

    with pytest.raises(ValueError, match="its vocabulary has 30 tokens, the target's 24"):
        check_same_vocabulary(24, 30)

    class Shifted(CharTokenizer):
        def token_bytes(self, token_id: int) -> bytes:
            return super().token_bytes((token_id + 1) % self.vocab_size)

    with pytest.raises(ValueError, match="token 0 is"):
        check_same_vocabulary(50, 50, CharTokenizer(), Shifted())
    check_same_vocabulary(50, 50, CharTokenizer(), CharTokenizer())


def test_default_model_llm_greedy_identical_with_ngram_and_self_draft() -> None:
    """SmolLM2-135M Q4_1 (packed kernels, fused CPU decode of verify rows): ``LLM(speculative=...)`` gives plain
    decoding's tokens on copy-style prompts (proposals accepted and rejected), n-gram and the model as its own
    draft."""
    from mistral_kernels.llm import LLM

    from .helpers.default_model_files import default_model_or_skip

    path = default_model_or_skip()
    prompts = ["Copy this text word for word:\n\nThe quick brown fox jumps over the lazy dog, and the dog sleeps on.",
               "List the numbers from one to twelve in words, separated by commas."]
    # No prefix caching: with it, the second prompt (the same system prompt) waits for the first one's prefix
    # blocks, so the first prompt's first decode row runs in a step that also prefills — GEMM rows, equal to
    # a GEMV row only within the int8 activations' error (README) — and the two engines need not make the
    # same step compositions. Without it every decode and verify row is a GEMV row, equal bit for bit.
    want = LLM(path, prefix_caching=False).generate(prompts, chat=True, max_new_tokens=40)
    for spec in (SpeculativeConfig(row_cost=0.1),
                 SpeculativeConfig(method="draft", draft_model=str(path), num_tokens=2, row_cost=0.1)):
        llm = LLM(path, speculative=spec, prefix_caching=False)
        got = llm.generate(prompts, chat=True, max_new_tokens=40)
        assert [c.token_ids for c in got] == [c.token_ids for c in want]
        assert llm.engine.stats.spec_accepted_tokens > 0
