"""How a model writes tool calls, and the grammar that forces one.

=================  ===========================================================================================
format             a call in the output
=================  ===========================================================================================
``mistral``        ``[TOOL_CALLS]`` (a special token) then a JSON array ``[{"name": ..., "arguments": {...}}, ...]``
                   — Mistral's v3 / v7 / tekken tokenizers (mistral-common), and HF checkpoints whose
                   vocabulary has the ``[TOOL_CALLS]`` token
``mistral-args``   ``[TOOL_CALLS]name[ARGS]{...}`` per call — mistral-common tokenizers with an ``[ARGS]`` token
                   (v11 and later)
``hermes``         ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` per call — every other
                   tokenizer (Qwen / Hermes templates, and the fallback prompt of :mod:`.prompt`)
=================  ===========================================================================================

:func:`call_grammar` builds the llguidance Lark grammar of "one call (or several, with parallel calls) to one
of these tools, arguments valid under its parameter schema": what ``tool_choice`` "required" and a named
function constrain the output to. Special tokens are written ``<[id]>`` (llguidance's token-id reference).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..structured.spec import Grammar
from ..tokenization import Tokenizer
from .spec import ToolDef

__all__ = ["HERMES_CLOSE", "HERMES_OPEN", "ToolFormat", "call_grammar", "tool_format"]

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
TOOL_CALLS, ARGS = "[TOOL_CALLS]", "[ARGS]"


@dataclass(frozen=True)
class ToolFormat:
    """A model's tool-call format: ``name`` (table above) and the token ids of its special markers."""

    name: str
    tool_calls_id: int | None = None  # mistral formats: the [TOOL_CALLS] token
    args_id: int | None = None        # mistral-args: the [ARGS] token

    @property
    def marker(self) -> str:
        """The text that opens the calls (as decoded with special tokens kept)."""
        return HERMES_OPEN if self.name == "hermes" else TOOL_CALLS


def _special_id(tok: Tokenizer, text: str) -> int | None:
    ids = tok.encode(text, add_special_tokens=False)
    if len(ids) == 1 and tok.decode(ids, skip_special_tokens=False) == text:
        return ids[0]
    raw = getattr(tok, "_raw", None)  # mistral-common: special tokens are not encoded from text
    if raw is not None:
        try:
            found = int(raw.get_special_token(text))
        except (ValueError, KeyError, AttributeError):
            return None
        # SentencePiece kinds answer an unknown name with the unknown token's id
        return found if tok.decode([found], skip_special_tokens=False) == text else None
    return None


def tool_format(tok: Tokenizer) -> ToolFormat:
    """The tool-call format of a tokenizer's model (see the table above)."""
    calls = _special_id(tok, TOOL_CALLS)
    if calls is None:
        return ToolFormat("hermes")
    args = _special_id(tok, ARGS)
    return ToolFormat("mistral-args" if args is not None else "mistral", calls, args)


def _call_schema(tool: ToolDef) -> dict[str, Any]:
    return {"type": "object", "properties": {"name": {"const": tool.name}, "arguments": dict(tool.parameters)},
            "required": ["name", "arguments"], "additionalProperties": False}


# Calls are written as json.dumps writes them (and as mistral-common renders them in prompts): ", " and ": "
# between items, no other whitespace — llguidance's JSON options (``x-guidance``).
_COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _json(schema: dict[str, Any]) -> str:
    return "%json " + json.dumps({**schema, "x-guidance": _COMPACT}, separators=(",", ":"))


def call_grammar(fmt: ToolFormat, tools: Sequence[ToolDef], parallel: bool) -> Grammar:
    """The Lark grammar of one call (or, with ``parallel``, one or more) to one of ``tools`` in ``fmt``."""
    if not tools:
        raise ValueError("call_grammar: no tools")
    if fmt.name == "mistral":  # [TOOL_CALLS] [{...}, {...}] (SentencePiece kinds write " [" after the token)
        schema = _call_schema(tools[0]) if len(tools) == 1 else {"anyOf": [_call_schema(t) for t in tools]}
        more = ' (", " call)*' if parallel else ""
        text = f'start: <[{fmt.tool_calls_id}]> " "? "[" call{more} "]"\ncall: {_json(schema)}\n'
    elif fmt.name == "mistral-args":  # [TOOL_CALLS]name[ARGS]{...} per call
        alts = " | ".join(f'"{t.name}" <[{fmt.args_id}]> {_json(dict(t.parameters))}' for t in tools)
        text = f"start: call{'+' if parallel else ''}\ncall: <[{fmt.tool_calls_id}]> ({alts})\n"
    else:  # <tool_call>{...}</tool_call>, one per line
        schema = _call_schema(tools[0]) if len(tools) == 1 else {"anyOf": [_call_schema(t) for t in tools]}
        more = ' ("\\n" call)*' if parallel else ""
        text = f'start: call{more}\ncall: "{HERMES_OPEN}" {_json(schema)} "{HERMES_CLOSE}"\n'
    return Grammar(text, syntax="lark")
