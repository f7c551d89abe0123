"""Presence / frequency penalties of the sampler (the OpenAI parameters the server exposes).

Expected logits are written out by hand from the OpenAI rule: ``logit[t] -= presence · [count_t > 0] +
frequency · count_t`` over the tokens generated so far (the prompt does not count).
"""

from __future__ import annotations

import pytest
import torch

from mistral_kernels.sampling import SamplingParams, sample


def test_presence_and_frequency_change_the_greedy_pick() -> None:
    # Token 2 leads by 0.9 over token 1; it was generated twice: 2.0 - (0.5 + 2 · 0.3) = 0.9 < 1.1 → token 1.
    logits = torch.tensor([[0.0, 1.1, 2.0, 0.5]])
    plain = SamplingParams()
    pen = SamplingParams(presence_penalty=0.5, frequency_penalty=0.3)
    assert sample(logits, [plain], [None]).tolist() == [2]
    assert sample(logits, [pen], [None], seen=[[2, 2, 0]], generated=[[2, 2]]).tolist() == [1]
    # a prompt token (in `seen` only) is not penalized
    assert sample(logits, [pen], [None], seen=[[2, 2, 0]], generated=[[]]).tolist() == [2]
    # one occurrence: 2.0 - (0.5 + 0.3) = 1.2 > 1.1 → still token 2
    assert sample(logits, [pen], [None], seen=[[2]], generated=[[2]]).tolist() == [2]


def test_negative_penalty_favours_repeats_and_rows_are_independent() -> None:
    logits = torch.tensor([[1.0, 0.0, 0.9], [1.0, 0.0, 0.9]])
    pen = SamplingParams(frequency_penalty=-0.2)  # token 2 generated once: 0.9 + 0.2 = 1.1 > 1.0
    out = sample(logits, [pen, SamplingParams()], [None, None], seen=[[2], [2]], generated=[[2], [2]])
    assert out.tolist() == [2, 0]


def test_penalty_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="presence_penalty"):
        SamplingParams(presence_penalty=2.5)
    with pytest.raises(ValueError, match="frequency_penalty"):
        SamplingParams(frequency_penalty=-3)
    with pytest.raises(ValueError, match="generated"):
        sample(torch.zeros(1, 4), [SamplingParams(presence_penalty=1.0)], [None])
