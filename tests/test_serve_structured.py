"""``response_format`` live, with the official ``openai`` client against the server on the default model
(SmolLM2-135M, which left alone answers in prose): json_object and json_schema (nested objects, arrays, enums,
required fields) → every completion parses as JSON (``json.loads``) and validates under the schema
(``jsonschema``, the reference validator), greedy and sampled at temperature 1 over seeds, streaming and not,
``n`` = 3 (json_object: see its test for what a completion cut by the token limit means)."""

from __future__ import annotations

import json
from collections.abc import Iterator
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
MAX_TOKENS = 160
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"type": "string", "enum": ["admin", "user", "guest"]},
        "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                     "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["city", "zip"], "additionalProperties": False},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 1, "maxItems": 3},
    },
    "required": ["name", "age", "role", "address", "tags"],
    "additionalProperties": False,
}
MESSAGES = [{"role": "user", "content": "Describe a user of a web site as JSON."}]
FORMATS = {"json_object": {"type": "json_object"},
           "json_schema": {"type": "json_schema", "json_schema": {"name": "user", "schema": SCHEMA, "strict": True}}}


@pytest.fixture(scope="module")
def client() -> Iterator[openai.OpenAI]:
    llm = LLM(default_model_or_skip(), max_batch=8, num_blocks=128, activations="exact")  # exact activations: the parity / batching invariants under test hold for the exact path
    with serve_in_thread(llm, NAME) as url:
        yield openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)


def _check(text: str, kind: str) -> None:
    value = json.loads(text)
    if kind == "json_object":
        assert isinstance(value, dict), text
    else:
        jsonschema.validate(value, SCHEMA)


def _streamed(stream: Any, n: int) -> tuple[list[str], list[str | None]]:
    texts, finish = [""] * n, [None] * n
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            finish[c.index] = c.finish_reason or finish[c.index]
    return texts, finish


def _runs(client: openai.OpenAI, messages: list[dict[str, str]], fmt: dict[str, Any],
          kw: dict[str, Any]) -> list[tuple[str, str | None]]:
    """(text, finish reason) of n = 3 choices, non-streamed then streamed (the same seed: the same texts)."""
    r = client.chat.completions.create(model=NAME, messages=messages, response_format=fmt, n=3,
                                       max_tokens=MAX_TOKENS, **kw)
    assert len(r.choices) == 3
    texts, finish = _streamed(client.chat.completions.create(
        model=NAME, messages=messages, response_format=fmt, n=3, max_tokens=MAX_TOKENS, stream=True, **kw), 3)
    if kw.get("temperature", 1.0) == 0 or "seed" in kw:
        assert texts == [c.message.content for c in r.choices]
    return [(c.message.content, c.finish_reason) for c in r.choices] + list(zip(texts, finish))


def test_json_schema_every_completion_validates(client: openai.OpenAI) -> None:
    """Every string of the schema is bounded, so every completion ends: all parse and validate, sampled from
    the full distribution (temperature 1) over seeds as well as greedy."""
    for kw in [{"temperature": 0}, {"temperature": 1.0, "seed": 1}, {"temperature": 1.0, "seed": 2}]:
        for text, finish in _runs(client, MESSAGES, FORMATS["json_schema"], kw):
            assert finish == "stop", (kw, text)
            _check(text, "json_schema")


def test_json_object_completions_parse(client: openai.OpenAI) -> None:
    """json_object bounds nothing: sampled at temperature 1, this 135M model sometimes stays inside a string
    until the token limit. So: greedy must end and parse; sampled, every completion that ended parses as an
    object, a cut one is cut by the limit (never ended early, never invalid), and most end."""
    messages = [{"role": "user", "content": 'Give a JSON object like {"fruit": "apple"} for another fruit.'}]
    for text, finish in _runs(client, messages, FORMATS["json_object"], {"temperature": 0}):
        assert finish == "stop"
        _check(text, "json_object")
    ended = 0
    for seed in (1, 2):
        for text, finish in _runs(client, messages, FORMATS["json_object"], {"temperature": 1.0, "seed": seed}):
            assert finish in ("stop", "length"), text
            if finish == "stop":
                _check(text, "json_object")
                ended += 1
            else:
                with pytest.raises(ValueError):
                    json.loads(text)
    assert ended >= 6  # of 12


def test_completions_endpoint_takes_response_format(client: openai.OpenAI) -> None:
    r = client.completions.create(model=NAME, prompt="A user record:", max_tokens=MAX_TOKENS, temperature=1.0, seed=5, n=3,
                                  extra_body={"response_format": FORMATS["json_schema"]})
    for c in r.choices:
        assert c.finish_reason == "stop"
        _check(c.text, "json_schema")


def test_unconstrained_output_is_not_json(client: openai.OpenAI) -> None:
    """The constraint is what makes the outputs above JSON: the same request without it is prose."""
    r = client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=40, temperature=0)
    with pytest.raises(ValueError):
        json.loads(r.choices[0].message.content)


def test_bad_schema_is_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=8, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": 5}}})
    assert e.value.body["param"] == "response_format"
