"""The background engine loop on the toy engine model: a bounded waiting queue (→ 503), refusal after a
shutdown signal, abort of the in-flight requests when the loop stops, and streamed text equal to the
offline result."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("prometheus_client", reason="the serve extra is not installed (pip install '.[serve]')")

from mistral_kernels.engine import Engine  # noqa: E402
from mistral_kernels.sampling import SamplingParams  # noqa: E402
from mistral_kernels.serve.async_engine import (  # noqa: E402
    AsyncEngine, DoneEvent, Overloaded, TextEvent)
from mistral_kernels.serve.metrics import ServerMetrics  # noqa: E402

from .test_engine import CharTokenizer, ToyModel  # noqa: E402


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
        stream = await loop_engine.submit(CharTokenizer().encode("hello there"), params)
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
        streams = [await loop_engine.submit(ids, long)]
        while engine.num_running == 0:  # the loop thread schedules it
            await asyncio.sleep(0.01)
        streams += [await loop_engine.submit(ids, long) for _ in range(2)]  # waiting (max_batch 1)
        assert engine.num_waiting == 2
        with pytest.raises(Overloaded, match="max-waiting 2"):
            await loop_engine.submit(ids, long)
        loop_engine.begin_shutdown()
        with pytest.raises(Overloaded, match="shutting down"):
            await loop_engine.submit(ids, long)
        await asyncio.to_thread(loop_engine.stop)
        return [await s.completion() for s in streams]

    assert asyncio.run(go()) == [None, None, None]  # aborted: no completion
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks
    assert not engine.has_unfinished()
