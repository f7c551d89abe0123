"""Sampling: filters match transformers' logits processors; draws follow the filtered distribution; seeds
reproduce; greedy is argmax; rows are independent of their batch neighbours."""

from __future__ import annotations

import pytest
import torch

from mistral_kernels.sampling import SamplingParams, apply_filters, sample

transformers = pytest.importorskip("transformers")
from transformers.generation.logits_process import (  # noqa: E402
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

V = 97


def _hf_filter(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    ids = torch.zeros(logits.shape[0], 1, dtype=torch.long)
    x = TemperatureLogitsWarper(temperature)(ids, logits.clone())
    if top_k:
        x = TopKLogitsWarper(top_k)(ids, x)
    if top_p < 1.0:
        x = TopPLogitsWarper(top_p)(ids, x)
    if min_p > 0.0:
        x = MinPLogitsWarper(min_p)(ids, x)
    return x


@pytest.mark.parametrize("temperature,top_k,top_p,min_p", [
    (1.0, 0, 1.0, 0.0), (0.7, 5, 1.0, 0.0), (1.3, 0, 0.8, 0.0), (1.0, 0, 1.0, 0.05),
    (0.9, 20, 0.9, 0.02), (2.0, 1, 1.0, 0.0), (1.0, 0, 0.3, 0.0),
])
def test_filters_match_transformers(temperature: float, top_k: int, top_p: float, min_p: float) -> None:
    torch.manual_seed(1)
    logits = torch.randn(6, V) * 3
    b = logits.shape[0]
    ours = apply_filters(logits, torch.full((b,), temperature), torch.full((b,), top_k, dtype=torch.int64),
                         torch.full((b,), top_p), torch.full((b,), min_p))
    theirs = _hf_filter(logits, temperature, top_k, top_p, min_p)
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    kept = ~torch.isinf(ours)
    torch.testing.assert_close(ours[kept], theirs[kept])


def test_repetition_penalty_matches_transformers() -> None:
    torch.manual_seed(2)
    logits = torch.randn(2, V) * 2
    seen = [[3, 5, 5, 90], [0, 1, 2]]
    want = logits.clone()
    for r in range(2):
        want[r:r + 1] = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([seen[r]]), logits[r:r + 1].clone())
    p = SamplingParams(repetition_penalty=1.3)
    got = sample(logits, [p, p], [None, None], seen)
    assert torch.equal(got, want.argmax(-1))
    # The penalty changes the greedy choice when the best token was seen.
    top = int(logits[0].argmax())
    got2 = sample(logits[:1], [SamplingParams(repetition_penalty=100.0)], [None], [[top]])
    assert int(got2[0]) != top


def test_greedy_is_argmax_and_ignores_filters() -> None:
    torch.manual_seed(3)
    logits = torch.randn(5, V)
    params = [SamplingParams(temperature=0.0, top_k=3, top_p=0.5)] * 5
    assert torch.equal(sample(logits, params, [None] * 5), logits.argmax(-1))


def test_draws_follow_filtered_distribution() -> None:
    torch.manual_seed(4)
    logits = torch.randn(1, 12) * 1.5
    params = SamplingParams(temperature=0.8, top_k=6, top_p=0.95)
    probs = _hf_filter(logits, 0.8, 6, 0.95, 0.0).softmax(-1)[0]
    n = 20000
    gen = torch.Generator().manual_seed(0)
    batch = logits.expand(n, -1).contiguous()
    draws = sample(batch, [params] * n, [gen] * n)
    freq = torch.bincount(draws, minlength=12).float() / n
    assert freq[probs == 0].sum() == 0                                 # filtered tokens never drawn
    sd = (probs * (1 - probs) / n).sqrt()
    assert ((freq - probs).abs() <= 5 * sd + 1e-4).all(), (freq, probs)


def test_seed_reproducible_and_batch_independent() -> None:
    torch.manual_seed(5)
    logits = torch.randn(3, V)
    p = SamplingParams(temperature=1.0, top_p=0.9, seed=7)
    q = SamplingParams(temperature=1.0)

    def run(rows: list[int]) -> list[int]:
        gens = [torch.Generator().manual_seed(7) if r == 0 else torch.Generator().manual_seed(100 + r)
                for r in rows]
        out = []
        for _ in range(10):
            out.append(sample(logits[rows], [p if r == 0 else q for r in rows], gens).tolist()[rows.index(0)])
        return out

    alone = run([0])
    assert run([0]) == alone
    assert run([2, 0, 1]) == alone                                     # same tokens whatever the neighbours
    other = []
    g = torch.Generator().manual_seed(8)
    for _ in range(10):
        other.append(int(sample(logits[:1], [p], [g])[0]))
    assert other != alone                                             # a different seed differs


def test_bad_params_raise() -> None:
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(top_k=-2)
    with pytest.raises(ValueError, match="min_p"):
        SamplingParams(min_p=1.5)
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingParams(max_new_tokens=0)
    with pytest.raises(ValueError, match="stop"):
        SamplingParams(stop=("",))
    assert SamplingParams(stop="###").stop == ("###",)


@pytest.mark.parametrize("tiny", [1e-38, 1e-6, 1e-5])
def test_tiny_temperature_is_greedy(tiny: float) -> None:
    # Dividing by 1e-38 overflows every logit to ±inf; softmax is then NaN and the draw is token 0 whatever
    # the logits. At or below 1e-5 the row must be greedy: the argmax, whatever the generator.
    torch.manual_seed(0)
    logits = torch.randn(4, 50)
    params = SamplingParams(temperature=tiny)
    assert params.temperature == 0.0 and params.greedy
    gens = [torch.Generator().manual_seed(i) for i in range(4)]
    assert sample(logits, [params] * 4, gens).tolist() == logits.argmax(dim=-1).tolist()
    assert not SamplingParams(temperature=2e-5).greedy


@pytest.mark.parametrize("bad", [2.0001, 100.0, float("inf"), float("nan"), -1e-38])
def test_temperature_out_of_range_raises(bad: float) -> None:
    with pytest.raises(ValueError, match=r"temperature must be in \[0, 2\]"):
        SamplingParams(temperature=bad)
    assert SamplingParams(temperature=2.0).temperature == 2.0
