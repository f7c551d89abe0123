"""Every surface offers every sampling field: ``LLM.generate`` / ``LLM.stream``, the ``generate`` flags and the
server's request bodies. Each surface's set of fields is derived from the surface itself (its signature and
what reaches the engine, its parser's flags, its pydantic fields) and compared to
``dataclasses.fields(SamplingParams)``; then a non-default value of each field is sent through each surface and
must arrive in the engine's SamplingParams. A deliberately reduced surface (the keyword list ``LLM.generate``
had before it took ``**overrides``, a parser missing a flag) is caught."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import pytest

from mistral_kernels.cli import build_parser
from mistral_kernels.dataclass_cli import add_fields, field_flags
from mistral_kernels.llm import LLM
from mistral_kernels.sampling_params import SamplingParams
from mistral_kernels.structured import JsonSchema, Regex
from mistral_kernels.structured.cli import add_structured_args

from .helpers.engine import CharTokenizer, ToyModel

FIELDS = {f.name for f in dataclasses.fields(SamplingParams)}

# A valid, non-default value of every field (a new field must be added here: the first test says so).
VALUES: dict[str, Any] = {
    "max_new_tokens": 7, "temperature": 0.5, "top_k": 3, "top_p": 0.5, "min_p": 0.1, "repetition_penalty": 1.3,
    "presence_penalty": 0.5, "frequency_penalty": -0.25, "seed": 11, "stop": ("xy",), "stop_token_ids": (5, 6),
    "ignore_eos": True, "logprobs": 2, "logit_bias": ((5, -100.0), (9, 2.5)), "min_tokens": 2,
    "include_stop_str_in_output": True, "skip_special_tokens": False,
    "structured": Regex("[ab]+")}
# How each surface spells a value where str() / the body's JSON does not (the rest: str(value), the value)
CLI_TEXT: dict[str, Any] = {"logit_bias": lambda v: [f"{t}={b}" for t, b in v]}
BODY_VALUE: dict[str, Any] = {"logit_bias": lambda v: {str(t): b for t, b in v}}
# The server carries `structured` as response_format (JSON only): the value it sends and the spec it expects.
SERVED_AS: dict[str, tuple[Any, Any]] = {"structured": (
    {"type": "json_object"}, JsonSchema({"type": "object", "x-guidance": {
        "whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}}))}


def _same_as_sampling_params(surface: str, derived: set[str]) -> None:
    missing, extra = sorted(FIELDS - derived), sorted(derived - FIELDS)
    assert not missing and not extra, f"{surface}: lacks SamplingParams fields {missing}, has unknown {extra}"


def test_the_value_table_covers_every_field() -> None:
    assert set(VALUES) == FIELDS
    for name, value in VALUES.items():
        assert getattr(SamplingParams(**{name: value}), name) != getattr(SamplingParams(), name), name


# ------------------------------------------------------------------ LLM.generate / LLM.stream
def _toy_llm() -> LLM:
    llm = LLM.__new__(LLM)  # no checkpoint: generate / stream use only the tokenizer and the engine
    llm.tokenizer = CharTokenizer()
    from mistral_kernels.engine import Engine

    llm.engine = Engine(ToyModel(), CharTokenizer(), num_blocks=64, block_size=4, max_batch=2)
    return llm


def _generate_fields(generate: Callable[..., Any]) -> set[str]:
    """The sampling fields a generate-like callable takes: its explicit keyword parameters, or, when it takes
    ``**overrides``, each field that is accepted and reaches the engine's request unchanged."""
    sig = inspect.signature(generate)
    if not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        return {n for n, p in sig.parameters.items() if p.kind is p.KEYWORD_ONLY} - {"chat", "system"}
    taken = set()
    for name, value in VALUES.items():
        seen: list[SamplingParams] = []
        real = generate.__self__.engine.generate  # type: ignore[attr-defined]

        def spy(requests: Any, **kw: Any) -> Any:
            seen.extend(p for _, p in requests)
            return real(requests, **kw)

        generate.__self__.engine.generate = spy  # type: ignore[attr-defined]
        try:
            generate(["abc"], **{name: value})
        finally:
            del generate.__self__.engine.generate  # type: ignore[attr-defined]
        if seen and getattr(seen[0], name) == value:
            taken.add(name)
    return taken


def test_llm_generate_offers_every_field() -> None:
    _same_as_sampling_params("LLM.generate", _generate_fields(_toy_llm().generate))


def test_a_reduced_generate_signature_is_caught() -> None:
    def old_generate(prompts: list[str], *, max_new_tokens: int = 128, temperature: float = 0.0, top_k: int = 0,
                     top_p: float = 1.0, min_p: float = 0.0, repetition_penalty: float = 1.0,
                     seed: int | None = None, stop: Any = None, ignore_eos: bool = False, chat: bool = False,
                     system: str | None = None, logprobs: int | None = None) -> None:
        """LLM.generate's keywords before it took ``params`` / ``**overrides``."""

    with pytest.raises(AssertionError, match=r"lacks SamplingParams fields \['frequency_penalty', .*"
                                             r"'presence_penalty', .*'stop_token_ids'"):
        _same_as_sampling_params("old LLM.generate", _generate_fields(old_generate))


def test_llm_stream_takes_params_and_overrides() -> None:
    llm = _toy_llm()
    seen: list[SamplingParams] = []
    real = llm.engine.add_request
    llm.engine.add_request = lambda ids, params: (seen.append(params), real(ids, params))[1]  # type: ignore
    text = "".join(llm.stream("abc", SamplingParams(max_new_tokens=3, ignore_eos=True), stop_token_ids=(4,)))
    assert seen == [SamplingParams(max_new_tokens=3, ignore_eos=True, stop_token_ids=(4,))]
    assert text == llm.last_completion.text
    with pytest.raises(TypeError, match=r"unknown sampling parameter\(s\) \['max_tokens'\]"):
        next(llm.stream("abc", max_tokens=3))
    with pytest.raises(TypeError, match="params must be a SamplingParams"):
        llm.generate(["abc"], {"max_new_tokens": 3})  # type: ignore[arg-type]


# ------------------------------------------------------------------ the generate flags
def _cli_fields(parser: argparse.ArgumentParser) -> set[str]:
    """The SamplingParams fields a parser has a flag for (by the flag's name, not its dest)."""
    flags = {s for a in parser._actions for s in a.option_strings}
    return {name for name, flag in field_flags(SamplingParams).items() if flag in flags}


def _generate_parser() -> argparse.ArgumentParser:
    sub = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)][0]
    return sub.choices["generate"]


def test_cli_offers_every_field_and_passes_each_value() -> None:
    parser = _generate_parser()
    _same_as_sampling_params("mistral-kernels generate", _cli_fields(parser))
    flags = field_flags(SamplingParams)
    for name, value in VALUES.items():
        if name == "structured":  # its own flags, one per kind of spec (mistral_kernels.structured.cli)
            argv = ["--regex", value.pattern]
        elif name in CLI_TEXT:
            argv = [x for text in CLI_TEXT[name](value) for x in (flags[name], text)]
        elif isinstance(value, bool):
            argv = [flags[name]] if value else [f"--no-{flags[name][2:]}"]
        elif isinstance(value, tuple):
            argv = [x for v in value for x in (flags[name], str(v))]
        else:
            argv = [flags[name], str(value)]
        params = SamplingParams.from_cli_args(parser.parse_args(argv))
        assert params == SamplingParams(**{name: value}), name


def test_a_parser_missing_a_flag_is_caught() -> None:
    parser = argparse.ArgumentParser()
    add_fields(parser, SamplingParams, only=FIELDS - {"seed", "structured"})
    add_structured_args(parser)
    with pytest.raises(AssertionError, match=r"lacks SamplingParams fields \['seed'\]"):
        _same_as_sampling_params("reduced parser", _cli_fields(parser))


def test_cli_checks_each_value_with_the_dataclass_rules(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in [(["--top-p", "0"], "argument --top-p: top_p must be in (0, 1]"),
                          (["--presence-penalty", "3"], "argument --presence-penalty: presence_penalty must be in"),
                          (["--logprobs", "21"], "argument --logprobs: logprobs must be None or in [0, 20]"),
                          (["--stop", ""], "argument --stop: stop strings must be non-empty"),
                          (["--top-k", "x"], "argument --top-k: invalid int value: 'x'")]:
        with pytest.raises(SystemExit):
            _generate_parser().parse_args(argv)
        assert message in capsys.readouterr().err, argv


# ------------------------------------------------------------------ the server's request bodies
serve = pytest.importorskip("mistral_kernels.serve.protocol", reason="the serve extra is not installed")


def _server_fields(model: type) -> set[str]:
    """The SamplingParams fields a request model carries: its pydantic fields, named as SamplingParams names
    them (the model's ``param_names`` says where the body's name differs)."""
    to_sampling = {body: name for name, body in model.param_names.items()}
    return {to_sampling.get(f, f) for f in model.model_fields} & FIELDS


def _body_values(model: type, name: str, value: Any) -> dict[str, Any]:
    """How a client sends ``name = value`` to this endpoint."""
    if name == "logprobs" and model is serve.ChatCompletionRequest:
        return {"logprobs": True, "top_logprobs": value}
    if name in BODY_VALUE:
        value = BODY_VALUE[name](value)
    elif isinstance(value, tuple):
        value = list(value)
    return {model.param_names.get(name, name): value}


@pytest.mark.parametrize("model", ["ChatCompletionRequest", "CompletionRequest"])
def test_server_offers_every_field_and_passes_each_value(model: str) -> None:
    cls = getattr(serve, model)
    _same_as_sampling_params(model, _server_fields(cls))
    base = {"model": "m", "messages": [{"role": "user", "content": "hi"}]} if "Chat" in model \
        else {"model": "m", "prompt": "hi"}
    defaults = cls(**base).to_sampling_params()
    for name, value in VALUES.items():
        if name in SERVED_AS:
            value, expect = SERVED_AS[name]
            params = cls(**base, **_body_values(cls, name, value)).to_sampling_params()
            assert params == dataclasses.replace(defaults, **{name: expect}), name
            continue
        params = cls(**base, **_body_values(cls, name, value)).to_sampling_params()
        assert params == dataclasses.replace(defaults, **{name: value}), name


def test_a_request_model_missing_a_field_is_caught() -> None:
    import pydantic

    fields = {n: (f.annotation, f) for n, f in serve.CompletionRequest.model_fields.items()
              if n != "repetition_penalty"}  # the completions body as it was before it had the field
    reduced = pydantic.create_model("Reduced", **fields)
    reduced.param_names = serve.CompletionRequest.param_names
    with pytest.raises(AssertionError, match=r"lacks SamplingParams fields \['repetition_penalty'\]"):
        _same_as_sampling_params("reduced server", _server_fields(reduced))


def test_server_errors_name_the_body_field() -> None:
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    for body, param in [({"max_tokens": 0}, "max_tokens"), ({"max_completion_tokens": 0}, "max_completion_tokens"),
                        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"), ({"seed": 2**70}, "seed"),
                        ({"repetition_penalty": 0}, "repetition_penalty"), ({"stop": [""]}, "stop")]:
        with pytest.raises(serve.InvalidField) as e:
            serve.ChatCompletionRequest(**chat, **body).to_sampling_params()
        assert e.value.param == param and str(e.value).startswith(param + ": "), (body, str(e.value))
    with pytest.raises(serve.InvalidField) as e:
        serve.CompletionRequest(model="m", prompt="x", logprobs=21).to_sampling_params()
    assert e.value.param == "logprobs"
