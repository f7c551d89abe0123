"""The engine step's contract: :meth:`Engine.step` returns one :class:`RequestOutput` per request that got a
token (batch order) with the new token ids, the text that became final, the log-probabilities, and on its last
one the completion — after which the engine holds nothing of the request. ``LLM`` and the server's engine loop
read these outputs and nothing else of the engine (checked by handing them an engine that exposes only the
public calls they need). Admission is the engine's (:meth:`Engine.max_new_tokens_for`), and a request is
checked once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mistral_kernels.engine import AdmissionError, Engine
from mistral_kernels.llm import LLM
from mistral_kernels.sampling_params import SamplingParams

from .helpers.engine import CharTokenizer, ToyModel

TOK = CharTokenizer()


def _engine(**kw: Any) -> Engine:
    return Engine(ToyModel(), TOK, **{"num_blocks": 64, "block_size": 4, "max_batch": 2, **kw})


def _alone(prompt: str, params: SamplingParams) -> Any:
    eng = _engine()
    return eng.run([eng.add_request(TOK.encode(prompt), params)])[0]


def test_step_outputs_add_up_to_the_completions() -> None:
    eng = _engine(max_batch=3)
    jobs = [("hello there", SamplingParams(max_new_tokens=9, ignore_eos=True, stop=("zz",))),
            ("abc", SamplingParams(max_new_tokens=4, ignore_eos=True, logprobs=1)),
            ("the quick brown fox", SamplingParams(max_new_tokens=6, temperature=0.9, seed=3, ignore_eos=True))]
    rids = [eng.add_request(TOK.encode(p), sp) for p, sp in jobs]
    outputs: dict[int, list[Any]] = {rid: [] for rid in rids}
    while eng.has_unfinished():
        step = eng.step()
        assert len({o.request_id for o in step}) == len(step)          # at most one output per request and step
        for o in step:
            assert len(o.token_ids) == 1
            outputs[o.request_id].append(o)
    for rid, (prompt, sp) in zip(rids, jobs):
        outs = outputs[rid]
        c = outs[-1].completion
        assert c is not None and outs[-1].finished and not any(o.finished for o in outs[:-1])
        assert [t for o in outs for t in o.token_ids] == c.token_ids
        assert "".join(o.text for o in outs) == c.text
        assert [lp for o in outs for lp in o.logprobs] == (c.logprobs or [])
        want = _alone(prompt, sp)
        assert (c.token_ids, c.text, c.finish_reason) == (want.token_ids, want.text, want.finish_reason)
        assert not eng.has_request(rid) and not eng.abort(rid)         # handed out: nothing kept
    assert eng.blocks.num_free_blocks == eng.blocks.num_blocks


def test_runner_returns_ids_and_logprobs() -> None:
    eng = _engine()
    eng.add_request(TOK.encode("abc"), SamplingParams(max_new_tokens=2))
    eng.add_request(TOK.encode("xyz"), SamplingParams(max_new_tokens=2, logprobs=0))
    plan = eng.scheduler.schedule()
    ids, logprobs = eng.runner.execute(plan)
    assert len(ids) == 2 and logprobs is not None and logprobs[0] is None
    assert logprobs[1] is not None and logprobs[1].token_id == ids[1] and logprobs[1].top == ()
    assert not hasattr(eng.runner, "logprobs")                         # no side channel


def test_iterate_keeps_the_outputs_of_other_requests() -> None:
    eng = _engine()
    mine = eng.add_request(TOK.encode("abc"), SamplingParams(max_new_tokens=3, ignore_eos=True))
    other = eng.add_request(TOK.encode("hello"), SamplingParams(max_new_tokens=2, ignore_eos=True))
    assert [o.completion for o in eng.iterate([mine])][-1].token_ids == \
        _alone("abc", SamplingParams(max_new_tokens=3, ignore_eos=True)).token_ids
    assert eng.has_request(other) and not eng.has_unfinished()         # finished while `mine` ran: kept
    assert eng.run([other])[0].token_ids == _alone("hello", SamplingParams(max_new_tokens=2, ignore_eos=True)) \
        .token_ids
    assert not eng.has_request(other)
    with pytest.raises(ValueError, match="no request with id"):
        eng.iterate([other])


class _Only:
    """An engine that exposes only the named attributes (anything else is an AttributeError)."""

    def __init__(self, engine: Engine, allowed: set[str]) -> None:
        self._engine, self._allowed, self.used = engine, allowed, set()

    def __getattr__(self, name: str) -> Any:
        if name not in self._allowed:
            raise AttributeError(f"reads Engine.{name}, outside the step's contract")
        self.used.add(name)
        return getattr(self._engine, name)


def test_llm_reads_only_the_step_outputs() -> None:
    llm = LLM.__new__(LLM)
    llm.tokenizer = TOK
    llm.engine = spy = _Only(_engine(), {"generate", "add_request", "iterate"})  # type: ignore[assignment]
    params = SamplingParams(max_new_tokens=5, ignore_eos=True)
    (c,) = llm.generate(["hello"], params)
    text = "".join(llm.stream("hello", params))
    assert c.token_ids == llm.last_completion.token_ids == _alone("hello", params).token_ids
    assert text == c.text and spy.used == {"generate", "add_request", "iterate"}


def test_server_loop_reads_only_the_step_outputs() -> None:
    pytest.importorskip("prometheus_client", reason="the serve extra is not installed")
    from mistral_kernels.serve.async_engine import AsyncEngine, DoneEvent, TextEvent
    from mistral_kernels.serve.metrics import ServerMetrics

    engine = _engine()
    spy = _Only(engine, {"add_checked", "step", "abort", "has_unfinished", "num_waiting", "stats"})
    loop = AsyncEngine(spy, ServerMetrics(engine), max_waiting=4)  # type: ignore[arg-type]
    params = SamplingParams(max_new_tokens=12, ignore_eos=True, logprobs=1)
    loop.start()

    async def go() -> tuple[str, int, Any]:
        stream = await loop.submit(engine.check_request(TOK.encode("hello there"), params))
        pieces, lps, done = [], 0, None
        async for event in stream:
            if isinstance(event, TextEvent):
                pieces.append(event.piece)
                lps += len(event.logprobs)
            elif isinstance(event, DoneEvent):
                done = event.completion
        return "".join(pieces), lps, done

    try:
        text, lps, done = asyncio.run(go())
    finally:
        loop.stop()
    assert loop.error is None and done is not None
    want = _alone("hello there", params)
    assert text == done.text == want.text and lps == len(done.token_ids) == 12
    assert {"add_checked", "step"} <= spy.used


def test_admission_is_the_engines() -> None:
    eng = _engine(num_blocks=8)  # 8 blocks of 4 tokens: 32 tokens of KV
    assert eng.max_new_tokens_for(10) == 22                            # None: the most that fits alone
    assert eng.max_new_tokens_for(10, 5) == 5
    for args, argument in [((40,), "prompt_ids"), ((4096,), "prompt_ids"), ((10, 30), "max_new_tokens"),
                           ((2, 4095), "max_new_tokens"), ((10, 5, 3), "copies")]:
        with pytest.raises(AdmissionError) as e:
            eng.max_new_tokens_for(*args)
        assert e.value.argument == argument, (args, str(e.value))
    checked = eng.check_request(TOK.encode("hello"), SamplingParams(max_new_tokens=None))
    assert checked.params.max_new_tokens == eng.max_new_tokens_for(5)  # resolved at admission
    assert checked.for_choice(2).params.seed is None


def test_generate_checks_each_request_once(monkeypatch: pytest.MonkeyPatch) -> None:
    llm = LLM.__new__(LLM)
    llm.tokenizer = TOK
    llm.engine = _engine()
    calls = []
    real = Engine.max_new_tokens_for
    monkeypatch.setattr(Engine, "max_new_tokens_for", lambda self, *a: (calls.append(a), real(self, *a))[1])
    llm.generate(["abc", "hello", "xyz"], max_new_tokens=3)
    assert len(calls) == 3
