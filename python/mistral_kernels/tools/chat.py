"""A chat request's tool setup, shared by ``LLM.chat`` and the server: the prompt with the tools, the sampling
parameters that force a call, and the output parsed into content and calls.

``tool_choice`` (default "auto" with tools, "none" without):

* ``auto``: the tools are in the prompt (:mod:`.prompt`); the output is parsed for calls in the model's format
  (:mod:`.formats`); the model may answer in text instead.
* ``none``: no tools in the prompt, no parsing.
* ``required`` / a function's name: as ``auto`` (every tool in the prompt), and the output is constrained to a
  call (or, with ``parallel``, one or more) of any tool / the named one, whose arguments follow its schema
  (:func:`~.formats.call_grammar`, set as ``SamplingParams.structured``).

Finish reason ``"tool_calls"`` when the output parsed into calls and ended on its own (``"length"`` stays
``"length"``: a cut call is content). Mistral formats open calls with the special token ``[TOOL_CALLS]``, so
a request that parses calls is decoded with special tokens kept.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..sampling_params import SamplingParams
from ..tokenization import Tokenizer
from .formats import ToolFormat, call_grammar, tool_format
from .parsing import ToolStreamParser, parse_tool_calls
from .prompt import chat_prompt_ids
from .spec import ToolCall, ToolDef, resolve_tool_choice

__all__ = ["ChatReply", "ChatTools"]


@dataclass
class ChatReply:
    """One assistant turn: ``content`` (None when it is only calls), the parsed ``tool_calls``, the finish reason
    ("tool_calls" when it called), and the engine's completion (token ids, raw text, timings)."""

    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str = "stop"
    completion: Any = None

    def message(self) -> dict[str, Any]:
        """The OpenAI assistant message (to append to the conversation)."""
        out: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        return out


@dataclass
class ChatTools:
    """``mode`` ("auto" / "none" / "required" / "named"), the tools offered in the prompt (all of them unless
    "none"), those a call may name (the named one for "named"), the model's call format, whether several calls
    may come back."""

    mode: str
    tools: list[ToolDef]
    allowed: list[ToolDef]
    fmt: ToolFormat
    parallel: bool

    @staticmethod
    def make(tok: Tokenizer, tools: Sequence[ToolDef | Mapping[str, Any]] | None, tool_choice: str | None = None,
             parallel: bool = True) -> ChatTools:
        """Raises ValueError (naming ``tools`` or ``tool_choice``) when they do not fit together."""
        defs = [t if isinstance(t, ToolDef) else ToolDef.from_openai(t) for t in tools or []]
        mode, allowed = resolve_tool_choice(defs, tool_choice)
        offered = defs if allowed else []
        return ChatTools(mode, offered, allowed, tool_format(tok) if offered else ToolFormat("hermes"), parallel)

    @property
    def parses(self) -> bool:
        return self.mode != "none"

    def prompt_ids(self, tok: Tokenizer, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        return chat_prompt_ids(tok, messages, self.tools)

    def params(self, params: SamplingParams) -> SamplingParams:
        """``params`` with the call constraint (required / named) and special tokens kept (mistral formats).

        Raises ValueError (naming ``structured``) when ``params`` already constrains the output and a call is
        forced."""
        if not self.parses:
            return params
        changes: dict[str, Any] = {}
        if self.fmt.name != "hermes":
            changes["skip_special_tokens"] = False
        if self.mode in ("required", "named"):
            if getattr(params, "structured", None) is not None:
                raise ValueError("structured: an output constraint cannot be combined with a forced tool call "
                                 "(tool_choice required or a function's name)")
            changes["structured"] = call_grammar(self.fmt, self.allowed, self.parallel)
        return dataclasses.replace(params, **changes)

    def reply(self, text: str, finish_reason: str, completion: Any = None) -> ChatReply:
        """A finished output → content and calls."""
        if not self.parses:
            return ChatReply(text, [], finish_reason, completion)
        parsed = parse_tool_calls(text, self.fmt, parallel=self.parallel)
        if not parsed.calls:
            return ChatReply(text, [], finish_reason, completion)
        return ChatReply(parsed.content, parsed.calls, "tool_calls" if finish_reason == "stop" else finish_reason,
                         completion)

    def stream_parser(self) -> ToolStreamParser | None:
        return ToolStreamParser(self.fmt, parallel=self.parallel) if self.parses else None
