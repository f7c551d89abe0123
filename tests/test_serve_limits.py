"""The server under demanding clients, live on 127.0.0.1 with the default SmolLM2 model: sampling limits
(tiny / huge temperatures), strict field types, lone UTF-16 surrogates on a kept-alive connection, the
request body cap while ``/health`` is timed, the log-probability bytes of multi-byte characters, and a
stream cut at shutdown as the client sees it.

Requests go through the official ``openai`` client or raw ``httpx`` (for bodies the client would not send).
One module-scoped server runs uvicorn in a thread over an :class:`~mistral_kernels.LLM` loaded in this
process; the shutdown test starts ``python -m mistral_kernels serve`` as a subprocess.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install '.[serve]')")
openai = pytest.importorskip("openai", reason="the test extra is not installed (pip install '.[test]')")
import httpx  # noqa: E402

from mistral_kernels import LLM  # noqa: E402

from .helpers.default_model_files import default_model_or_skip  # noqa: E402
from .helpers.live_server import Live, serve_in_thread  # noqa: E402
from .helpers.net_helpers import free_port, wait_healthy  # noqa: E402

pytestmark = pytest.mark.slow

NAME = "smollm2"
MAX_BODY = 8 << 20  # the server's request body cap in this module (the default is 1 MiB)
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def greedy_text(live: Live, max_tokens: int = 6) -> str:
    r = live.client().chat.completions.create(model=NAME, messages=CHAT, temperature=0, max_tokens=max_tokens)
    return r.choices[0].message.content or ""


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    llm = LLM(default_model_or_skip(), max_batch=8, num_blocks=64)
    with serve_in_thread(llm, NAME, max_waiting=64, max_request_bytes=MAX_BODY) as url:
        yield Live(url, llm, NAME)


def _error(r: httpx.Response, status: int, param: str | None) -> dict[str, object]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json"), r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] and err["message"], err
    if param is not None:
        assert param in err["message"]
    return err


# ------------------------------------------------------------------ temperature
@pytest.mark.parametrize("tiny", [1e-38, 1e-6])
def test_tiny_temperature_is_greedy(live: Live, tiny: float) -> None:
    r = live.client().chat.completions.create(model=NAME, messages=CHAT, temperature=tiny, max_tokens=6)
    assert r.choices[0].message.content == greedy_text(live)


@pytest.mark.parametrize("raw", ["100", "2.5", "Infinity", "1e309", "-Infinity", "NaN"])
def test_huge_temperature_is_400(live: Live, raw: str) -> None:
    body = f'{{"model": "{NAME}", "messages": [{{"role": "user", "content": "hi"}}], "temperature": {raw}}}'
    r = httpx.post(live.url + "/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    _error(r, 400, "temperature")
    with pytest.raises(openai.BadRequestError, match="temperature"):
        live.client().completions.create(model=NAME, prompt="hi", temperature=100, max_tokens=2)


# ------------------------------------------------------------------ strict field types
@pytest.mark.parametrize("field, value", [
    ("n", "2"), ("stream", "yes"), ("max_tokens", True), ("max_tokens", "5"), ("max_tokens", 5.0),
    ("temperature", "0.5"), ("seed", "7"), ("logprobs", 1), ("top_logprobs", "2"), ("ignore_eos", 1),
])
def test_field_types_are_strict(live: Live, field: str, value: object) -> None:
    extra = {"logprobs": True} if field == "top_logprobs" else {}
    body = {"model": NAME, "messages": CHAT, "max_tokens": 2, **extra, field: value}
    _error(httpx.post(live.url + "/v1/chat/completions", json=body), 400, field)
    with pytest.raises(openai.BadRequestError, match=field):
        live.client().chat.completions.create(model=NAME, messages=CHAT, extra_body={**extra, field: value})


def test_strict_types_still_take_ints_for_floats(live: Live) -> None:
    r = live.client().chat.completions.create(model=NAME, messages=CHAT, temperature=0, top_p=1, max_tokens=3)
    assert r.usage.completion_tokens == 3


# ------------------------------------------------------------------ lone surrogates, kept-alive connections
SURROGATE_BODIES = [
    ("messages.0.content", '{"model": "%s", "max_tokens": 2, "messages": [{"role": "user", "content": "a\\ud800b"}]}'),
    ("stop", '{"model": "%s", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}], "stop": "\\udfff"}'),
    ("stop.1", '{"model": "%s", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}], '
               '"stop": ["x", "\\ud83d"]}'),
    ("model", '{"model": "\\ud800", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}'),
]


def test_lone_surrogates_are_400_and_keep_the_connection(live: Live) -> None:
    good = {"model": NAME, "messages": CHAT, "temperature": 0, "max_tokens": 1}
    with httpx.Client(base_url=live.url, timeout=60) as client:
        for i in range(20):
            param, body = SURROGATE_BODIES[i % len(SURROGATE_BODIES)]
            r = client.post("/v1/chat/completions", content=(body % NAME if "%s" in body else body).encode(),
                            headers={"content-type": "application/json"})
            err = _error(r, 400, param)
            assert "surrogate" in str(err["message"])
            ok = client.post("/v1/chat/completions", json=good)  # same kept-alive connection
            assert ok.status_code == 200, ok.text
            assert ok.json()["usage"]["completion_tokens"] == 1
        r = client.post("/v1/completions", content=b'{"model": "%s", "prompt": ["ok", "\\udc00"]}' % NAME.encode(),
                        headers={"content-type": "application/json"})
        _error(r, 400, "prompt.1")



def test_unexpected_error_is_json_500_and_keeps_the_connection(live: Live, monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    def broken(*args: object, **kwargs: object) -> list[int]:
        raise RuntimeError("planted failure")

    good = {"model": NAME, "messages": CHAT, "temperature": 0, "max_tokens": 1}
    with httpx.Client(base_url=live.url, timeout=60) as client:
        for _ in range(5):
            with monkeypatch.context() as m:
                m.setattr(live.llm.tokenizer, "apply_chat_template", broken)
                r = client.post("/v1/chat/completions", json=good)
            err = _error(r, 500, None)
            assert "planted failure" in str(err["message"]) and err["type"] == "internal_server_error"
            ok = client.post("/v1/chat/completions", json=good)  # same kept-alive connection
            assert ok.status_code == 200, ok.text

# ------------------------------------------------------------------ body size, parsing off the event loop
def test_body_over_the_cap_is_413(live: Live) -> None:
    big = b'{"model": "x", "prompt": "' + b"a" * (MAX_BODY + 10) + b'"}'
    with httpx.Client(base_url=live.url, timeout=60) as client:
        for content in (big, iter([big[i:i + 65536] for i in range(0, len(big), 65536)])):  # sized / chunked
            r = client.post("/v1/completions", content=content, headers={"content-type": "application/json"})
            assert r.status_code == 413, r.text
            err = r.json()["error"]
            assert str(MAX_BODY) in err["message"] and "--max-request-bytes" in err["message"]
            ok = client.post("/v1/completions", json={"model": NAME, "prompt": "hi", "max_tokens": 1})
            assert ok.status_code == 200, ok.text  # the same connection still works


@pytest.mark.parametrize("size, status, param", [
    (5_000_000, 400, "messages"),  # read, parsed, validated, tokenized, then too long for the context
    (MAX_BODY + 1000, 413, None),  # read to its end (so the connection stays usable), not kept
])
def test_health_answers_while_a_large_body_is_handled(live: Live, size: int, status: int, param: str | None
                                                      ) -> None:
    body = {"model": NAME, "messages": [{"role": "user", "content": "word " * (size // 5)}], "max_tokens": 1}
    result: list[httpx.Response] = []
    sender = threading.Thread(target=lambda: result.append(
        httpx.post(live.url + "/v1/chat/completions", json=body, timeout=120)))
    waits = []
    with httpx.Client(base_url=live.url, timeout=60) as client:
        client.get("/health")
        sender.start()
        while sender.is_alive():
            t0 = time.perf_counter()
            assert client.get("/health").status_code == 200
            waits.append(time.perf_counter() - t0)
            time.sleep(0.02)
    sender.join()
    _error(result[0], status, param)
    # /health is answered between the big request's steps, not after them (the load of other processes on
    # the machine can delay one answer, not a whole parse and tokenization). A quiet machine handles the body
    # between two probes; a blocked event loop makes the probe in flight wait for all of it (9 s measured).
    print(f"/health waits while a {size}-byte body is handled: max {max(waits):.3f} s over {len(waits)}")
    assert len(waits) >= 1 and max(waits) < 2.5, waits


# ------------------------------------------------------------------ logprob bytes, the EOS entry
def _reference_piece_bytes(live: Live) -> dict[int, bytes]:
    """Token id → bytes, from the model file's own vocabulary read by the ``gguf`` package and spelled back
    with transformers' GPT-2 byte alphabet (neither is this project's code)."""
    gguf = pytest.importorskip("gguf")
    gpt2 = pytest.importorskip("transformers.convert_slow_tokenizer")
    path = live.llm.path
    reader = gguf.GGUFReader(str(path))
    field = reader.fields["tokenizer.ggml.tokens"]
    tokens = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
    to_byte = {c: b for b, c in gpt2.bytes_to_unicode().items()}
    return {i: bytes(to_byte[c] for c in t) for i, t in enumerate(tokens) if all(c in to_byte for c in t)}


def test_logprob_bytes_of_multibyte_characters(live: Live) -> None:
    if not str(live.llm.path).endswith(".gguf"):
        pytest.skip("the reference reads a GGUF vocabulary")
    ref = _reference_piece_bytes(live)
    c = live.client()
    messages = [{"role": "user", "content": "Repeat exactly: 🙂🙂🙂🙂"}]
    r = c.chat.completions.create(model=NAME, messages=messages, temperature=0, max_tokens=16, logprobs=True,
                                  top_logprobs=2)
    content = r.choices[0].message.content or ""
    entries = r.choices[0].logprobs.content
    assert "🙂" in content and r.choices[0].finish_reason == "stop", content  # the answer this test needs
    assert any(e.token == "\ufffd" for e in entries)  # pieces of a character: their text alone is U+FFFD ...
    assert b"".join(bytes(e.bytes) for e in entries) == content.encode("utf-8")  # ... their bytes are real
    ids = live.llm.tokenizer.encode(content, add_special_tokens=False)
    assert [list(ref[i]) for i in ids] == [e.bytes for e in entries]  # the vocabulary's bytes, token by token
    for e in entries:
        assert e.top_logprobs[0].bytes == e.bytes  # greedy: the top alternative is the token
        for alt in e.top_logprobs:
            assert bytes(alt.bytes).decode("utf-8", "replace") == alt.token
    # EOS ended the answer: chat leaves its entry out (the entries join to the content); completions keep
    # one entry per generated token, EOS included
    assert r.usage.completion_tokens == len(entries) + 1
    streamed = [e for ch in c.chat.completions.create(model=NAME, messages=messages, temperature=0, max_tokens=16,
                                                      logprobs=True, stream=True)
                for choice in ch.choices if choice.logprobs is not None for e in choice.logprobs.content]
    assert [e.bytes for e in streamed] == [e.bytes for e in entries]
    prompt_ids = live.llm.tokenizer.apply_chat_template(messages)
    done = c.completions.create(model=NAME, prompt=prompt_ids, temperature=0, max_tokens=16, logprobs=0)
    assert len(done.choices[0].logprobs.tokens) == done.usage.completion_tokens == len(entries) + 1


# ------------------------------------------------------------------ a stream cut at shutdown
def test_stream_cut_at_shutdown_is_seen_by_the_client() -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "mistral_kernels", "serve", "--model", str(default_model_or_skip()),
                             "--port", str(port), "--num-blocks", "64", "--served-model-name", NAME,
                             "--shutdown-timeout", "1"],
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url)
        body = {"model": NAME, "messages": CHAT, "temperature": 0, "max_tokens": 400, "ignore_eos": True,
                "stream": True, "n": 2}
        events: list[str] = []
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line.removeprefix("data: "))
                    if len(events) == 6:  # streaming: cut it
                        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, proc.stdout.read() if proc.stdout else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "shutdown" and "shut down" in error["message"]
    finishes = [c["finish_reason"] for e in events[:-2] for c in json.loads(e)["choices"] if c["finish_reason"]]
    assert finishes == ["abort", "abort"]  # both choices, cut, not "length"
