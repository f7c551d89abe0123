"""The OpenAI-compatible HTTP app: ``/v1/models`` (and ``/v1/models/{id}``), ``/v1/completions``,
``/v1/chat/completions``, ``/health``, ``/metrics``.

Each endpoint validates its body (:mod:`.protocol`), turns it into prompt ids and its
:class:`~mistral_kernels.sampling_params.SamplingParams` (``body.to_sampling_params()``), has the engine admit
each prompt (:meth:`~mistral_kernels.engine.Engine.check_request`: the token limit, the context, the KV
pool for ``n`` copies; a request that can never run is a 400 naming the field to lower), makes ``n``
engine requests of each (with a ``seed``, choice i samples with ``seed + i``), submits them to the shared
:class:`~.async_engine.AsyncEngine`, and answers either one JSON body or server-sent events (one chunk per
detokenised piece). A client that disconnects (streaming or not) has its requests aborted: their KV
blocks return to the pool before the next engine step.

``logprobs`` (see :mod:`.logprobs_format` for the shapes): the log-probabilities of the raw model
distribution (``log_softmax`` of the logits, before penalties, temperature and filters), as vLLM returns by
default; chat asks with ``logprobs: true`` and ``top_logprobs: 0..20``, completions with ``logprobs: 0..20``.

Chat requests with ``tools`` are prompted and parsed by :mod:`.tool_calls`; ``response_format`` sets the
request's output constraint (``SamplingParams.structured``). Completions with ``echo`` return the prompt's text
before the generated text (in the first streamed chunk); ``echo`` with ``logprobs`` is refused (the prompt's
log-probabilities are not computed).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..engine import AdmissionError, CheckedRequest, Completion
from ..llm import LLM
from ..logprobs import TokenLogprob
from .async_engine import AsyncEngine, DoneEvent, Overloaded, RequestStream, TextEvent
from .body import DEFAULT_MAX_REQUEST_BYTES, parse_body
from .errors import APIError, install_error_handlers
from .logprobs_format import LogprobFormatter
from .metrics import ServerMetrics
from .protocol import ChatCompletionRequest, CompletionRequest, InvalidField, SamplingFields
from .tool_calls import ChatTools, chat_tools, message, tool_params
from .tp import EngineMirror

__all__ = ["ServerState", "build_app"]


@dataclass
class ServerState:
    llm: LLM
    served_model_name: str
    engine: AsyncEngine
    metrics: ServerMetrics
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_prompt_chars: int = 0  # 0: no bound (set by build_app: _max_prompt_chars)


# Normalizers may drop characters (control characters, NFKC folds): the character bound allows 4× for them.
_NORMALIZER_SLACK = 4


def _max_prompt_chars(llm: LLM) -> int:
    """Characters past which a text cannot fit the context whatever it tokenizes to: a token spells at most
    the longest token's bytes, a character takes at least one byte, so a text of more than context ×
    longest-token-bytes characters (× the normalizer slack) has more tokens than the context holds. Such a
    prompt is refused before tokenizing: a tokenizer holds the GIL while it runs (2.7 s for 5 MB, which would
    stall every other client)."""
    tok = llm.tokenizer
    longest = max((len(tok.token_bytes(i)) for i in range(tok.vocab_size)), default=1)
    return llm.model.config.max_position * max(longest, 1) * _NORMALIZER_SLACK


def _check_prompt_chars(state: ServerState, chars: int, field: str) -> None:
    if state.max_prompt_chars and chars > state.max_prompt_chars:
        raise APIError(400, f"{field}: {chars} characters cannot fit the model's context of "
                            f"{state.llm.model.config.max_position} tokens (at most {state.max_prompt_chars} "
                            "characters are tokenized)", field, "context_length_exceeded")


def build_app(llm: LLM, served_model_name: str, max_waiting: int = 256, mirror: EngineMirror | None = None,
              max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> FastAPI:
    """The app over a loaded :class:`~mistral_kernels.llm.LLM`; its engine loop runs while the app does
    (``mirror``: rank 0 of ``serve --tp N``, see :mod:`.tp`; ``max_request_bytes``: the body cap, see
    :mod:`.body`)."""
    metrics = ServerMetrics(llm.engine)
    state = ServerState(llm, served_model_name, AsyncEngine(llm.engine, metrics, max_waiting, mirror), metrics,
                        max_request_bytes, _max_prompt_chars(llm))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.engine.start()
        yield
        state.engine.stop()

    app = FastAPI(title="mistral-kernels", lifespan=lifespan)
    app.state.server = state
    install_error_handlers(app)

    @app.get("/health")
    async def health() -> Response:
        if not state.engine.healthy:
            raise APIError(503, f"the engine loop is not running: {state.engine.error!r}")
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    card = {"id": served_model_name, "object": "model", "created": 0, "owned_by": "mistral-kernels",
            "max_model_len": llm.model.config.max_position}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [card]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        if model_id != served_model_name:
            raise APIError(404, f"model: '{model_id}' does not exist; this server serves '{served_model_name}'",
                           "model", "model_not_found")
        return card

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request) -> Response:
        body = await parse_body(request, ChatCompletionRequest, state.max_request_bytes)
        _check_model(state, body)
        if body.top_logprobs is not None and not body.logprobs:
            raise APIError(400, "top_logprobs: needs logprobs=true", "top_logprobs")
        messages = [m.as_dict() for m in body.messages]
        tools = chat_tools(body, llm.tokenizer)
        _check_prompt_chars(state, sum(len(m.text()) for m in body.messages) +
                            sum(len(str(t)) for t in tools.tools), "messages")
        try:
            # tokenized off the event loop: a long prompt does not stall other clients
            prompt = await asyncio.to_thread(tools.prompt_ids, llm.tokenizer, messages)
        except ValueError as e:
            raise APIError(400, f"messages: {e}", "messages") from e
        return await _serve(state, request, body, [prompt], "messages", chat=True, tools=tools)

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> Response:
        body = await parse_body(request, CompletionRequest, state.max_request_bytes)
        _check_model(state, body)
        prompts = await asyncio.to_thread(_prompts, state, body.prompt)  # tokenized off the event loop
        echo = None
        if body.echo:
            if body.logprobs is not None:
                raise APIError(400, "echo: not with logprobs (the prompt's log-probabilities are not computed)",
                               "echo")
            if isinstance(body.prompt, str):
                echo = [body.prompt]
            elif isinstance(body.prompt[0], str):
                echo = list(body.prompt)  # type: ignore[arg-type]
            else:
                echo = [llm.tokenizer.decode(p, skip_special_tokens=False) for p in prompts]
        return await _serve(state, request, body, prompts, "prompt", chat=False, echo=echo)

    return app


def _check_model(state: ServerState, body: SamplingFields) -> None:
    if body.model != state.served_model_name:
        raise APIError(404, f"model: '{body.model}' does not exist; this server serves "
                            f"'{state.served_model_name}' (see GET /v1/models)", "model", "model_not_found")


def _prompts(state: ServerState, prompt: str | list[str] | list[int] | list[list[int]]) -> list[list[int]]:
    if isinstance(prompt, str):
        prompt = [prompt]
    if not prompt:
        raise APIError(400, "prompt: must not be empty", "prompt")
    if isinstance(prompt[0], int):
        prompt = [prompt]  # type: ignore[list-item]
    out = []
    for p in prompt:
        if isinstance(p, str):
            _check_prompt_chars(state, len(p), "prompt")
        ids = state.llm.tokenizer.encode(p) if isinstance(p, str) else list(p)  # type: ignore[arg-type]
        if not ids:
            raise APIError(400, "prompt: a prompt is empty (need at least one token)", "prompt")
        out.append(ids)
    return out


def _requests(state: ServerState, body: SamplingFields, prompts: list[list[int]],
              field: str, tools: ChatTools | None = None) -> list[CheckedRequest]:
    """``n`` engine requests per prompt, admitted by the engine; a 400 naming the body field otherwise."""
    try:
        params = body.to_sampling_params()
    except InvalidField as e:
        raise APIError(400, str(e), e.param) from e
    if tools is not None:
        params = tool_params(tools, params)
    try:
        params.check_vocabulary(state.llm.engine.config.vocab_size)
    except ValueError as e:  # the message begins with the field
        param = str(e).split()[0]
        raise APIError(400, f"{param}: {e}", param) from e
    params_of = {"prompt_ids": field, "max_new_tokens": body.param_name("max_new_tokens"), "copies": "n"}
    out = []
    for prompt in prompts:
        try:
            checked = state.llm.engine.check_request(prompt, params, copies=body.n)
        except AdmissionError as e:
            param = params_of[e.argument]
            raise APIError(400, f"{param}: {e}", param,
                           "context_length_exceeded" if e.argument != "copies" else None) from e
        except ValueError as e:
            param = field
            if str(e).startswith("structured"):  # the output constraint does not compile
                forced = tools is not None and tools.mode in ("required", "named")
                param = "tools" if forced else body.param_name("structured")
            raise APIError(400, f"{param}: {e}", param) from e
        out += [checked.for_choice(i) for i in range(body.n)]
    return out


async def _submit_all(state: ServerState, requests: Sequence[CheckedRequest]) -> list[RequestStream]:
    streams: list[RequestStream] = []
    try:
        for r in requests:
            streams.append(await state.engine.submit(r))
    except Overloaded as e:
        for s in streams:
            s.abort()
        raise APIError(503, str(e), None, "overloaded") from e
    return streams


def _usage(prompts: Sequence[list[int]], completions: Sequence[Completion]) -> dict[str, int]:
    p = sum(len(x) for x in prompts)
    c = sum(len(x.token_ids) for x in completions)
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


async def _serve(state: ServerState, request: Request, body: SamplingFields, prompts: list[list[int]], field: str,
                 *, chat: bool, tools: ChatTools | None = None, echo: list[str] | None = None) -> Response:
    requests = _requests(state, body, prompts, field, tools)
    streams = await _submit_all(state, requests)
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    head = {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": state.served_model_name}
    fmt = LogprobFormatter(state.llm.tokenizer) if requests[0].params.logprobs is not None else None
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        return StreamingResponse(_sse(streams, head, prompts, chat, include_usage, fmt, tools,
                                      [echo[i // body.n] for i in range(len(streams))] if echo else None),
                                 media_type="text/event-stream")
    done = await _completions_unless_disconnected(request, streams)
    if done is None:  # nobody to answer
        return Response(status_code=499)
    if any(c is None for c in done):
        raise APIError(503, "the server shut down before the request finished", None, "shutdown")
    comps = [c for c in done if c is not None]
    choices = []
    for i, c in enumerate(comps):
        lp: dict[str, Any] | None = None
        if fmt is not None and c.logprobs is not None:
            lp = fmt.chat(c.logprobs) if chat else fmt.completion(c.logprobs)[0]
        if chat:
            msg, finish = message(tools, c.text, c.finish_reason) if tools is not None else \
                ({"role": "assistant", "content": c.text}, c.finish_reason)
            choices.append({"index": i, "message": msg, "logprobs": lp, "finish_reason": finish})
        else:
            text = echo[i // body.n] + c.text if echo else c.text
            choices.append({"index": i, "text": text, "logprobs": lp, "finish_reason": c.finish_reason})
    return JSONResponse({**head, "choices": choices, "usage": _usage(prompts, comps)})


async def _completions_unless_disconnected(request: Request,
                                           streams: list[RequestStream]) -> list[Completion | None] | None:
    """Wait for every stream's completion; None if the client disconnects first. Either way the streams are
    aborted on the way out (a no-op for finished ones), so a request nobody waits for frees its KV blocks."""

    async def all_done() -> list[Completion | None]:
        return [await s.completion() for s in streams]

    async def disconnected() -> None:
        # The body was read already: the next ASGI message is the disconnect.
        while (await request.receive())["type"] != "http.disconnect":
            pass

    work, gone = asyncio.ensure_future(all_done()), asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (work, gone):
            task.cancel()
        for s in streams:
            s.abort()
    return work.result() if work.done() and not work.cancelled() else None


def _sse_line(obj: dict[str, Any] | str) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)}\n\n"


async def _sse(streams: list[RequestStream], head: dict[str, Any], prompts: list[list[int]], chat: bool,
               include_usage: bool, fmt: LogprobFormatter | None, tools: ChatTools | None = None,
               echo: list[str] | None = None) -> AsyncIterator[str]:
    """Server-sent events of all choices, interleaved as their pieces arrive; aborts them when the client
    goes away (the generator is closed or cancelled). A choice cut at shutdown ends with a chunk whose
``finish_reason`` is ``"abort"``; an error event (code ``shutdown``) then precedes ``[DONE]``, so a client can
tell a cut from a finish (the ``openai`` client raises on it). With ``fmt``, each text chunk carries the logprobs of
    the tokens generated since the previous chunk of its choice. With ``tools`` parsing calls, a choice's text
    goes through its :class:`~mistral_kernels.tools.ToolStreamParser` (content and tool-call deltas); with
    ``echo``, each completion choice's first chunk is its prompt's text."""

    head = {**head, "object": "chat.completion.chunk" if chat else "text_completion"}
    offsets = [0] * len(streams)  # completions: text_offset of each choice's next token

    def logprobs(i: int, entries: Sequence[TokenLogprob]) -> dict[str, Any] | None:
        if fmt is None or not entries:
            return None
        if chat:
            return fmt.chat(entries)
        obj, offsets[i] = fmt.completion(entries, offsets[i])
        return obj

    chunk: Callable[[int, str | None, str | None, Sequence[TokenLogprob]], dict[str, Any]]
    if chat:
        def chunk(i: int, text: str | dict[str, Any] | None, finish: str | None,
                  lps: Sequence[TokenLogprob]) -> dict[str, Any]:
            delta = text if isinstance(text, dict) else {} if text is None else {"content": text}
            return {**head, "choices": [{"index": i, "delta": delta, "logprobs": logprobs(i, lps),
                                         "finish_reason": finish}]}
    else:
        def chunk(i: int, text: str | None, finish: str | None, lps: Sequence[TokenLogprob]) -> dict[str, Any]:
            return {**head, "choices": [{"index": i, "text": text or "", "logprobs": logprobs(i, lps),
                                         "finish_reason": finish}]}

    merged: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()

    async def pump(i: int, s: RequestStream) -> None:
        async for event in s:
            await merged.put((i, event))

    parsers = [tools.stream_parser() if tools is not None else None for _ in streams]

    def text_chunks(i: int, piece: str, lps: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
        parser = parsers[i]
        if parser is None:
            return [chunk(i, piece, None, lps)]
        deltas = parser.push(piece)
        if not deltas:
            return [chunk(i, {}, None, lps)] if lps and fmt is not None else []
        return [chunk(i, d, None, lps if k == 0 else ()) for k, d in enumerate(deltas)]

    def finish_chunks(i: int, finish: str) -> list[dict[str, Any]]:
        parser = parsers[i]
        if parser is None:
            return [chunk(i, None if chat else "", finish, ())]
        out = [chunk(i, d, None, ()) for d in parser.finish()]
        return out + [chunk(i, None, "tool_calls" if parser.called and finish == "stop" else finish, ())]

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    completions: list[Completion] = []
    try:
        if chat:
            for i in range(len(streams)):
                yield _sse_line({**head, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                                      "logprobs": None, "finish_reason": None}]})
        elif echo:
            for i in range(len(streams)):
                yield _sse_line(chunk(i, echo[i], None, ()))
        open_streams, cut = len(streams), False
        while open_streams:
            i, event = await merged.get()
            if isinstance(event, TextEvent):
                for c in text_chunks(i, event.piece, event.logprobs):
                    yield _sse_line(c)
                continue
            open_streams -= 1
            if isinstance(event, DoneEvent):
                completions.append(event.completion)
                for c in finish_chunks(i, event.completion.finish_reason):
                    yield _sse_line(c)
            else:  # cut at shutdown: a last chunk that says so; the error event follows the choices
                cut = True
                yield _sse_line(chunk(i, None if chat else "", "abort", ()))
        if cut:
            yield _sse_line({"error": {"message": "the server shut down before the request finished",
                                       "type": "service_unavailable_error", "param": None, "code": "shutdown"}})
        if include_usage:
            yield _sse_line({**head, "choices": [], "usage": _usage(prompts, completions)})
        yield _sse_line("[DONE]")
    finally:
        for t in tasks:
            t.cancel()
        for s in streams:
            s.abort()
