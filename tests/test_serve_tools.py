"""Tool calling live, with the official ``openai`` client against the server on the default model (SmolLM2,
whose chat template has no tools: the documented fallback prompt and the ``<tool_call>`` format). With
``tool_choice`` "required" or a named function the output is constrained, so every call parses and its
arguments validate under the function's schema (``jsonschema``), greedy and sampled, streaming and not; a full
round trip (call → tool result → final answer); ``auto`` — see its test for what it asserts."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the serve extra is not installed (pip install '.[serve]')")
openai = pytest.importorskip("openai", reason="the test extra is not installed (pip install '.[test]')")
jsonschema = pytest.importorskip("jsonschema", reason="the test extra is not installed (pip install '.[test]')")

from mistral_kernels import LLM  # noqa: E402

from .helpers.default_model_files import default_model_or_skip  # noqa: E402
from .helpers.live_server import serve_in_thread  # noqa: E402

pytestmark = pytest.mark.slow

NAME = "smollm2"
WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "maxLength": 20},
                          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                          "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET", "PST"]}},
        "required": ["zone"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather forecast of a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "The time in a zone",
                                           "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


@dataclass
class Live:
    llm: LLM  # driven by the server's engine thread: not to be called directly
    client: openai.OpenAI


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    llm = LLM(default_model_or_skip(), max_batch=8, num_blocks=128, activations="exact")  # exact activations: the parity / batching invariants under test hold for the exact path
    with serve_in_thread(llm, NAME) as url:
        yield Live(llm, openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0))


def _valid(calls: list[Any], names: set[str]) -> None:
    assert calls
    for c in calls:
        assert c.id.startswith("call_") and c.type == "function" and c.function.name in names
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])


def _stream(stream: Any) -> tuple[str | None, list[dict[str, str]], str | None, list[dict[str, Any]]]:
    """Joined content, calls (id, name, arguments), finish reason, and the raw tool-call deltas."""
    content, calls, finish, deltas = None, [], None, []
    for chunk in stream:
        for c in chunk.choices:
            if c.delta.content:
                content = (content or "") + c.delta.content
            for tc in c.delta.tool_calls or []:
                deltas.append(tc.model_dump(exclude_none=True))
                if tc.index == len(calls):
                    calls.append({"id": tc.id, "name": tc.function.name, "arguments": tc.function.arguments or ""})
                else:
                    calls[tc.index]["arguments"] += tc.function.arguments or ""
            finish = c.finish_reason or finish
    return content, calls, finish, deltas


@pytest.mark.parametrize("choice", ["required", "named"])
def test_forced_calls_always_validate(live: Live, choice: str) -> None:
    """One call (parallel_tool_calls false): the grammar ends after it, so every reply is exactly one valid call
    and finishes "tool_calls"."""
    tool_choice: Any = "required" if choice == "required" else {"type": "function", "function": {"name": "get_time"}}
    names = {"get_weather", "get_time"} if choice == "required" else {"get_time"}
    for kw in [{"temperature": 0}, {"temperature": 1.0, "seed": 1}]:
        body = {"model": NAME, "messages": MESSAGES, "tools": TOOLS, "tool_choice": tool_choice,
                "parallel_tool_calls": False, "max_tokens": 80, **kw}
        r = live.client.chat.completions.create(n=3, **body)
        for c in r.choices:
            assert c.finish_reason == "tool_calls", c.message
            assert len(c.message.tool_calls) == 1
            _valid(c.message.tool_calls, names)
        content, calls, finish, _ = _stream(live.client.chat.completions.create(stream=True, **body))
        assert finish == "tool_calls" and len(calls) == 1
        first = r.choices[0].message  # same seed: choice 0 of the non-streamed request
        assert content == first.content
        assert [(c["name"], c["arguments"]) for c in calls] == \
            [(t.function.name, t.function.arguments) for t in first.tool_calls]


def test_parallel_calls_all_validate(live: Live) -> None:
    """Parallel calls (the default): one or more calls; the model may keep calling until the token limit
    (finish "length"), but every call returned is complete and valid."""
    for kw in [{"temperature": 1.0, "seed": 2}]:
        r = live.client.chat.completions.create(model=NAME, messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                                n=3, max_tokens=60, **kw)
        for c in r.choices:
            assert c.finish_reason in ("tool_calls", "length"), c.message
            _valid(c.message.tool_calls, set(SCHEMAS))


def test_streamed_call_deltas_look_like_openai(live: Live) -> None:
    _, calls, finish, deltas = _stream(live.client.chat.completions.create(
        model=NAME, messages=MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=80, stream=True,
        parallel_tool_calls=False, temperature=0))
    assert finish == "tool_calls"
    first = deltas[0]
    assert first["index"] == 0 and first["id"].startswith("call_") and first["type"] == "function"
    assert first["function"]["name"] == calls[0]["name"]
    assert all("id" not in d for d in deltas[1:2]) and deltas[1]["function"]["arguments"]


def test_round_trip(live: Live) -> None:
    """call (forced) → the tool's result in the history → a final text answer (tool_choice none)."""
    first = live.client.chat.completions.create(
        model=NAME, messages=MESSAGES, tools=TOOLS, max_tokens=80, temperature=0, parallel_tool_calls=False,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    call = first.choices[0].message.tool_calls[0]
    history = MESSAGES + [first.choices[0].message.model_dump(exclude_none=True),
                          {"role": "tool", "tool_call_id": call.id, "content": "18 degrees celsius, sunny"}]
    assert history[1]["content"] is None if "content" in history[1] else True
    final = live.client.chat.completions.create(model=NAME, messages=history, tools=TOOLS, tool_choice="none",
                                                max_tokens=40, temperature=0)
    answer = final.choices[0]
    assert answer.finish_reason in ("stop", "length") and answer.message.tool_calls is None
    assert answer.message.content and answer.message.content.strip()
    # the result reached the prompt: the answer differs from the one without the result in the history
    bare = live.client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=40, temperature=0)
    assert bare.choices[0].message.content != answer.message.content


def test_auto_either_calls_validly_or_answers(live: Live) -> None:
    """auto is not constrained: a 135M model may or may not call. Asserted: the reply is either a text answer
    (no tool_calls, finish stop / length) or calls that parsed (finish tool_calls, known names, arguments a JSON
    object) — never a half-parsed mix; and the streamed reply equals the non-streamed one."""
    for kw in [{"temperature": 0}, {"temperature": 1.0, "seed": 4}]:
        r = live.client.chat.completions.create(model=NAME, messages=MESSAGES, tools=TOOLS, max_tokens=60, **kw)
        m, finish = r.choices[0].message, r.choices[0].finish_reason
        if m.tool_calls:
            assert finish == "tool_calls"
            assert all(isinstance(json.loads(c.function.arguments), dict) for c in m.tool_calls)
        else:
            assert finish in ("stop", "length") and m.content
        content, calls, s_finish, _ = _stream(live.client.chat.completions.create(
            model=NAME, messages=MESSAGES, tools=TOOLS, max_tokens=60, stream=True, **kw))
        assert (content, s_finish) == (m.content, finish)
        assert [(c["name"], c["arguments"]) for c in calls] == \
            [(c.function.name, c.function.arguments) for c in m.tool_calls or []]


def test_llm_chat_returns_parsed_calls() -> None:
    # its own: the server's engine runs in its thread; exact activations as above
    llm = LLM(default_model_or_skip(), max_batch=2, num_blocks=32, activations="exact")
    reply = llm.chat(MESSAGES, tools=TOOLS, tool_choice="get_weather", parallel_tool_calls=False,
                          max_new_tokens=80, temperature=1.0, seed=7)
    assert reply.finish_reason == "tool_calls" and [c.name for c in reply.tool_calls] == ["get_weather"]
    jsonschema.validate(reply.tool_calls[0].parsed_arguments(), WEATHER)
    assert reply.message()["tool_calls"][0]["function"]["name"] == "get_weather"
    plain = llm.chat(MESSAGES, max_new_tokens=8)
    assert plain.tool_calls == [] and plain.content


def test_bad_tool_combinations_are_named(live: Live) -> None:
    with pytest.raises(openai.BadRequestError) as e:  # a forced call and a JSON constraint cannot both hold
        live.client.chat.completions.create(model=NAME, messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                            response_format={"type": "json_object"}, max_tokens=8)
    assert e.value.body["param"] == "response_format"
    with pytest.raises(openai.BadRequestError) as e:  # a parameters schema that does not compile
        live.client.chat.completions.create(
            model=NAME, messages=MESSAGES, tool_choice="required", max_tokens=8,
            tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "strin"}}}])
    assert e.value.body["param"] == "tools"
