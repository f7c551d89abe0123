"""The background engine loop on the toy engine model: a bounded waiting queue (→ 503), refusal after a
shutdown signal, abort of the in-flight requests when the loop stops, and streamed text equal to the
offline result."""

from __future__ import annotations

import asyncio
import threading

import pytest

pytest.importorskip("prometheus_client", reason="the serve extra is not installed (pip install '.[serve]')")

from mistral_kernels.engine import Engine  # noqa: E402
from mistral_kernels.sampling import SamplingParams  # noqa: E402
from mistral_kernels.serve.async_engine import (  # noqa: E402
    AsyncEngine, DoneEvent, Overloaded, TextEvent)
from mistral_kernels.serve.metrics import ServerMetrics  # noqa: E402

from .helpers.engine import CharTokenizer, ToyModel  # noqa: E402


def _engine() -> Engine:
    return Engine(ToyModel(), CharTokenizer(), num_blocks=1024, block_size=4, max_batch=1, max_tokens_per_step=64)


def test_stream_text_equals_offline() -> None:
    params = SamplingParams(max_new_tokens=20, ignore_eos=True)
    offline = _engine()
    expected = offline.run([offline.add_request(CharTokenizer().encode("hello there"), params)])[0].text
    engine = _engine()
    loop_engine = AsyncEngine(engine, ServerMetrics(engine), max_waiting=4)
    loop_engine.start()

    async def go() -> tuple[str, str]:
        stream = await loop_engine.submit(engine.check_request(CharTokenizer().encode("hello there"), params))
        pieces, final = [], ""
        async for event in stream:
            if isinstance(event, TextEvent):
                pieces.append(event.piece)
            elif isinstance(event, DoneEvent):
                final = event.completion.text
        return "".join(pieces), final

    try:
        streamed, final = asyncio.run(go())
    finally:
        loop_engine.stop()
    assert streamed == final == expected


def test_bounded_waiting_queue_shutdown_and_abort_on_stop() -> None:
    engine = _engine()
    loop_engine = AsyncEngine(engine, ServerMetrics(engine), max_waiting=2)
    loop_engine.start()
    long = SamplingParams(max_new_tokens=3000, ignore_eos=True)  # runs far longer than the test
    ids = CharTokenizer().encode("abc")

    async def go() -> list[object]:
        streams = [await loop_engine.submit(engine.check_request(ids, long))]
        while engine.num_running == 0:  # the loop thread schedules it
            await asyncio.sleep(0.01)
        streams += [await loop_engine.submit(engine.check_request(ids, long)) for _ in range(2)]  # waiting (max_batch 1)
        assert engine.num_waiting == 2
        with pytest.raises(Overloaded, match="max-waiting 2"):
            await loop_engine.submit(engine.check_request(ids, long))
        loop_engine.begin_shutdown()
        with pytest.raises(Overloaded, match="shutting down"):
            await loop_engine.submit(engine.check_request(ids, long))
        await asyncio.to_thread(loop_engine.stop)
        return [await s.completion() for s in streams]

    assert asyncio.run(go()) == [None, None, None]  # aborted: no completion
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks
    assert not engine.has_unfinished()


class _GatedModel(ToyModel):
    """The toy model; each forward first waits for ``gate`` (holds the engine thread inside a step)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.entered = threading.Event()

    def forward(self, token_ids, batch, cache):  # type: ignore[no-untyped-def]
        self.entered.set()
        assert self.gate.wait(30), "the test never opened the gate"
        return super().forward(token_ids, batch, cache)


def test_submitter_cancelled_while_queued_adds_nothing_and_the_loop_lives() -> None:
    """A client gone while its request waits in the inbox (the loop is inside a step): the request is never
    added, and the loop does not die on the cancelled future."""
    model = _GatedModel()
    engine = Engine(model, CharTokenizer(), num_blocks=64, block_size=4, max_batch=2, max_tokens_per_step=64)
    loop_engine = AsyncEngine(engine, ServerMetrics(engine), max_waiting=4)
    params = SamplingParams(max_new_tokens=5, ignore_eos=True)
    ids = CharTokenizer().encode("abc")
    loop_engine.start()

    async def go() -> str:
        first = await loop_engine.submit(engine.check_request(ids, params))
        await asyncio.to_thread(model.entered.wait, 30)  # the loop thread is now blocked in a step
        task = asyncio.create_task(loop_engine.submit(engine.check_request(ids, params)))
        await asyncio.sleep(0.05)  # its command sits in the inbox
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        model.gate.set()
        completion = await first.completion()
        assert completion is not None
        return completion.text

    try:
        text = asyncio.run(go())
        assert loop_engine.healthy, loop_engine.error
    finally:
        model.gate.set()
        loop_engine.stop()
    assert len(text) == 5 and engine._next_id == 1  # the cancelled request was never added
    assert not engine.has_unfinished() and engine.blocks.num_free_blocks == engine.blocks.num_blocks
    assert engine._backlog == {} and engine.output._states == {}
