"""``SamplingParams.logprobs``: each generated token's log-probability and the top-k alternatives under the
raw model distribution, checked against ``log_softmax`` of transformers' logits of the tiny random Mistral
(full recompute of prompt + generated tokens), for greedy and sampled requests (with penalties, which do not
change the raw distribution) batched and chunked together; streaming drains them in order."""

from __future__ import annotations

import pytest
import torch

from mistral_kernels.engine import Engine
from mistral_kernels.logprobs import token_logprobs
from mistral_kernels.sampling import MAX_LOGPROBS, SamplingParams

from .helpers.engine import tiny_mistral  # noqa: F401  (module fixture)

transformers = pytest.importorskip("transformers")


@torch.no_grad()
def _reference(hf, prompt: list[int], out: list[int]) -> torch.Tensor:
    """log_softmax [len(out), V] of the positions that predicted ``out``."""
    ids = torch.tensor([prompt + out])
    logits = hf(ids, use_cache=False).logits[0].float()
    return logits[len(prompt) - 1:len(prompt) - 1 + len(out)].log_softmax(dim=-1)


def test_token_logprobs_worked_example() -> None:
    got = token_logprobs(torch.tensor([[2.0, 1.0, 0.0], [0.0, 0.0, 5.0]]), torch.tensor([1, 2]), [2, None])
    ref = torch.tensor([2.0, 1.0, 0.0]).log_softmax(0)
    assert got[1] is None and got[0] is not None
    assert got[0].token_id == 1 and got[0].logprob == pytest.approx(float(ref[1]), abs=1e-6)
    assert [t for t, _ in got[0].top] == [0, 1]
    assert [v for _, v in got[0].top] == pytest.approx(ref[:2].tolist(), abs=1e-6)


def test_top_logprobs_order_ties_as_greedy_does() -> None:
    # 16-bit logits tie often; greedy takes the lowest id among equal maxima (sampling.py), so the top entries
    # list equal values lowest id first and a greedy token is its own first entry. Many equal values, the
    # maximum at high ids among lower ones: an unstable order would put another id first.
    logits = torch.zeros(2, 4096)
    logits[0, [7, 300, 2000, 4000]] = 3.0
    logits[1, 1000:] = 1.0
    greedy = logits.argmax(dim=-1)
    got = token_logprobs(logits, greedy, [5, 3])
    assert [t for t, _ in got[0].top] == [7, 300, 2000, 4000, 0]
    assert [t for t, _ in got[1].top] == [1000, 1001, 1002]
    assert all(g.top[0][0] == g.token_id for g in got)


def test_logprobs_equal_transformers_log_softmax(tiny_mistral) -> None:  # noqa: F811
    model, hf = tiny_mistral
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, 128, (n,), generator=g).tolist() for n in (5, 30, 12)]
    params = [SamplingParams(max_new_tokens=10, logprobs=5),
              SamplingParams(max_new_tokens=8, temperature=0.9, top_k=20, seed=4, repetition_penalty=1.3,
                             presence_penalty=0.5, logprobs=3),
              SamplingParams(max_new_tokens=6, temperature=1.2, seed=9, logprobs=0),
              SamplingParams(max_new_tokens=6)]
    eng = Engine(model, None, num_blocks=32, block_size=8, max_batch=4, max_tokens_per_step=16, eos_ids=())
    done = eng.generate(list(zip(prompts + [prompts[0]], params)))
    assert done[3].logprobs is None
    for c, p, sp in zip(done, prompts, params):
        if sp.logprobs is None:
            continue
        ref = _reference(hf, p, c.token_ids)
        assert c.logprobs is not None and len(c.logprobs) == len(c.token_ids)
        for i, (lp, tok) in enumerate(zip(c.logprobs, c.token_ids)):
            assert lp.token_id == tok
            assert lp.logprob == pytest.approx(float(ref[i, tok]), abs=2e-4)
            assert len(lp.top) == sp.logprobs
            ref_top, ref_ids = ref[i].topk(sp.logprobs)
            assert [v for _, v in lp.top] == pytest.approx(ref_top.tolist(), abs=2e-4)
            assert [t for t, _ in lp.top] == ref_ids.tolist()
            if sp.greedy:
                assert lp.top[0][0] == tok


def test_logprobs_stream_in_order_and_validation(tiny_mistral) -> None:  # noqa: F811
    model, _ = tiny_mistral
    eng = Engine(model, None, num_blocks=32, block_size=8, max_batch=2, max_tokens_per_step=16, eos_ids=())
    rid = eng.add_request([1, 2, 3], SamplingParams(max_new_tokens=5, logprobs=2))
    drained = []
    for out in eng.iterate([rid]):
        drained += out.logprobs
        c = out.completion
    assert drained == c.logprobs and [x.token_id for x in drained] == c.token_ids
    for bad in (-1, MAX_LOGPROBS + 1):
        with pytest.raises(ValueError, match="logprobs"):
            SamplingParams(logprobs=bad)
