"""A failed or interrupted call leaves the engine as it found it: an exception or
KeyboardInterrupt inside ``Engine.run`` / ``LLM.generate``, a bad prompt in the middle of a list, and a
``stream()`` generator closed early or garbage-collected abort their requests — KV blocks back in the pool,
nothing left in the scheduler queues, the kept outputs or the output processor — and requests of other
callers run on unaffected (same tokens as alone)."""

from __future__ import annotations

import gc

import pytest
import torch

from mistral_kernels.batch import AttentionBatch
from mistral_kernels.engine import Engine
from mistral_kernels.llm import LLM
from mistral_kernels.sampling import SamplingParams

from .helpers.engine import CharTokenizer, ToyModel

NUM_BLOCKS = 64


class FailingModel(ToyModel):
    """The toy model, raising ``error`` at its ``fail_at``-th forward (counting from 1)."""

    def __init__(self, fail_at: int, error: BaseException) -> None:
        super().__init__()
        self.fail_at, self.error, self.calls = fail_at, error, 0

    def forward(self, token_ids: torch.Tensor, batch: AttentionBatch, cache: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == self.fail_at:
            raise self.error
        return super().forward(token_ids, batch, cache)


def _engine(model: ToyModel) -> Engine:
    return Engine(model, CharTokenizer(), num_blocks=NUM_BLOCKS, block_size=4, max_batch=4, max_tokens_per_step=32)


def _llm(model: ToyModel) -> LLM:
    """An LLM over the toy engine (no checkpoint needed: generate / stream only use the tokenizer and engine)."""
    llm = LLM.__new__(LLM)
    llm.tokenizer = CharTokenizer()
    llm.engine = _engine(model)
    return llm


def _assert_empty(eng: Engine) -> None:
    assert eng.blocks.num_free_blocks == NUM_BLOCKS
    assert eng.blocks._tables == {} and eng.blocks.num_used_blocks == 0
    assert eng.scheduler.request_ids() == [] and not eng.has_unfinished()
    assert eng._backlog == {}
    assert eng.output._states == {}


def _alone(prompt: str, n: int) -> list[int]:
    eng = _engine(ToyModel())
    return eng.generate([(CharTokenizer().encode(prompt), SamplingParams(max_new_tokens=n, ignore_eos=True))])[0] \
        .token_ids


@pytest.mark.parametrize("error", [KeyboardInterrupt(), RuntimeError("device lost")])
def test_interrupted_run_aborts_its_requests_finished_ones_too(error: BaseException) -> None:
    eng = _engine(FailingModel(fail_at=6, error=error))
    tok = CharTokenizer()
    short = eng.add_request(tok.encode("abc"), SamplingParams(max_new_tokens=2, ignore_eos=True))
    long = eng.add_request(tok.encode("hello there"), SamplingParams(max_new_tokens=20, ignore_eos=True))
    with pytest.raises(type(error)):
        eng.run([short, long])
    assert not eng.has_request(short) and not eng.has_request(long)
    _assert_empty(eng)
    # The engine still works and gives what a fresh one gives.
    assert eng.generate([(tok.encode("hello there"), SamplingParams(max_new_tokens=5, ignore_eos=True))])[0] \
        .token_ids == _alone("hello there", 5)
    _assert_empty(eng)


def test_run_rejects_unknown_ids() -> None:
    eng = _engine(ToyModel())
    with pytest.raises(ValueError, match="no request with id"):
        eng.run([7])


def test_bad_prompt_in_the_middle_admits_nothing_and_others_run_on() -> None:
    llm = _llm(ToyModel())
    eng = llm.engine
    other = eng.add_request(CharTokenizer().encode("the quick brown fox"),
                            SamplingParams(max_new_tokens=6, ignore_eos=True))  # another caller's request
    eng.step()
    used = NUM_BLOCKS - eng.blocks.num_free_blocks
    with pytest.raises(ValueError, match=r"prompts\[1\].*max_position"):
        llm.generate(["hello", "a" * 5000, "abc"], max_new_tokens=4)
    with pytest.raises(TypeError, match=r"prompts\[2\]"):
        llm.generate(["hello", "abc", None], max_new_tokens=4)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="temperature"):
        llm.generate(["hello", "abc"], max_new_tokens=4, temperature=-1.0)
    assert eng.scheduler.request_ids() == [other] and NUM_BLOCKS - eng.blocks.num_free_blocks == used
    assert set(eng.output._states) == {other}
    assert eng.run([other])[0].token_ids == _alone("the quick brown fox", 6)
    _assert_empty(eng)


def test_interrupted_generate_leaves_other_requests_alone() -> None:
    llm = _llm(FailingModel(fail_at=4, error=KeyboardInterrupt()))
    eng = llm.engine
    other = eng.add_request(CharTokenizer().encode("zzz"), SamplingParams(max_new_tokens=8, ignore_eos=True))
    with pytest.raises(KeyboardInterrupt):
        llm.generate(["hello there", "abc def", "a"], max_new_tokens=6, ignore_eos=True)
    assert eng.scheduler.request_ids() == [other] and set(eng.output._states) == {other}
    assert set(eng._backlog) == {other}  # only the other caller's outputs, kept for it
    assert eng.blocks.num_free_blocks == NUM_BLOCKS - eng.blocks.num_owned(other)
    assert eng.run([other])[0].token_ids == _alone("zzz", 8)
    _assert_empty(eng)


def test_stream_closed_early_or_garbage_collected_aborts() -> None:
    llm = _llm(ToyModel())
    eng = llm.engine
    stream = llm.stream("hello there", max_new_tokens=30, ignore_eos=True)
    next(stream)
    assert eng.num_running == 1 and eng.blocks.num_free_blocks < NUM_BLOCKS
    stream.close()
    _assert_empty(eng)

    stream = llm.stream("hello there", max_new_tokens=30, ignore_eos=True)
    next(stream)
    assert eng.num_running == 1
    del stream
    gc.collect()
    _assert_empty(eng)

    unstarted = llm.stream("hello there", max_new_tokens=30)  # never iterated: never admitted
    del unstarted
    _assert_empty(eng)

    # A completed stream pops its completion; nothing is left behind either.
    text = "".join(llm.stream("hello there", max_new_tokens=7, ignore_eos=True))
    assert llm.last_completion.token_ids == _alone("hello there", 7)
    assert text == llm.last_completion.text
    _assert_empty(eng)


def test_stream_whose_step_raises_aborts() -> None:
    llm = _llm(FailingModel(fail_at=3, error=RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        for _ in llm.stream("hello there", max_new_tokens=30, ignore_eos=True):
            pass
    _assert_empty(llm.engine)
