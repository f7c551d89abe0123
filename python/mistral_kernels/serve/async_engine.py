"""One engine loop in a background thread, fed by every HTTP request (continuous batching across clients).

Only the engine thread touches the :class:`~mistral_kernels.engine.Engine`. The asyncio side talks to it
through a thread-safe inbox of commands (add a request, abort one) and gets back, per request, an
``asyncio.Queue`` of events filled with ``loop.call_soon_threadsafe``:

=====================  ==========================================================================
event                  meaning
=====================  ==========================================================================
``TextEvent(piece,     newly final text (one detokenised piece; text that may still start a stop
logprobs)``            string is held back by the engine) and the log-probabilities of the tokens
                       generated since the last event (when the request asked for them)
``DoneEvent(c)``       the request finished with :class:`~mistral_kernels.engine.Completion` ``c``
``AbortedEvent()``     the server shut down before it finished (cut at the shutdown deadline)
=====================  ==========================================================================

Shutdown: :meth:`AsyncEngine.begin_shutdown` refuses new requests; with ``cut_after`` seconds, the loop
aborts what is still running once they have passed and sends each an ``AbortedEvent``, so the HTTP side
can end its response properly (a last chunk, an error event, ``[DONE]``) before the server closes.

Loop: take every queued command (waiting up to 50 ms for one when the engine is idle), run one
:meth:`Engine.step`, and publish what it returns (:class:`~mistral_kernels.output.RequestOutput`): each
tracked request's new text and log-probabilities, and its completion when it finished. The loop reads
nothing else of the engine's step. An aborted request
(client gone) is dropped by the engine at the next command pass: its KV blocks return to the pool before
the next step.

Tensor parallel (``serve --tp N``): with an :class:`~.tp.EngineMirror`, the loop also records every add and
abort it applies and broadcasts them to the other ranks before each step (see :mod:`.tp`).
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import Future
from dataclasses import dataclass, field

from ..engine import CheckedRequest, Completion, Engine
from ..logprobs import TokenLogprob
from .metrics import ServerMetrics
from .tp import EngineMirror

__all__ = ["AbortedEvent", "AsyncEngine", "DoneEvent", "Overloaded", "RequestStream", "TextEvent"]


@dataclass(frozen=True)
class TextEvent:
    piece: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class DoneEvent:
    completion: Completion


@dataclass(frozen=True)
class AbortedEvent:
    pass


Event = TextEvent | DoneEvent | AbortedEvent


class Overloaded(Exception):
    """The waiting queue is full or the server is shutting down (HTTP 503)."""


@dataclass
class _Tracked:
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[Event]
    arrival: float
    last_token: float | None = None


@dataclass
class RequestStream:
    """The asyncio side of one engine request: iterate its events; :meth:`abort` if the client leaves."""

    rid: int
    engine: AsyncEngine
    events: asyncio.Queue[Event] = field(repr=False)
    done: bool = False

    async def __aiter__(self) -> AsyncIterator[Event]:
        while not self.done:
            event = await self.events.get()
            if not isinstance(event, TextEvent):
                self.done = True
            yield event

    async def completion(self) -> Completion | None:
        """Wait for the end; the completion, or None when the server aborted the request."""
        async for event in self:
            if isinstance(event, DoneEvent):
                return event.completion
        return None

    def abort(self) -> None:
        if not self.done:
            self.done = True
            self.engine.abort(self.rid)


@dataclass(frozen=True)
class _Add:
    request: CheckedRequest
    tracked: _Tracked
    result: Future[int]


@dataclass(frozen=True)
class _Abort:
    rid: int


class AsyncEngine:
    """Runs ``engine`` in a daemon thread; thread-safe :meth:`submit` / :meth:`abort`.

    Parameters
    ----------
    engine : the engine (used only by the loop thread from :meth:`start` on)
    metrics : updated by the loop thread after every step
    max_waiting : requests queued but not yet running beyond this → :class:`Overloaded`
    mirror : rank 0 of ``serve --tp N``: the broadcaster of the engine operations (None = one process)
    """

    def __init__(self, engine: Engine, metrics: ServerMetrics, max_waiting: int,
                 mirror: EngineMirror | None = None) -> None:
        self.engine = engine
        self.mirror = mirror
        self.metrics = metrics
        self.max_waiting = max_waiting
        self._inbox: queue.Queue[_Add | _Abort] = queue.Queue()
        self._tracked: dict[int, _Tracked] = {}
        self._stop = threading.Event()
        self._draining = False
        self._cut_at: float | None = None  # monotonic time at which running requests are aborted
        self._thread = threading.Thread(target=self._loop, name="mistral-kernels-engine", daemon=True)
        self.error: BaseException | None = None

    # ------------------------------------------------------------------ asyncio side
    def start(self) -> None:
        self._thread.start()

    def begin_shutdown(self, cut_after: float | None = None) -> None:
        """Stop accepting requests (503); the running ones go on, for at most ``cut_after`` seconds (None:
        until :meth:`stop`), then each gets an ``AbortedEvent``."""
        self._draining = True
        if cut_after is not None and self._cut_at is None:
            self._cut_at = time.monotonic() + cut_after

    def stop(self, timeout: float = 10.0) -> None:
        """Abort what is left and join the loop thread."""
        self._draining = True
        self._stop.set()
        self._thread.join(timeout)

    @property
    def healthy(self) -> bool:
        return self._thread.is_alive() and self.error is None

    async def submit(self, request: CheckedRequest) -> RequestStream:
        """Queue a request the engine admitted (:meth:`Engine.check_request`). Raises :class:`Overloaded`
        (queue full / shutting down)."""
        if self._draining or not self.healthy:
            raise Overloaded("the server is shutting down" if self._draining else
                             f"the engine loop stopped: {self.error!r}")
        if self.engine.num_waiting + self._inbox.qsize() >= self.max_waiting:
            raise Overloaded(f"too many waiting requests (--max-waiting {self.max_waiting}); retry later")
        loop = asyncio.get_running_loop()
        tracked = _Tracked(loop, asyncio.Queue(), time.perf_counter())
        result: Future[int] = Future()
        self._inbox.put(_Add(request, tracked, result))
        rid = await asyncio.wrap_future(result)
        return RequestStream(rid, self, tracked.events)

    def abort(self, rid: int) -> None:
        self._inbox.put(_Abort(rid))

    # ------------------------------------------------------------------ engine thread
    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self._take_commands(wait=not self.engine.has_unfinished())
                if self._cut_at is not None and time.monotonic() >= self._cut_at and self._tracked:
                    self._abort_tracked(mirrored=True)
                if self.engine.has_unfinished():
                    if self.mirror is not None:
                        self.mirror.before_step()
                    self._step()
                elif self.mirror is not None:
                    self.mirror.idle()
        except BaseException as e:  # noqa: BLE001 - reported by /health and to every waiting client
            self.error = e
            if self.mirror is not None:
                self.mirror.fail(e)
            raise
        finally:
            self._abort_all()
        if self.mirror is not None:
            self.mirror.shutdown()

    def _take_commands(self, wait: bool) -> None:
        try:
            cmd = self._inbox.get(timeout=0.05) if wait else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._run_command(cmd)
            try:
                cmd = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _run_command(self, cmd: _Add | _Abort) -> None:
        if isinstance(cmd, _Abort):
            if self.engine.abort(cmd.rid):
                self.metrics.aborted.inc()
            if self.mirror is not None:
                self.mirror.aborted(cmd.rid)
            self._tracked.pop(cmd.rid, None)
            return
        if not cmd.result.set_running_or_notify_cancel():  # the submitter was cancelled while it waited
            return
        rid = self.engine.add_checked(cmd.request)
        if self.mirror is not None:
            self.mirror.added(rid, cmd.request)
        self._tracked[rid] = cmd.tracked
        self.metrics.prompt_tokens.inc(len(cmd.request.prompt_ids))
        cmd.result.set_result(rid)

    def _step(self) -> None:
        preempted = self.engine.stats.preemptions
        outputs = self.engine.step()
        now = time.perf_counter()
        m = self.metrics
        m.preemptions.inc(self.engine.stats.preemptions - preempted)
        if outputs:
            m.batch_size.observe(len(outputs))
            m.max_running.set(max(m.max_running_value, len(outputs)))
            m.max_running_value = max(m.max_running_value, len(outputs))
        m.generation_tokens.inc(sum(len(out.token_ids) for out in outputs))
        for out in outputs:
            t = self._tracked.get(out.request_id)
            if t is None:
                continue
            if t.last_token is None:
                m.time_to_first_token.observe(now - t.arrival)
            else:
                m.inter_token_latency.observe(now - t.last_token)
            t.last_token = now
            if out.text or out.logprobs:
                self._publish(t, TextEvent(out.text, tuple(out.logprobs)))
            if out.completion is not None:
                del self._tracked[out.request_id]
                m.finished.labels(out.completion.finish_reason).inc()
                self._publish(t, DoneEvent(out.completion))

    def _publish(self, t: _Tracked, event: Event) -> None:
        try:
            t.loop.call_soon_threadsafe(t.events.put_nowait, event)
        except RuntimeError:  # the event loop is closed (server gone): nobody listens
            pass

    def _abort_all(self) -> None:
        while True:  # fail requests still in the inbox
            try:
                cmd = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(cmd, _Add):
                cmd.result.set_exception(Overloaded("the server is shutting down"))
        self._abort_tracked(mirrored=False)

    def _abort_tracked(self, mirrored: bool) -> None:
        """Abort every running request and tell its client (``mirrored``: the other ranks of ``--tp`` go on
        stepping, so they abort it too)."""
        for rid, t in list(self._tracked.items()):
            if self.engine.abort(rid):
                self.metrics.aborted.inc()
            if mirrored and self.mirror is not None:
                self.mirror.aborted(rid)
            self._publish(t, AbortedEvent())
        self._tracked.clear()
