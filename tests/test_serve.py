"""The OpenAI-compatible server, live on 127.0.0.1 with the default SmolLM2 model and the official ``openai``
client: results equal offline ``LLM.generate`` (greedy), streaming, concurrency (continuous batching
across clients), client disconnects, bad requests, graceful shutdown on SIGTERM.

One module-scoped server runs uvicorn in a thread over an :class:`~mistral_kernels.LLM` loaded in this
process; the offline references are generated with that same LLM before the server starts. The SIGTERM
test starts ``python -m mistral_kernels serve`` as a subprocess.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install '.[serve]')")
openai = pytest.importorskip("openai", reason="the test extra is not installed (pip install '.[test]')")
import httpx  # noqa: E402
import uvicorn  # noqa: E402

from mistral_kernels import LLM  # noqa: E402
from mistral_kernels.batch import AttentionBatch  # noqa: E402
from mistral_kernels.serve.app import build_app  # noqa: E402

from .helpers.default_model_files import default_model_or_skip  # noqa: E402
from .helpers.net_helpers import free_port, wait_healthy  # noqa: E402

pytestmark = pytest.mark.slow

NAME = "smollm2"
NUM_BLOCKS = 64  # 1024 token slots: small enough to test the pool limits
CHAT = [{"role": "system", "content": "You are concise."},
        {"role": "user", "content": "What is the capital of France?"}]
MANY = [f"Name one fact about the number {i}." for i in range(32)]
MANY_MAX = [2 + 2 * (i % 4) for i in range(32)]  # 2, 4, 6, 8


@dataclass
class Live:
    url: str
    llm: LLM
    chat_ref: object  # Completion of CHAT, greedy, 24 tokens
    many_ref: list[object]  # Completions of MANY (chat), greedy, max(MANY_MAX) tokens

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0)

    def metric(self, name: str) -> float:
        text = httpx.get(self.url + "/metrics").text
        m = re.search(rf"^mistral_kernels_{name} (\S+)$", text, re.M)
        assert m, f"metric {name} missing"
        return float(m.group(1))


def _model_path() -> Path:
    return default_model_or_skip()


@pytest.fixture(scope="module")
def subprocess_server() -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``python -m mistral_kernels serve`` started first, so that it loads while the in-process server does."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "mistral_kernels", "serve", "--model", str(_model_path()),
                             "--port", str(port), "--num-blocks", str(NUM_BLOCKS), "--served-model-name", NAME],
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    yield proc, f"http://127.0.0.1:{port}"
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def live(subprocess_server: tuple[subprocess.Popen[str], str]) -> Iterator[Live]:
    llm = LLM(_model_path(), max_batch=16, num_blocks=NUM_BLOCKS, activations="exact")  # exact activations: the parity / batching invariants under test hold for the exact path
    system, user = CHAT[0]["content"], CHAT[1]["content"]
    chat_ref = llm.generate([user], system=system, chat=True, max_new_tokens=24)[0]
    many_ref = llm.generate(MANY, chat=True, max_new_tokens=max(MANY_MAX))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(llm, NAME, max_waiting=64), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    while not server.started:
        assert time.time() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.05)
    yield Live(url, llm, chat_ref, many_ref)
    server.should_exit = True
    thread.join(30)


def test_models_and_health(live: Live) -> None:
    assert [m.id for m in live.client().models.list().data] == [NAME]
    assert httpx.get(live.url + "/health").status_code == 200


def test_chat_equals_offline_generate(live: Live) -> None:
    ref = live.chat_ref
    r = live.client().chat.completions.create(model=NAME, messages=CHAT, temperature=0, max_tokens=24)
    assert r.choices[0].message.content == ref.text
    assert r.choices[0].finish_reason == ref.finish_reason
    assert r.usage.prompt_tokens == len(ref.prompt_token_ids)
    assert r.usage.completion_tokens == len(ref.token_ids)
    assert r.usage.total_tokens == len(ref.prompt_token_ids) + len(ref.token_ids)


def test_stream_equals_offline_generate(live: Live) -> None:
    ref = live.chat_ref
    pieces, finish, usage, roles = [], [], None, []
    for chunk in live.client().chat.completions.create(model=NAME, messages=CHAT, temperature=0, max_tokens=24,
                                                        stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            roles += [ch.delta.role] if ch.delta.role else []
            pieces += [ch.delta.content] if ch.delta.content else []
            finish += [ch.finish_reason] if ch.finish_reason else []
    assert roles == ["assistant"]
    assert len(pieces) > 3  # one chunk per piece, not one blob
    assert "".join(pieces) == ref.text
    assert finish == [ref.finish_reason]
    assert usage is not None and usage.completion_tokens == len(ref.token_ids)
    assert usage.prompt_tokens == len(ref.prompt_token_ids)


def test_stop_and_max_tokens(live: Live) -> None:
    ref_text = live.chat_ref.text
    words = ref_text.split()
    assert len(words) >= 3, ref_text
    stop = " " + words[2]
    c = live.client()
    r = c.chat.completions.create(model=NAME, messages=CHAT, temperature=0, max_tokens=24, stop=[stop])
    assert r.choices[0].message.content == ref_text[:ref_text.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    r = c.chat.completions.create(model=NAME, messages=CHAT, temperature=0, max_completion_tokens=3)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3
    assert ref_text.startswith(r.choices[0].message.content)
    # plain completion of token ids, n = 2 greedy choices are equal
    ids = live.chat_ref.prompt_token_ids
    r = c.completions.create(model=NAME, prompt=ids, temperature=0, max_tokens=5, n=2)
    assert [ch.text for ch in r.choices] == [ref_text[:len(r.choices[0].text)]] * 2
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 10


def test_32_concurrent_streams(live: Live) -> None:
    client = openai.AsyncOpenAI(base_url=live.url + "/v1", api_key="none", max_retries=0)

    async def one(i: int) -> str:
        stream = await client.chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": MANY[i]}], temperature=0, max_tokens=MANY_MAX[i],
            stream=True)
        return "".join([ch.choices[0].delta.content or "" async for ch in stream if ch.choices])

    async def all_of_them() -> list[str]:
        return await asyncio.gather(*(one(i) for i in range(len(MANY))))

    texts = asyncio.run(all_of_them())
    # greedy: the first m tokens of the longest offline completion
    tok = live.llm.tokenizer
    assert texts == [tok.decode(c.token_ids[:m]) for c, m in zip(live.many_ref, MANY_MAX)]
    assert live.metric("max_running") > 1  # batched across clients
    assert live.metric("kv_blocks_used") == 0


def test_disconnect_aborts_and_frees_blocks(live: Live) -> None:
    aborted = live.metric("requests_aborted_total")
    body = {"model": NAME, "messages": CHAT, "temperature": 0, "max_tokens": 400, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", live.url + "/v1/chat/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
        assert any('"content"' in g for g in got)
        assert live.metric("kv_blocks_used") > 0
    deadline = time.time() + 20
    while live.metric("kv_blocks_used") != 0 or live.metric("requests_aborted_total") != aborted + 1:
        assert time.time() < deadline, "the disconnected request still holds KV blocks"
        time.sleep(0.1)


@pytest.mark.parametrize("body, status, param", [
    ("{not json", 400, None),
    ({"model": "gpt-4", "messages": CHAT}, 404, "model"),
    ({"model": NAME}, 400, "messages"),
    ({"model": NAME, "messages": "hello"}, 400, "messages"),
    ({"model": NAME, "messages": CHAT, "temperature": -0.5}, 400, "temperature"),
    ({"model": NAME, "messages": CHAT, "temperature": "hot"}, 400, "temperature"),
    ({"model": NAME, "messages": CHAT, "top_p": 0}, 400, "top_p"),
    ({"model": NAME, "messages": CHAT, "top_p": 1.5}, 400, "top_p"),
    ({"model": NAME, "messages": CHAT, "max_tokens": 0}, 400, "max_tokens"),
    ({"model": NAME, "messages": CHAT, "n": 0}, 400, "n"),
    ({"model": NAME, "messages": CHAT, "max_tokens": 16, "n": 40}, 400, "n"),
    ({"model": NAME, "messages": [{"role": "user", "content": "word " * 2000}], "max_tokens": 4}, 400, "messages"),
    ({"model": NAME, "messages": [{"role": "user", "content": "word " * 950}], "max_tokens": 100}, 400,
     "max_tokens"),
    ({"model": NAME, "prompt": [1] * 9000, "max_tokens": 4}, 400, "prompt"),
    ({"model": NAME, "messages": CHAT, "top_logprobs": 2}, 400, "top_logprobs"),  # without logprobs=true
    ({"model": NAME, "messages": CHAT, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs"),
    ({"model": NAME, "prompt": "hi", "logprobs": 21}, 400, "logprobs"),
    ({"model": NAME, "messages": CHAT, "seed": 2**70}, 400, "seed"),
    ({"model": NAME, "messages": CHAT, "stop": [""]}, 400, "stop"),
])
def test_bad_request_then_good(live: Live, body: object, status: int, param: str | None) -> None:
    path = "/v1/completions" if isinstance(body, dict) and "prompt" in body else "/v1/chat/completions"
    if isinstance(body, str):
        r = httpx.post(live.url + path, content=body, headers={"content-type": "application/json"})
    else:
        r = httpx.post(live.url + path, json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"] and err["type"]
    if param is not None:
        assert param in err["message"]
    good = live.client().chat.completions.create(model=NAME, messages=CHAT, temperature=0, max_tokens=2)
    assert good.choices[0].message.content == live.chat_ref.text[:len(good.choices[0].message.content)]
    assert good.usage.completion_tokens == 2


def test_sigterm_while_streaming_exits_zero(subprocess_server: tuple[subprocess.Popen[str], str]) -> None:
    proc, url = subprocess_server
    wait_healthy(proc, url)
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    finishes: list[str | None] = []
    started = threading.Barrier(3)

    def stream() -> None:
        s = client.chat.completions.create(model=NAME, messages=CHAT, temperature=0, max_tokens=12,
                                           stream=True, extra_body={"ignore_eos": True})
        first = True
        for ch in s:
            if first and ch.choices and ch.choices[0].delta.content:
                started.wait(30)
                first = False
            if ch.choices and ch.choices[0].finish_reason:
                finishes.append(ch.choices[0].finish_reason)

    threads = [threading.Thread(target=stream) for _ in range(2)]
    for t in threads:
        t.start()
    started.wait(60)
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=20)
    for t in threads:
        t.join(5)
    assert rc == 0, proc.stdout.read() if proc.stdout else ""
    assert finishes == ["length", "length"]  # in-flight requests were finished, not cut


def _raw_logprobs(live: Live, prompt: list[int], out: list[int]) -> torch.Tensor:
    """Reference: log_softmax [len(out), V] of one plain forward of the model over prompt + out (every row's
    logits; no engine, runner or sampler), at the positions that predicted ``out``."""
    model = live.llm.model
    ids = prompt + out
    bs = 16
    cache = model.new_cache((len(ids) + bs - 1) // bs, bs)
    batch = AttentionBatch.build([list(range((len(ids) + bs - 1) // bs))], [0], [len(ids)], bs)
    logits = model.forward(torch.tensor(ids), batch, cache).float()  # [T, V]
    return logits[len(prompt) - 1:len(prompt) - 1 + len(out)].log_softmax(dim=-1)


def test_chat_logprobs_equal_log_softmax_streamed_or_not(live: Live) -> None:
    c = live.client()
    r = c.chat.completions.create(model=NAME, messages=CHAT, temperature=0, max_tokens=6, logprobs=True,
                                  top_logprobs=3)
    ref_ids = live.chat_ref.token_ids[:6]
    tok = live.llm.tokenizer
    content = r.choices[0].logprobs.content
    assert [e.token for e in content] == [tok.decode([t], skip_special_tokens=False) for t in ref_ids]
    ref = _raw_logprobs(live, live.chat_ref.prompt_token_ids, ref_ids)
    for i, e in enumerate(content):
        assert e.logprob == pytest.approx(float(ref[i, ref_ids[i]]), abs=1e-3)
        assert e.bytes == list(e.token.encode("utf-8"))
        top_v, top_i = ref[i].topk(3)
        assert [t.token for t in e.top_logprobs] == [tok.decode([t], skip_special_tokens=False) for t in top_i]
        assert [t.logprob for t in e.top_logprobs] == pytest.approx(top_v.tolist(), abs=1e-3)
        assert e.top_logprobs[0].token == e.token  # greedy
    streamed = []
    for chunk in c.chat.completions.create(model=NAME, messages=CHAT, temperature=0, max_tokens=6, logprobs=True,
                                           top_logprobs=3, stream=True):
        for ch in chunk.choices:
            streamed += ch.logprobs.content if ch.logprobs is not None else []
    assert [e.token for e in streamed] == [e.token for e in content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content], abs=1e-5)
    plain = c.chat.completions.create(model=NAME, messages=CHAT, temperature=0, max_tokens=2)
    assert plain.choices[0].logprobs is None


def test_completion_logprobs_equal_log_softmax(live: Live) -> None:
    ids = live.chat_ref.prompt_token_ids
    ref_ids = live.chat_ref.token_ids[:5]
    ref = _raw_logprobs(live, ids, ref_ids)
    tok = live.llm.tokenizer
    texts = [tok.decode([t], skip_special_tokens=False) for t in ref_ids]
    c = live.client()
    r = c.completions.create(model=NAME, prompt=ids, temperature=0, max_tokens=5, logprobs=2)
    lp = r.choices[0].logprobs
    assert lp.tokens == texts
    assert lp.token_logprobs == pytest.approx([float(ref[i, t]) for i, t in enumerate(ref_ids)], abs=1e-3)
    assert lp.text_offset == [sum(len(t) for t in texts[:i]) for i in range(len(texts))]
    for i, alts in enumerate(lp.top_logprobs):
        top_v, top_i = ref[i].topk(2)
        assert alts == pytest.approx({tok.decode([t], skip_special_tokens=False): v
                                      for t, v in zip(top_i.tolist(), top_v.tolist())}, abs=1e-3)
    streamed_tokens, streamed_offsets = [], []
    for chunk in c.completions.create(model=NAME, prompt=ids, temperature=0, max_tokens=5, logprobs=2, stream=True):
        for ch in chunk.choices:
            if ch.logprobs is not None:
                streamed_tokens += ch.logprobs.tokens
                streamed_offsets += ch.logprobs.text_offset
    assert streamed_tokens == texts and streamed_offsets == lp.text_offset
    hot = c.completions.create(model=NAME, prompt=ids, temperature=1.5, seed=3, max_tokens=4, logprobs=0)
    got = hot.choices[0].logprobs
    assert len(got.tokens) == hot.usage.completion_tokens == 4
    # logprobs=0: the sampled token only, with its own log-probability
    assert [list(a.items()) for a in got.top_logprobs] == [[(t, v)] for t, v in zip(got.tokens, got.token_logprobs)]


def test_non_streaming_disconnect_aborts(live: Live) -> None:
    aborted = live.metric("requests_aborted_total")
    body = json.dumps({"model": NAME, "messages": CHAT, "temperature": 0, "max_tokens": 400, "ignore_eos": True})
    host, port = live.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
    deadline = time.time() + 20
    while live.metric("requests_running") < 1:
        assert time.time() < deadline, "the request never started"
        time.sleep(0.05)
    sock.close()
    deadline = time.time() + 20
    while (live.metric("kv_blocks_used"), live.metric("requests_running"), live.metric("requests_waiting"),
           live.metric("requests_aborted_total")) != (0, 0, 0, aborted + 1):
        assert time.time() < deadline, "the disconnected request is still in the engine"
        time.sleep(0.1)
