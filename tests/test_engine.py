"""Engine: continuous batching gives each request exactly what it gets alone; mid-run arrivals; preemption
under a tiny block budget; chunked prefill; stop strings and streaming; seeded sampling; no block leaks.

Two models:
- a toy model (below) whose next token is a hash of the tokens it reads *through the block table*, with
  NaN in never-written slots: any block-table, slot or window mistake changes the output or raises;
- a tiny random Mistral (sliding window 16) loaded from an HF checkpoint, checked against transformers'
  greedy decoding (no cache, full recompute) as the reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from mistral_kernels.batch import AttentionBatch
from mistral_kernels.config import ModelConfig
from mistral_kernels.engine import Completion, Engine
from mistral_kernels.sampling import SamplingParams
from mistral_kernels.tokenizer import Tokenizer

from .helpers.engine import CharTokenizer, ToyModel, tiny_mistral


PROMPTS = ["hello there", "a", "the quick brown fox jumps over the lazy dog again and again", "abc def",
           "zzz", "many words in this prompt here"]


def _params(i: int, n: int = 12, **kw) -> SamplingParams:
    if i % 3 == 2:  # every third request samples (seeded)
        return SamplingParams(max_new_tokens=n + i, temperature=0.9, top_k=10, top_p=0.95, seed=100 + i,
                              ignore_eos=True, **kw)
    return SamplingParams(max_new_tokens=n + i, ignore_eos=i % 2 == 0, **kw)


def _step(eng: Engine, n: int, done: dict[int, Completion]) -> None:
    """``n`` engine steps; the completions they hand out go into ``done``."""
    for _ in range(n):
        done |= {out.request_id: out.completion for out in eng.step() if out.completion is not None}


def _alone(model_factory, tok, prompts, params, **engine_kw) -> list:
    outs = []
    for p, sp in zip(prompts, params):
        eng = Engine(model_factory(), tok, num_blocks=256, block_size=4, **engine_kw)
        rid = eng.add_request(tok.encode(p), sp)
        outs.append(eng.run([rid])[0])
    return outs


@pytest.mark.parametrize("window", [None, 6])
def test_batch_equals_alone(window: int | None) -> None:
    tok = CharTokenizer()
    params = [_params(i) for i in range(len(PROMPTS))]
    want = _alone(lambda: ToyModel(window=window), tok, PROMPTS, params)
    model = ToyModel(window=window)
    eng = Engine(model, tok, num_blocks=256, block_size=4, max_batch=4, max_tokens_per_step=16)
    rids = [eng.add_request(tok.encode(p), sp) for p, sp in zip(PROMPTS, params)]
    got = eng.run(rids)
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids and g.text == w.text and g.finish_reason == w.finish_reason
    assert max(b for b, _ in model.steps) > 1                      # really batched
    assert max(t for _, t in model.steps) <= 16                    # token budget respected (chunked prefill)
    assert any(b > 1 and t > b for b, t in model.steps)            # mixed prefill + decode steps happened
    assert eng.blocks.num_free_blocks == eng.blocks.num_blocks     # no leak


def test_requests_arriving_mid_run() -> None:
    tok = CharTokenizer()
    params = [_params(i) for i in range(len(PROMPTS))]
    want = _alone(lambda: ToyModel(), tok, PROMPTS, params)
    eng = Engine(ToyModel(), tok, num_blocks=256, block_size=4, max_batch=3, max_tokens_per_step=12)
    rids = [eng.add_request(tok.encode(PROMPTS[0]), params[0])]
    done: dict[int, Completion] = {}
    for i in range(1, len(PROMPTS)):
        _step(eng, i + 1, done)
        rids.append(eng.add_request(tok.encode(PROMPTS[i]), params[i]))
    done |= {c.request_id: c for c in eng.run([r for r in rids if r not in done])}
    assert [done[r].token_ids for r in rids] == [c.token_ids for c in want]
    assert eng.blocks.num_free_blocks == eng.blocks.num_blocks


@pytest.mark.parametrize("window,num_blocks", [(None, 24), (8, 10)])
def test_preemption_under_tiny_block_budget(window: int | None, num_blocks: int) -> None:
    tok = CharTokenizer()
    params = [SamplingParams(max_new_tokens=30, ignore_eos=True, temperature=0.8 if i % 2 else 0.0, seed=i)
              for i in range(len(PROMPTS))]
    want = _alone(lambda: ToyModel(window=window), tok, PROMPTS, params)
    # e.g. 24 blocks of 4 = 96 slots for 6 requests of up to 60+30 tokens: they cannot all be resident.
    eng = Engine(ToyModel(window=window), tok, num_blocks=num_blocks, block_size=4, max_batch=6, max_tokens_per_step=24)
    rids = [eng.add_request(tok.encode(p), sp) for p, sp in zip(PROMPTS, params)]
    got = eng.run(rids)
    assert eng.stats.preemptions > 0
    assert sum(c.num_preemptions for c in got) == eng.stats.preemptions
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    assert eng.blocks.num_free_blocks == eng.blocks.num_blocks


def test_request_that_never_fits_is_rejected_others_unaffected() -> None:
    tok = CharTokenizer()
    eng = Engine(ToyModel(), tok, num_blocks=4, block_size=4)
    with pytest.raises(ValueError, match="needs 5 KV blocks .* cache has only 4.*num-blocks"):
        eng.add_request(tok.encode("abcdefghij"), SamplingParams(max_new_tokens=10))
    rid = eng.add_request(tok.encode("abc"), SamplingParams(max_new_tokens=5, ignore_eos=True))
    assert len(eng.run([rid])[0].token_ids) == 5
    with pytest.raises(ValueError, match="empty"):
        eng.add_request([], SamplingParams())
    with pytest.raises(ValueError, match="outside the vocabulary"):
        eng.add_request([3, 50], SamplingParams())
    with pytest.raises(ValueError, match="max_position"):
        eng.add_request([1], SamplingParams(max_new_tokens=5000))
    # With a sliding window a long request fits in O(W) blocks.
    eng_w = Engine(ToyModel(window=6), tok, num_blocks=4, block_size=4)
    rid = eng_w.add_request(tok.encode("abcdefghij"), SamplingParams(max_new_tokens=40, ignore_eos=True))
    assert len(eng_w.run([rid])[0].token_ids) == 40
    assert eng_w.blocks.num_free_blocks == 4


def _first_text(params: SamplingParams, prompt: str = "hello there") -> str:
    tok = CharTokenizer()
    eng = Engine(ToyModel(), tok, num_blocks=64, block_size=4)
    return eng.run([eng.add_request(tok.encode(prompt), params)])[0].text


def test_stop_strings_and_streaming() -> None:
    tok = CharTokenizer()
    full = _first_text(SamplingParams(max_new_tokens=40, ignore_eos=True))
    assert len(full) >= 30
    stop = full[17:20]                                              # a 3-character string the output contains
    first = full.find(stop)
    eng = Engine(ToyModel(), tok, num_blocks=64, block_size=4)
    rid = eng.add_request(tok.encode("hello there"), SamplingParams(max_new_tokens=40, ignore_eos=True,
                                                                    stop=("QQQQ", stop)))
    outputs = list(eng.iterate([rid]))
    pieces = [out.text for out in outputs]
    c = outputs[-1].completion
    assert c is not None and all(out.completion is None for out in outputs[:-1])
    assert [t for out in outputs for t in out.token_ids] == c.token_ids  # one output per generated token
    assert c.text == full[:first] and c.finish_reason == "stop" and c.stop_reason == stop
    assert "".join(pieces) == c.text                              # streamed text never shows the stop string
    assert tok.decode(c.token_ids) == full[:first] + stop         # generation ended at the completing token
    assert eng.blocks.num_free_blocks == eng.blocks.num_blocks


def test_eos_and_stop_token_ids() -> None:
    full = CharTokenizer().encode(_first_text(SamplingParams(max_new_tokens=30, ignore_eos=True)))
    target = full[5]
    tok = CharTokenizer()
    eng = Engine(ToyModel(), tok, num_blocks=64, block_size=4)
    rid = eng.add_request(tok.encode("hello there"),
                          SamplingParams(max_new_tokens=30, ignore_eos=True, stop_token_ids=(target,)))
    c = eng.run([rid])[0]
    assert c.token_ids == full[:full.index(target) + 1] and c.finish_reason == "stop" and c.stop_reason == target
    # The same token as EOS: stops there, unless ignore_eos.
    for ignore in (False, True):
        eng = Engine(ToyModel(), tok, num_blocks=64, block_size=4, eos_ids=(target,))
        rid = eng.add_request(tok.encode("hello there"), SamplingParams(max_new_tokens=30, ignore_eos=ignore))
        c = eng.run([rid])[0]
        assert c.token_ids == (full if ignore else full[:full.index(target) + 1])
        assert c.finish_reason == ("length" if ignore else "stop")


def test_seeded_sampling_reproducible() -> None:
    p = SamplingParams(max_new_tokens=25, temperature=1.0, seed=1234, ignore_eos=True)
    a, b = _first_text(p), _first_text(p)
    assert a == b
    assert _first_text(SamplingParams(max_new_tokens=25, temperature=1.0, seed=99, ignore_eos=True)) != a
    assert _first_text(SamplingParams(max_new_tokens=25, ignore_eos=True)) != a   # greedy differs from sampled


@torch.no_grad()
def _hf_greedy(hf, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = []
    for _ in range(n):
        t = int(hf(ids, use_cache=False).logits[0, -1].argmax())
        out.append(t)
        ids = torch.cat([ids, torch.tensor([[t]])], dim=1)
    return out


def test_tiny_mistral_batched_chunked_preempted_equals_transformers(tiny_mistral) -> None:
    model, hf = tiny_mistral
    g = torch.Generator().manual_seed(3)
    lengths = [3, 40, 17, 9, 25]                                   # some longer than the window W=16
    prompts = [torch.randint(0, 128, (n,), generator=g).tolist() for n in lengths]
    news = [20, 8, 24, 30, 12]
    want = [_hf_greedy(hf, p, n) for p, n in zip(prompts, news)]
    for num_blocks, budget in [(64, 32), (6, 16)]:                 # roomy, then tiny (preemption)
        eng = Engine(model, None, num_blocks=num_blocks, block_size=8, max_batch=4, max_tokens_per_step=budget,
                     eos_ids=())
        rids = [eng.add_request(p, SamplingParams(max_new_tokens=n)) for p, n in zip(prompts[:3], news[:3])]
        done: dict[int, Completion] = {}
        _step(eng, 5, done)
        rids += [eng.add_request(p, SamplingParams(max_new_tokens=n)) for p, n in zip(prompts[3:], news[3:])]
        done |= {c.request_id: c for c in eng.run([r for r in rids if r not in done])}
        assert [done[r].token_ids for r in rids] == want, (num_blocks, budget)
        assert eng.blocks.num_free_blocks == num_blocks
        if num_blocks == 6:
            assert eng.stats.preemptions > 0


def test_tiny_mistral_window_keeps_memory_bounded(tiny_mistral) -> None:
    model, hf = tiny_mistral
    prompt = torch.randint(0, 128, (10,), generator=torch.Generator().manual_seed(5)).tolist()
    want = _hf_greedy(hf, prompt, 100)
    # 4 blocks of 8 = 32 slots for a 110-token sequence: only possible because out-of-window blocks are freed.
    eng = Engine(model, None, num_blocks=4, block_size=8, max_batch=1, max_tokens_per_step=8, eos_ids=())
    rid = eng.add_request(prompt, SamplingParams(max_new_tokens=100))
    most = 0
    for out in eng.iterate([rid]):
        if eng.blocks.has(rid):
            most = max(most, eng.blocks.num_owned(rid))
    assert out.completion is not None and out.completion.token_ids == want
    assert most <= 4 and eng.blocks.num_free_blocks == 4
