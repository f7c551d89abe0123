"""Speculative sampling preserves the target distribution: on a tiny-vocabulary random model, the first
generated tokens' joint distribution with speculation (n-gram point-mass proposals, and a proposer that draws
from a q that disagrees with the model on purpose) equals plain decoding's — a two-sample chi-square test
with fixed seeds — for plain temperature sampling and for every filter and penalty at once. Seeded requests
reproduce their tokens whatever the batch."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from mistral_kernels.config import ModelConfig
from mistral_kernels.engine import Engine
from mistral_kernels.sampling import SamplingParams
from mistral_kernels.speculative import Proposal, SpeculativeConfig
from mistral_kernels.speculative.draft import DraftProposer

from .helpers.model_helpers import random_model
from .helpers.speculative import chi_square_p as _chi_square_p

VOCAB = 8
CONFIG = ModelConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=48, vocab_size=VOCAB,
                     max_position=128, sliding_window=12, eos_token_ids=())
PROMPT = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3]  # repetitive: the n-gram proposer has something to propose
N = 1500  # samples per arm
SETTINGS = {
    "temperature": dict(temperature=1.0),
    "all_filters": dict(temperature=0.8, top_k=6, top_p=0.95, min_p=0.02, repetition_penalty=1.3,
                        presence_penalty=0.4, frequency_penalty=0.3),
}


class SkewedDraft:
    """Proposes k tokens drawn from a fixed q (most mass on token 0, which the model does not favour), with q."""

    def __init__(self) -> None:
        self.q = torch.tensor([0.55] + [0.45 / (VOCAB - 1)] * (VOCAB - 1))
        self.gen = torch.Generator().manual_seed(17)

    def propose(self, requests, k):
        out = []
        for n in k:
            toks = torch.multinomial(self.q, n, replacement=True, generator=self.gen).tolist()
            out.append(Proposal(toks, self.q.expand(n, VOCAB).clone()))
        return out

    def forget(self, rid: int) -> None:
        return None


@pytest.fixture(scope="module")
def model():
    m = random_model(CONFIG, seed=3, fused_cpu_decode=False)
    m.lm_head.mul_(12.0)  # sharper next-token distributions: proposals get accepted as well as rejected
    return m


_PLAIN: dict[str, Counter] = {}


def _plain(model, setting: str) -> Counter:
    """Plain decoding's samples of a setting (made once per module: other seeds than the speculative arm's)."""
    if setting not in _PLAIN:
        _PLAIN[setting] = _samples(model, None, None, SETTINGS[setting], seed0=10**6)[0]
    return _PLAIN[setting]


def _samples(model, spec: SpeculativeConfig | None, proposer, params: dict, n: int = N,
             seed0: int = 0) -> tuple[Counter, Engine]:
    engine = Engine(model, None, num_blocks=600, block_size=4, max_batch=48, max_tokens_per_step=1024,
                    eos_ids=[], speculative=spec, proposer=proposer)
    jobs = [(PROMPT, SamplingParams(max_new_tokens=5, ignore_eos=True, seed=seed0 + i, **params)) for i in range(n)]
    done = engine.generate(jobs)
    return Counter(tuple(c.token_ids[1:3]) for c in done), engine  # tokens 2-3: after a verify step


@pytest.mark.parametrize("method,setting", [("ngram", "temperature"), ("skewed_draft", "all_filters"),
                                            ("draft_model", "temperature")])
def test_first_tokens_distribution_equals_plain_sampling(model, setting: str, method: str) -> None:
    """n-gram point masses; a q that disagrees on purpose; a draft model (another random model, its softmax)."""
    params = SETTINGS[setting]
    plain = _plain(model, setting)
    spec = SpeculativeConfig(num_tokens=3, ngram_min=1, max_batch=64, max_rows=1000, adaptive=False)
    proposer = {"ngram": lambda: None, "skewed_draft": SkewedDraft,
                "draft_model": lambda: DraftProposer(random_model(CONFIG.replace(n_layers=1), seed=8,
                                                                  fused_cpu_decode=False), 600, 4, seed=1)}[method]()
    got, engine = _samples(model, spec, proposer, params)
    s = engine.stats
    assert s.spec_accepted_tokens > 0.05 * s.spec_proposed_tokens > 0   # both branches taken many times
    assert s.spec_accepted_tokens < 0.95 * s.spec_proposed_tokens
    p, tv = _chi_square_p(plain, got)
    assert p > 1e-3 and tv < 0.12, (p, tv)


def test_the_chi_square_check_sees_a_wrong_distribution(model) -> None:
    """The same test rejects samples of another distribution (temperature 1.4 instead of 1)."""
    plain = _plain(model, "temperature")
    other, _ = _samples(model, None, None, dict(temperature=1.4))
    p, _ = _chi_square_p(plain, other)
    assert p < 1e-3


def test_seeded_requests_reproduce_whatever_the_batch(model) -> None:
    spec = SpeculativeConfig(num_tokens=3, ngram_min=1, max_batch=64, max_rows=1000, adaptive=False)
    params = SamplingParams(max_new_tokens=12, ignore_eos=True, seed=42, **SETTINGS["all_filters"])

    def run(extra: int) -> list[int]:
        engine = Engine(model, None, num_blocks=200, block_size=4, max_batch=8, eos_ids=[], speculative=spec)
        others = [(PROMPT[:5 + i], SamplingParams(max_new_tokens=9, temperature=1.0)) for i in range(extra)]
        done = engine.generate(others + [(PROMPT, params)])
        assert engine.stats.spec_proposed_tokens > 0
        return done[-1].token_ids

    alone = run(0)
    assert run(3) == alone and run(6) == alone
