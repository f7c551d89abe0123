"""Specs → llguidance grammars: the grammar text of a spec, its validation, and the compiled grammars of one
vocabulary (an LRU cache of matchers in their start state; each request gets a copy).

A bad spec is a ``ValueError`` carrying llguidance's own validation message (what is wrong and where), raised
when the request is made (:func:`check_spec`, e.g. by the ``generate`` flags) or admitted
(:meth:`GrammarCompiler.compile`, called by ``Engine.check_request``) — never during generation.

GBNF (llama.cpp's grammar syntax, rule ``root``) is converted to llguidance's Lark dialect by llguidance's own
converter; Lark grammars start at rule ``start``. JSON schemas compile with llguidance's defaults: the
output is compact-or-spaced JSON (flexible whitespace), and keywords it does not implement are refused.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Collection
from functools import lru_cache

import llguidance
from llguidance.gbnf_to_lark import gbnf_to_lark

from ..tokenization import Tokenizer
from .matcher import GrammarState
from .spec import Choice, Grammar, JsonObject, JsonSchema, Regex, StructuredOutput
from .vocab import grammar_vocabulary

__all__ = ["GrammarCompiler", "check_spec", "grammar_text"]


def _what(spec: StructuredOutput) -> str:
    return {JsonObject: "JSON object", JsonSchema: "JSON schema", Regex: "regex", Choice: "choice",
            Grammar: "grammar"}[type(spec)]


@lru_cache(maxsize=256)
def grammar_text(spec: StructuredOutput) -> str:
    """The llguidance grammar of ``spec`` (not yet validated, except a GBNF grammar's conversion).

    Raises
    ------
    ValueError
        A GBNF grammar that does not convert (the message says where); TypeError for a non-spec.
    """
    if isinstance(spec, JsonObject):
        return llguidance.LLMatcher.grammar_from_json_schema('{"type": "object"}')
    if isinstance(spec, JsonSchema):
        return llguidance.LLMatcher.grammar_from_json_schema(spec.schema)
    if isinstance(spec, Regex):
        return llguidance.LLMatcher.grammar_from_regex(spec.pattern)
    if isinstance(spec, Choice):
        return llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(o) for o in spec.options))
    if isinstance(spec, Grammar):
        text = spec.text
        if spec.syntax == "gbnf":
            try:
                text = gbnf_to_lark(text)
            except Exception as e:  # the converter raises plain Exceptions with the position in the message
                raise ValueError(f"structured: the GBNF grammar does not convert: {e}") from None
        return llguidance.LLMatcher.grammar_from_lark(text)
    raise TypeError(f"structured: expected JsonObject, JsonSchema, Regex, Choice or Grammar, got "
                    f"{type(spec).__name__}")


def _validate(spec: StructuredOutput, vocab: llguidance.LLTokenizer | None) -> str:
    grammar = grammar_text(spec)
    error = llguidance.LLMatcher.validate_grammar(grammar, vocab)
    if error:
        raise ValueError(f"structured: invalid {_what(spec)}: {error.strip()}")
    return grammar


@lru_cache(maxsize=256)
def check_spec(spec: StructuredOutput) -> None:
    """Validate ``spec`` without a vocabulary (cached). Raises ValueError with llguidance's message."""
    _validate(spec, None)


class GrammarCompiler:
    """The compiled grammars of one engine's vocabulary: ``capacity`` specs kept (least recently used dropped).

    The vocabulary (:func:`~.vocab.grammar_vocabulary`) is built on the first constrained request. Thread-safe:
    the server checks requests off the engine thread.
    """

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_ids: Collection[int], capacity: int = 64) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_ids = tuple(sorted(eos_ids))
        self.capacity = capacity
        self._compiled: OrderedDict[StructuredOutput, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def vocabulary(self) -> llguidance.LLTokenizer:
        return grammar_vocabulary(self.tokenizer, self.vocab_size, self.eos_ids)

    def compile(self, spec: StructuredOutput) -> llguidance.LLMatcher:
        """The start-state matcher of ``spec`` (cached; copy it, never advance it).

        Raises
        ------
        ValueError
            The spec is invalid (llguidance's message: what is wrong and where).
        """
        with self._lock:
            hit = self._compiled.get(spec)
            if hit is not None:
                self._compiled.move_to_end(spec)
                return hit
        vocab = self.vocabulary
        grammar = _validate(spec, vocab)
        matcher = llguidance.LLMatcher(vocab, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(f"structured: invalid {_what(spec)}: {matcher.get_error().strip()}")
        with self._lock:
            self._compiled[spec] = matcher
            while len(self._compiled) > self.capacity:
                self._compiled.popitem(last=False)
        return matcher

    def state(self, spec: StructuredOutput) -> GrammarState:
        """A fresh matcher for one request (its own state; copies of one request each get their own)."""
        return GrammarState(self.compile(spec).deep_copy(), self.vocab_size)
