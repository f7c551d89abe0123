"""logit_bias and min_tokens in the sampler (mistral_kernels.logit_bias) on CPU tensors (the edits are plain
torch scatters: the same code runs on CUDA tensors, in tests/test_sync_free.py's GPU test, without a sync). Expected values written out by hand from the rules: ``logit += bias``;
EOS and stop ids at -inf while fewer than ``min_tokens`` tokens are out."""

from __future__ import annotations

import pytest
import torch

from mistral_kernels.logit_bias import apply_logit_bias, apply_min_tokens
from mistral_kernels.sampling import SamplingParams, sample


def test_bias_is_added_per_row() -> None:
    x = torch.zeros(2, 6)
    apply_logit_bias(x, [SamplingParams(logit_bias={1: 2.5, 4: -100}), SamplingParams(logit_bias={"5": 1})])
    assert x.tolist() == [[0, 2.5, 0, 0, -100, 0], [0, 0, 0, 0, 0, 1]]


def test_bias_forces_and_bans_greedy_and_sampled() -> None:
    logits = torch.tensor([[3.0, 1.0, 0.0, -2.0]] * 2)
    force = SamplingParams(logit_bias={3: 100})
    ban = SamplingParams(logit_bias={0: -100})
    assert sample(logits, [force, ban], [None, None]).tolist() == [3, 1]
    g = torch.Generator().manual_seed(0)
    hot = [SamplingParams(temperature=1.0, logit_bias={0: -100})] * 2
    draws = torch.stack([sample(logits, hot, [g, g]) for _ in range(300)])
    assert not (draws == 0).any()                    # banned: never drawn
    # the rest keeps its relative odds: p(1) / p(2) = e^1 for the unbiased tokens 1 and 2 (about 0.71 vs 0.26)
    share = (draws == 1).float().mean().item()
    assert 0.62 < share < 0.80


def test_min_tokens_masks_eos_and_stop_ids_until_reached() -> None:
    x = torch.zeros(3, 5)
    params = [SamplingParams(min_tokens=2, stop_token_ids=(4,)), SamplingParams(min_tokens=2),
              SamplingParams(min_tokens=1, ignore_eos=True, stop_token_ids=(3,))]
    apply_min_tokens(x, params, [1, 2, 0], eos_ids={0})
    inf = float("-inf")
    assert x.tolist() == [[inf, 0, 0, 0, inf], [0, 0, 0, 0, 0], [0, 0, 0, inf, 0]]
    # through sample: EOS leads, yet the first rows pick the next best until min_tokens are out
    logits = torch.tensor([[5.0, 1.0, 2.0, 0.0, 0.0]] * 2)
    p = SamplingParams(min_tokens=2)
    assert sample(logits, [p, p], [None, None], generated=[[7], [7, 8]], eos_ids={0}).tolist() == [2, 0]
    with pytest.raises(ValueError, match="generated"):
        sample(logits, [p, p], [None, None], eos_ids={0})


def test_values_are_checked() -> None:
    for bad, match in [({1: 101}, "logit_bias values"), ({"x": 1}, "logit_bias keys"), ({True: 1}, "logit_bias keys"),
                       ({1: "2"}, "logit_bias values")]:
        with pytest.raises(ValueError, match=match):
            SamplingParams(logit_bias=bad)
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(min_tokens=5, max_new_tokens=4)
    with pytest.raises(ValueError, match="logit_bias has token id"):
        SamplingParams(logit_bias={70: 1}).check_vocabulary(64)
    with pytest.raises(ValueError, match="stop_token_ids has token id"):
        SamplingParams(stop_token_ids=(64,)).check_vocabulary(64)
    assert SamplingParams(logit_bias=[(2, 1), (1, -1)]).logit_bias == ((1, -1.0), (2, 1.0))
