"""What a request may constrain its output to: the structured-output specs (plain, frozen data).

A spec says *what* the output must match; compiling it against a tokenizer's vocabulary and matching
tokens is the grammar backend's job (llguidance). Every surface builds these: ``SamplingParams.structured``
in the library, ``--json-schema`` / ``--grammar`` / ``--regex`` / ``--choice`` on the command line, and the
server's ``response_format`` and forced tool calls.

========================  ==============================================================================
spec                      the output is
========================  ==============================================================================
``JsonObject()``          any JSON object (OpenAI's ``response_format: {"type": "json_object"}``)
``JsonSchema(schema)``    a JSON value valid under ``schema`` (a dict, or its JSON text)
``Regex(pattern)``        a string matching ``pattern`` in full
``Choice(options)``       exactly one of the strings in ``options``
``Grammar(text, syntax)`` a sentence of a grammar: ``syntax`` "lark" (llguidance's Lark dialect) or
                          "gbnf" (llama.cpp's GBNF)
========================  ==============================================================================

Example: ``SamplingParams(structured=JsonSchema({"type": "object", "properties": {"x": {"type":
"integer"}}, "required": ["x"]}))`` makes every completion parse as JSON with an integer ``x``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, Union

__all__ = ["Choice", "Grammar", "JsonObject", "JsonSchema", "Regex", "StructuredOutput"]


@dataclass(frozen=True)
class JsonObject:
    """Any JSON object."""


@dataclass(frozen=True)
class JsonSchema:
    """A JSON value valid under ``schema``; stored as compact JSON text in the given key order (hashable: the
    compiled-grammar cache key). Object properties are generated in the schema's order."""

    schema: str

    def __init__(self, schema: dict[str, Any] | str) -> None:
        if isinstance(schema, str):
            try:
                parsed = json.loads(schema)
            except json.JSONDecodeError as e:
                raise ValueError(f"structured: the JSON schema is not valid JSON ({e})") from None
        elif isinstance(schema, dict):
            parsed = schema
        else:
            raise TypeError(f"structured: JsonSchema takes a dict or its JSON text, got {type(schema).__name__}")
        if not isinstance(parsed, dict):
            raise ValueError(f"structured: a JSON schema must be an object, got {type(parsed).__name__}")
        object.__setattr__(self, "schema", json.dumps(parsed, separators=(",", ":")))

    def as_dict(self) -> dict[str, Any]:
        return json.loads(self.schema)


@dataclass(frozen=True)
class Regex:
    """A string matching ``pattern`` in full."""

    pattern: str

    def __post_init__(self) -> None:
        if not isinstance(self.pattern, str) or not self.pattern:
            raise ValueError("structured: Regex needs a non-empty pattern string")


@dataclass(frozen=True)
class Choice:
    """Exactly one of ``options`` (non-empty strings)."""

    options: tuple[str, ...]

    def __init__(self, options: tuple[str, ...] | list[str]) -> None:
        if isinstance(options, str) or not all(isinstance(o, str) and o for o in options) or not options:
            raise ValueError("structured: Choice needs a non-empty list of non-empty strings")
        object.__setattr__(self, "options", tuple(options))


@dataclass(frozen=True)
class Grammar:
    """A sentence of a grammar written in ``syntax`` ("lark" or "gbnf")."""

    text: str
    syntax: Literal["lark", "gbnf"] = "gbnf"

    def __post_init__(self) -> None:
        if self.syntax not in ("lark", "gbnf"):
            raise ValueError(f"structured: Grammar syntax must be 'lark' or 'gbnf', got {self.syntax!r}")
        if not isinstance(self.text, str) or not self.text.strip():
            raise ValueError("structured: Grammar needs a non-empty grammar text")


StructuredOutput = Union[JsonObject, JsonSchema, Regex, Choice, Grammar]
