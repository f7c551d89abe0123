"""Tool calls parsed out of a model's output text (special tokens kept), whole or while it streams.

:func:`parse_tool_calls` splits a finished output into its content (the text before the first call marker;
None when empty) and its calls, in the formats of :mod:`.formats`. Output that opens a call but does not
parse as one (a cut or malformed call) is all content, with no calls: nothing is guessed. ``arguments`` is the
call's arguments object re-serialized (``json.dumps``, non-ASCII kept).

:class:`ToolStreamParser` does the same piece by piece for streaming: text before a marker goes out as
content as soon as it cannot be the start of a marker; a call goes out when its JSON is complete, as two
deltas (OpenAI's shape: the first with ``id``, ``type`` and ``function.name``, then ``function.arguments``).
The deltas of a stream join to exactly what :func:`parse_tool_calls` gives for the whole text
(tests/test_tools_parsing.py). Example (hermes)::

    pieces  "Sure", " <tool", "_call>{\\"name\\": \\"f\\", \\"arguments\\": {}}</tool_call>"
    deltas  content "Sure", content " " (held "<tool" until it is known), call 0 {id, name "f"},
            call 0 {arguments "{}"}
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .formats import ARGS, HERMES_CLOSE, ToolFormat
from .spec import ToolCall, new_call_id

__all__ = ["ParsedOutput", "ToolStreamParser", "parse_tool_calls"]

_DECODER = json.JSONDecoder()


@dataclass
class ParsedOutput:
    content: str | None
    calls: list[ToolCall] = field(default_factory=list)


def _ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _call(obj: Any) -> tuple[str, str] | None:
    """{"name": str, "arguments": object (or its JSON text)} → (name, arguments JSON); None otherwise."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return obj["name"], json.dumps(args, ensure_ascii=False)


def _scan(fmt: ToolFormat, region: str) -> tuple[list[tuple[str, str]], bool, bool]:
    """Calls complete in ``region`` (the text from the first marker on), whether the region is all calls
    (nothing left over), and whether what follows the last complete call may still become more calls."""
    calls: list[tuple[str, str]] = []
    marker = fmt.marker
    i = 0
    while True:
        i = _ws(region, i)
        if i == len(region):
            return calls, True, True
        if not region.startswith(marker, i):
            return calls, False, marker.startswith(region[i:])
        j = _ws(region, i + len(marker))
        if fmt.name == "mistral-args":
            k = region.find(ARGS, j)
            if k < 0:
                return calls, False, True
            name, j = region[j:k].strip(), _ws(region, k + len(ARGS))
            try:
                args, end = _DECODER.raw_decode(region, j)
            except json.JSONDecodeError:
                return calls, False, True
            parsed = _call({"name": name, "arguments": args})
            if parsed is None:
                return calls, False, False
            calls.append(parsed)
            i = end
        elif fmt.name == "mistral":
            try:
                value, end = _DECODER.raw_decode(region, j)
            except json.JSONDecodeError:
                return calls, False, True
            items = value if isinstance(value, list) else [value]
            parsed_items = [_call(v) for v in items]
            if not items or any(p is None for p in parsed_items):
                return calls, False, False
            calls += [p for p in parsed_items if p is not None]
            i = end
        else:
            try:
                value, end = _DECODER.raw_decode(region, j)
            except json.JSONDecodeError:
                return calls, False, True
            end = _ws(region, end)
            parsed = _call(value)
            if parsed is None:
                return calls, False, False
            if not region.startswith(HERMES_CLOSE, end):
                return calls, False, HERMES_CLOSE.startswith(region[end:])
            calls.append(parsed)
            i = end + len(HERMES_CLOSE)


def parse_tool_calls(text: str, fmt: ToolFormat, *, parallel: bool = True,
                     new_id: Callable[[], str] = new_call_id) -> ParsedOutput:
    """A finished output → its content and calls (``parallel=False``: the first call only). With at least
    one complete call after the first marker, text after the last complete call is dropped."""
    start = text.find(fmt.marker)
    if start < 0:
        return ParsedOutput(text or None)
    calls, _, _ = _scan(fmt, text[start:])
    if not calls:
        return ParsedOutput(text or None)
    if not parallel:
        calls = calls[:1]
    return ParsedOutput(text[:start] if text[:start].strip() else None,
                        [ToolCall(new_id(), n, a) for n, a in calls])


def _held(text: str, marker: str) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of ``marker`` (it may become one)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class ToolStreamParser:
    """Streaming counterpart of :func:`parse_tool_calls`: :meth:`push` each text piece, :meth:`finish` once;
    each returns OpenAI chat delta fields: ``{"content": str}`` and / or ``{"tool_calls": [...]}``."""

    def __init__(self, fmt: ToolFormat, *, parallel: bool = True, new_id: Callable[[], str] = new_call_id) -> None:
        self.fmt, self.parallel, self._new_id = fmt, parallel, new_id
        self.text = ""
        self._content_out = 0       # text[:_content_out] went out as content
        self._calls_out = 0         # calls sent
        self.ids: list[str] = []

    @property
    def called(self) -> bool:
        """At least one call went out (the finish reason is then "tool_calls")."""
        return self._calls_out > 0

    def push(self, piece: str) -> list[dict[str, Any]]:
        self.text += piece
        return self._deltas(final=False)

    def finish(self) -> list[dict[str, Any]]:
        return self._deltas(final=True)

    def _call_deltas(self, calls: list[tuple[str, str]]) -> list[dict[str, Any]]:
        out = []
        limit = len(calls) if self.parallel else min(len(calls), 1)
        for k in range(self._calls_out, limit):
            name, args = calls[k]
            self.ids.append(self._new_id())
            out.append({"tool_calls": [{"index": k, "id": self.ids[k], "type": "function",
                                        "function": {"name": name, "arguments": ""}}]})
            out.append({"tool_calls": [{"index": k, "function": {"arguments": args}}]})
        self._calls_out = max(self._calls_out, limit)
        return out

    def _content(self, upto: int) -> list[dict[str, Any]]:
        if upto <= self._content_out:
            return []
        piece = self.text[self._content_out:upto]
        self._content_out = upto
        return [{"content": piece}]

    def _lead(self, start: int) -> list[dict[str, Any]]:
        """Content before the first marker; held while it is only whitespace (None content if a call follows)."""
        if self._content_out == 0 and not self.text[:start].strip():
            return []
        return self._content(start)

    def _deltas(self, final: bool) -> list[dict[str, Any]]:
        text, marker = self.text, self.fmt.marker
        start = text.find(marker)
        if start < 0:
            return self._content(len(text)) if final else self._lead(len(text) - _held(text, marker))
        if self._calls_out:
            calls, _, _ = _scan(self.fmt, text[start:])
            return self._call_deltas(calls)
        calls, _, may_grow = _scan(self.fmt, text[start:])
        if calls:
            return self._lead(start) + self._call_deltas(calls)
        if final or not may_grow:  # the marker opened no call: all content (more text may follow)
            return self._content(len(text))
        return self._lead(start)
