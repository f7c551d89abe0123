"""The command-line flags of ``SamplingParams.structured``: ``--json-schema FILE``, ``--grammar FILE``,
``--regex PATTERN``, ``--choice TEXT`` (repeatable), ``--json-object``; at most one kind.

A grammar file's syntax is its suffix: ``.gbnf`` → GBNF (llama.cpp), ``.lark`` → llguidance's Lark dialect;
another suffix is refused. Each value is read and validated (:func:`~.grammar.check_spec`) while the flags
are parsed, so a missing file, bad JSON or an invalid schema / pattern / grammar is an argparse error naming
the flag.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from .spec import Choice, Grammar, JsonObject, JsonSchema, Regex, StructuredOutput

__all__ = ["GRAMMAR_SUFFIXES", "add_structured_args", "structured_from_args"]

GRAMMAR_SUFFIXES = {".gbnf": "gbnf", ".lark": "lark"}


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {e}") from None


def _checked(make: Callable[[str], StructuredOutput]) -> Callable[[str], StructuredOutput]:
    def parse(text: str) -> StructuredOutput:
        from .grammar import check_spec

        try:
            spec = make(text)
            check_spec(spec)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return spec
    parse.__name__ = make.__name__
    return parse


def _json_schema(path: str) -> StructuredOutput:
    return JsonSchema(_read(path))


def _grammar(path: str) -> StructuredOutput:
    syntax = GRAMMAR_SUFFIXES.get(Path(path).suffix.lower())
    if syntax is None:
        raise argparse.ArgumentTypeError(f"{path}: the grammar file's suffix says its syntax: "
                                         f"{' or '.join(GRAMMAR_SUFFIXES)}")
    return Grammar(_read(path), syntax)  # type: ignore[arg-type]


def _regex(pattern: str) -> StructuredOutput:
    return Regex(pattern)


def _choice(option: str) -> str:
    if not option:
        raise argparse.ArgumentTypeError("a choice must be a non-empty string")
    return option


def add_structured_args(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The structured-output flags (mutually exclusive); :func:`structured_from_args` reads them."""
    g = parser.add_mutually_exclusive_group()
    g.add_argument("--json-schema", dest="structured_json_schema", metavar="FILE", type=_checked(_json_schema),
                   help="constrain the output to JSON valid under the JSON schema in FILE")
    g.add_argument("--grammar", dest="structured_grammar", metavar="FILE", type=_checked(_grammar),
                   help="constrain the output to the grammar in FILE: .gbnf = llama.cpp GBNF (rule root), "
                        ".lark = llguidance Lark (rule start)")
    g.add_argument("--regex", dest="structured_regex", metavar="PATTERN", type=_checked(_regex),
                   help="constrain the output to match PATTERN in full")
    g.add_argument("--choice", dest="structured_choice", metavar="TEXT", action="append", type=_choice,
                   help="constrain the output to exactly one of these strings (repeatable)")
    g.add_argument("--json-object", dest="structured_json_object", action="store_true",
                   help="constrain the output to a JSON object")


def structured_from_args(args: argparse.Namespace) -> StructuredOutput | None:
    """The spec of parsed flags (those of :func:`add_structured_args`), None without one."""
    if getattr(args, "structured_json_object", False):
        return JsonObject()
    if getattr(args, "structured_choice", None):
        return Choice(args.structured_choice)
    for name in ("structured_json_schema", "structured_grammar", "structured_regex"):
        spec = getattr(args, name, None)
        if spec is not None:
            return spec
    return None
