"""Constrained decoding end to end on the default model (SmolLM2-135M Q4_1, CPU): every completion of a JSON
schema parses and validates with the ``jsonschema`` package, regex outputs ``re.fullmatch`` the pattern, a
choice is one of the options, a GBNF grammar's output matches the equivalent Python regex — greedy and
sampled (temperature 1, several seeds, n = 3 copies of one request). Stop strings and max_new_tokens still
cut a constrained output; forced preemption keeps the grammar state right; unconstrained requests batched
with constrained ones get the same tokens as without them. Bad specs are ValueErrors at admission."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mistral_kernels import LLM, SamplingParams
from mistral_kernels.engine import Engine
from mistral_kernels.structured import Choice, Grammar, JsonObject, JsonSchema, Regex

from .helpers.default_model_files import default_model_or_skip

jsonschema = pytest.importorskip("jsonschema")

# Nested objects, an array of enums, required fields, bounded sizes (so every output completes in the budget).
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "address": {"type": "object",
                    "properties": {"city": {"type": "string", "maxLength": 12},
                                   "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                    "required": ["city", "zip"], "additionalProperties": False},
        "colors": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 3},
    },
    "required": ["name", "age", "address", "colors"],
    "additionalProperties": False,
}
COMPACT = {**SCHEMA, "x-guidance": {"whitespace_flexible": False}}  # no free whitespace: fewer tokens
PROMPT = "Give a person's name, age, address and favourite colours as JSON."


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(default_model_or_skip(), max_batch=8, activations="exact")  # exact activations: the parity / batching invariants under test hold for the exact path


def _valid_json(text: str) -> None:
    jsonschema.validate(json.loads(text), SCHEMA)


def test_json_schema_greedy(llm: LLM) -> None:
    c = llm.generate([PROMPT], SamplingParams(structured=JsonSchema(SCHEMA), max_new_tokens=160), chat=True)[0]
    assert c.finish_reason == "stop", c.text
    _valid_json(c.text)


def test_json_schema_sampled_many_seeds_and_n3(llm: LLM) -> None:
    params = SamplingParams(structured=JsonSchema(COMPACT), temperature=1.0, seed=11, max_new_tokens=160)
    outs = llm.generate([PROMPT] * 4, params, chat=True)  # seeds 11 … 14
    # n = 3: three copies of one checked request (the server's path), each with its own grammar state
    checked = llm.engine.check_request(llm.prompt_ids(PROMPT, chat=True), params.for_choice(7), copies=3)
    rids = [llm.engine.add_checked(checked.for_choice(i)) for i in range(3)]
    outs += llm.engine.run(rids)
    assert len({c.text for c in outs}) > 1  # sampling did vary
    for c in outs:
        assert c.finish_reason == "stop", c.text
        _valid_json(c.text)


def test_json_object_mode(llm: LLM) -> None:
    c = llm.generate(["Describe a cat as JSON."], structured=JsonObject(), max_new_tokens=120, chat=True)[0]
    if c.finish_reason == "stop":
        assert isinstance(json.loads(c.text), dict)
    else:  # a free-form object may outgrow the budget: what came is still the start of an object
        assert c.text.lstrip().startswith("{")


def test_regex_choice_and_grammar(llm: LLM) -> None:
    pattern = r"[A-Z][a-z]{2,8} [0-9]{1,3}"
    gbnf = 'root ::= item ("," item){0,2}\nitem ::= [a-c]{1,3} | "x" [0-9]\n'
    gbnf_re = r"([a-c]{1,3}|x[0-9])(,([a-c]{1,3}|x[0-9])){0,2}"
    lark = 'start: "(" NUM ("+" NUM){0,3} ")"\nNUM: /[1-9][0-9]?/\n'
    cases = [(Regex(pattern), lambda t: re.fullmatch(pattern, t)),
             (Choice(["Paris", "London", "Berlin"]), lambda t: t in ("Paris", "London", "Berlin")),
             (Grammar(gbnf, "gbnf"), lambda t: re.fullmatch(gbnf_re, t)),
             (Grammar(lark, "lark"), lambda t: re.fullmatch(r"\([1-9][0-9]?(\+[1-9][0-9]?){0,3}\)", t))]
    ids = llm.prompt_ids("Answer: the capital of France and a number.", chat=True)
    runs = [(spec, ok, SamplingParams(structured=spec, temperature=t, seed=seed, max_new_tokens=40))
            for spec, ok in cases for t, seed in ((0.0, None), (1.0, 5), (1.0, 6))]
    outs = llm.engine.generate([(ids, params) for _, _, params in runs])  # one continuously batched run
    for (spec, ok, params), c in zip(runs, outs):  # every spec is bounded: each output completes
        assert c.finish_reason == "stop", (spec, c.text)
        assert ok(c.text), (spec, params.temperature, c.text)


def test_stop_string_and_max_new_tokens_cut_a_constrained_output(llm: LLM) -> None:
    spec = JsonSchema(COMPACT)
    c = llm.generate([PROMPT], structured=spec, stop=[","], max_new_tokens=160, chat=True)[0]
    assert (c.finish_reason, c.stop_reason) == ("stop", ",")
    assert c.text.startswith("{") and "," not in c.text
    c = llm.generate([PROMPT], structured=spec, max_new_tokens=5, chat=True)[0]
    assert c.finish_reason == "length" and len(c.token_ids) == 5
    # the 5 tokens are a prefix the grammar accepts
    state = llm.engine.grammars.state(spec)
    assert not any(state.accept(t) for t in c.token_ids) and not state.error


def test_logprobs_are_the_raw_distribution(llm: LLM) -> None:
    """The choice forces one token whose raw log-probability is far from 0: logprobs are before the mask."""
    c = llm.generate(["Say a word."], structured=Choice(["zebra"]), logprobs=1, max_new_tokens=8, chat=True)[0]
    assert c.text == "zebra"
    assert c.logprobs is not None and c.logprobs[0].logprob < -1.0  # masked it would be 0 (probability 1)


def test_forced_preemption_keeps_the_grammar_state(llm: LLM) -> None:
    jobs = [(llm.prompt_ids(p, chat=True), SamplingParams(structured=JsonSchema(COMPACT), max_new_tokens=100))
            for p in (PROMPT, "Invent a person. Reply in JSON.", "A sailor from Brest, as JSON.")]
    roomy = Engine(llm.model, llm.tokenizer, num_blocks=64, block_size=16, max_batch=3)
    # a pool that holds the largest request alone, not all three at once: the newest is preempted, recomputed
    alone = max(-(-(len(ids) + 100) // 16) for ids, _ in jobs)
    tight = Engine(llm.model, llm.tokenizer, num_blocks=alone, block_size=16, max_batch=3)
    want = roomy.generate(jobs)
    got = tight.generate(jobs)
    assert sum(c.num_preemptions for c in got) > 0, "the pool was meant to force a preemption"
    for g, w in zip(got, want):
        assert g.finish_reason == "stop"
        _valid_json(g.text)
        assert g.token_ids == w.token_ids


def test_unconstrained_neighbours_are_untouched(llm: LLM) -> None:
    free = [(llm.prompt_ids(p, chat=True), SamplingParams(max_new_tokens=24))
            for p in ("What is the capital of France?", "Name three fruits.")]
    constrained = (llm.prompt_ids(PROMPT, chat=True), SamplingParams(structured=JsonSchema(COMPACT), max_new_tokens=24))
    alone = Engine(llm.model, llm.tokenizer, num_blocks=64, block_size=16, max_batch=4).generate(free)
    mixed = Engine(llm.model, llm.tokenizer, num_blocks=64, block_size=16, max_batch=4).generate(
        [free[0], constrained, free[1]])
    assert [c.token_ids for c in (mixed[0], mixed[2])] == [c.token_ids for c in alone]
    assert mixed[1].text.startswith("{")


@pytest.mark.parametrize("spec, message", [
    (JsonSchema({"type": "strin"}), "(?s)invalid JSON schema: .*strin"),
    (JsonSchema({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}), "invalid JSON schema"),
    (Regex("a(b"), "(?s)invalid regex: .*unclosed group"),
    (Grammar("start: foo", "lark"), '(?s)invalid grammar: .*unknown name: "foo"'),
    (Grammar('root ::= "a" | bogus', "gbnf"), "GBNF grammar does not convert: Rule 'bogus' not found"),
])
def test_bad_specs_fail_at_admission(llm: LLM, spec: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        llm.generate(["hi"], structured=spec)
    assert not llm.engine.has_unfinished()


def test_structured_needs_a_spec_object() -> None:
    with pytest.raises(ValueError, match="structured must be a JsonObject, JsonSchema"):
        SamplingParams(structured={"type": "object"})  # type: ignore[arg-type]
