"""Every request field is honoured or refused, live with the official ``openai`` client and httpx against the
server on the default model (SmolLM2): each honoured field changes the output as it says (checked against the
tokenizer and the server's own unconstrained greedy output), each refused one is a 400 in OpenAI's error format
naming it, an unknown field is a 400 naming it, the accepted-and-ignored ones change nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install '.[serve]')")
openai = pytest.importorskip("openai", reason="the test extra is not installed (pip install '.[test]')")
import httpx  # noqa: E402

from mistral_kernels import LLM  # noqa: E402

from .helpers.default_model_files import default_model_or_skip  # noqa: E402
from .helpers.live_server import Live, serve_in_thread  # noqa: E402

pytestmark = pytest.mark.slow

NAME = "smollm2"
PROMPT = "The capital of France is"
CHAT = [{"role": "system", "content": "You are concise."}, {"role": "user", "content": "Name a fruit."}]


class FieldsLive(Live):
    def complete(self, **kw: Any) -> Any:
        return self.client().completions.create(model=NAME, prompt=kw.pop("prompt", PROMPT),
                                                max_tokens=kw.pop("max_tokens", 6), temperature=0, **kw)

    def ids(self, text: str) -> list[int]:
        return self.llm.tokenizer.encode(text, add_special_tokens=False)


@pytest.fixture(scope="module")
def live() -> Iterator[FieldsLive]:
    llm = LLM(default_model_or_skip(), max_batch=8, num_blocks=64)
    with serve_in_thread(llm, NAME) as url:
        yield FieldsLive(url, llm, NAME)


def _error(live: FieldsLive, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(live.url + path, json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    return err


# ------------------------------------------------------------------ honoured
def test_logit_bias_forces_and_bans_tokens(live: FieldsLive) -> None:
    forced = live.ids(" banana")[0]
    r = live.complete(max_tokens=4, logit_bias={str(forced): 100})
    assert r.choices[0].text == live.llm.tokenizer.decode([forced] * 4)
    plain = live.complete()
    first = live.ids(plain.choices[0].text)[0]
    banned = live.complete(logit_bias={str(first): -100})
    assert banned.choices[0].text and live.ids(banned.choices[0].text)[0] != first
    # sampled too: a +100 token has all the probability mass
    r = live.client().completions.create(model=NAME, prompt=PROMPT, max_tokens=3, temperature=1.0, seed=3,
                                         logit_bias={str(forced): 100})
    assert r.choices[0].text == live.llm.tokenizer.decode([forced] * 3)


def test_min_tokens_masks_eos_until_reached(live: FieldsLive) -> None:
    eos = sorted(live.llm.engine.eos_ids)[0]
    early = live.complete(max_tokens=10, logit_bias={str(eos): 100})   # EOS forced: one token, "stop"
    assert early.usage.completion_tokens == 1 and early.choices[0].finish_reason == "stop"
    late = live.complete(max_tokens=10, logit_bias={str(eos): 100}, extra_body={"min_tokens": 3})
    assert late.usage.completion_tokens == 4 and late.choices[0].finish_reason == "stop"  # 3 masked, then EOS
    # the same for a stop token id
    tok = live.ids(" banana")[0]
    r = live.complete(max_tokens=10, logit_bias={str(tok): 100}, extra_body={"stop_token_ids": [tok], "min_tokens": 2})
    assert r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "stop"


def test_stop_token_ids_and_include_stop_str_in_output(live: FieldsLive) -> None:
    tok = live.ids(" banana")[0]
    body = {"logit_bias": {str(tok): 100}, "max_tokens": 5}
    r = live.complete(**body, extra_body={"stop_token_ids": [tok]})
    assert r.choices[0].text == "" and r.usage.completion_tokens == 1 and r.choices[0].finish_reason == "stop"
    r = live.complete(**body, extra_body={"stop_token_ids": [tok], "include_stop_str_in_output": True})
    assert r.choices[0].text == live.llm.tokenizer.decode([tok])
    full = live.complete(max_tokens=12).choices[0].text
    stop = full[6:9]
    cut = full.index(stop)
    assert live.complete(max_tokens=12, stop=[stop]).choices[0].text == full[:cut]
    kept = live.complete(max_tokens=12, stop=[stop], extra_body={"include_stop_str_in_output": True})
    assert kept.choices[0].text == full[:cut + len(stop)]
    streamed = live.client().completions.create(model=NAME, prompt=PROMPT, max_tokens=12, temperature=0,
                                                stop=[stop], stream=True,
                                                extra_body={"include_stop_str_in_output": True})
    assert "".join(c.choices[0].text for c in streamed if c.choices) == full[:cut + len(stop)]


def test_skip_special_tokens(live: FieldsLive) -> None:
    special = live.llm.tokenizer.encode("<|im_start|>", add_special_tokens=False)
    assert len(special) == 1
    body = {"max_tokens": 2, "logit_bias": {str(special[0]): 100}}
    assert live.complete(**body).choices[0].text == ""
    assert live.complete(**body, extra_body={"skip_special_tokens": False}).choices[0].text == "<|im_start|>" * 2


def test_echo(live: FieldsLive) -> None:
    plain = live.complete().choices[0].text
    assert live.complete(echo=True).choices[0].text == PROMPT + plain
    ids = live.llm.tokenizer.encode(PROMPT)
    echoed = live.complete(prompt=ids, echo=True).choices[0].text
    assert echoed == live.llm.tokenizer.decode(ids, skip_special_tokens=False) + plain
    chunks = live.client().completions.create(model=NAME, prompt=PROMPT, max_tokens=6, temperature=0, echo=True,
                                              stream=True)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == PROMPT + plain
    err = _error(live, "/v1/completions", {"model": NAME, "prompt": PROMPT, "echo": True, "logprobs": 1})
    assert err["param"] == "echo"


def test_developer_role_is_system(live: FieldsLive) -> None:
    c = live.client()
    as_system = c.chat.completions.create(model=NAME, messages=CHAT, max_tokens=8, temperature=0)
    dev = [{"role": "developer", "content": CHAT[0]["content"]}, CHAT[1]]
    as_developer = c.chat.completions.create(model=NAME, messages=dev, max_tokens=8, temperature=0)
    assert as_developer.choices[0].message.content == as_system.choices[0].message.content


def test_model_by_id(live: FieldsLive) -> None:
    assert live.client().models.retrieve(NAME).id == NAME
    r = httpx.get(f"{live.url}/v1/models/other-model")
    assert r.status_code == 404
    assert r.json()["error"]["param"] == "model" and r.json()["error"]["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        live.client().models.retrieve("other-model")


# ------------------------------------------------------------------ refused
REFUSED = [
    ("/v1/completions", {"best_of": 2}, "best_of"),
    ("/v1/completions", {"suffix": "!"}, "suffix"),
    ("/v1/completions", {"logit_bias": {"one": 5}}, "logit_bias"),
    ("/v1/completions", {"logit_bias": {"1": 101}}, "logit_bias"),
    ("/v1/completions", {"logit_bias": {"49152": 1}}, "logit_bias"),   # the vocabulary is 49152 tokens
    ("/v1/completions", {"stop_token_ids": [-1]}, "stop_token_ids"),
    ("/v1/completions", {"min_tokens": 9, "max_tokens": 4}, "min_tokens"),
    ("/v1/completions", {"frobnicate": True}, "frobnicate"),
    ("/v1/chat/completions", {"response_format": {"type": "bogus"}}, "response_format.type"),
    ("/v1/chat/completions", {"functions": [{"name": "f", "parameters": {}}]}, "functions"),
    ("/v1/chat/completions", {"function_call": "auto"}, "function_call"),
    ("/v1/chat/completions", {"tool_choice": "required"}, "tool_choice"),  # no tools
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}],
                              "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
    ("/v1/chat/completions", {"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ("/v1/chat/completions", {"web_search_options": {}}, "web_search_options"),
]


@pytest.mark.parametrize("path, extra, param", REFUSED, ids=[p for _, _, p in REFUSED])
def test_refused_fields_are_named(live: FieldsLive, path: str, extra: dict[str, Any], param: str) -> None:
    body = {"model": NAME, "max_tokens": 4, **extra}
    body.update({"messages": CHAT} if "chat" in path else {"prompt": PROMPT})
    err = _error(live, path, body)
    assert err["param"] == param and param.split(".")[0] in err["message"], err


def test_refused_through_the_openai_client(live: FieldsLive) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        live.client().completions.create(model=NAME, prompt=PROMPT, best_of=3, n=1)
    assert e.value.body["param"] == "best_of"
    with pytest.raises(openai.BadRequestError) as e:
        live.client().chat.completions.create(model=NAME, messages=CHAT, extra_body={"guided_json": {}})
    assert e.value.body["param"] == "guided_json"


def test_accepted_and_ignored_fields_change_nothing(live: FieldsLive) -> None:
    c = live.client()
    plain = c.chat.completions.create(model=NAME, messages=CHAT, max_tokens=6, temperature=0)
    ignored = c.chat.completions.create(model=NAME, messages=CHAT, max_tokens=6, temperature=0, user="u1", store=False,
                                        metadata={"k": "v"}, service_tier="auto", prompt_cache_key="pk",
                                        safety_identifier="s")
    assert ignored.choices[0].message.content == plain.choices[0].message.content
    assert live.complete(user="u1", best_of=1).choices[0].text == live.complete().choices[0].text  # best_of = n


def test_tool_history_messages_are_accepted(live: FieldsLive) -> None:
    """A role tool message and an assistant message with tool_calls and null content (what an agent sends back)."""
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                                      "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}]
    r = live.client().chat.completions.create(model=NAME, messages=messages, max_tokens=8, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length") and r.choices[0].message.content
    err = _error(live, "/v1/chat/completions", {"model": NAME, "messages": [{"role": "user", "content": None}]})
    assert err["param"] == "messages.0"
    err = _error(live, "/v1/chat/completions", {"model": NAME, "messages": [{"role": "tool", "content": "x"}]})
    assert err["param"] == "messages.0"
