"""Tool-call parsing on hand-written model outputs, one set per format (mistral, mistral-args, hermes): the
calls and the content a finished output gives, and the streamed deltas of every way of cutting the output into
pieces joining to the same content and calls. Expected values are written out by hand from the formats (the
table in mistral_kernels/tools/formats.py), not produced by the parser."""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

import pytest

from mistral_kernels.tools import ToolFormat, ToolStreamParser, parse_tool_calls

MISTRAL = ToolFormat("mistral", 5)
ARGS = ToolFormat("mistral-args", 5, 32)
HERMES = ToolFormat("hermes")

# (format, output text, expected content, expected [(name, arguments object)])
CASES: list[tuple[ToolFormat, str, str | None, list[tuple[str, dict[str, Any]]]]] = [
    (MISTRAL, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}]', None,
     [("get_weather", {"city": "Paris", "unit": "c"})]),
    (MISTRAL, ' [TOOL_CALLS] [{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": [1, 2]}}]', None,
     [("a", {}), ("b", {"x": [1, 2]})]),
    (MISTRAL, 'Let me check. [TOOL_CALLS][{"name": "f", "arguments": {"q": "é \\"quoted\\" ]"}}]', "Let me check. ",
     [("f", {"q": 'é "quoted" ]'})]),
    (MISTRAL, 'Paris is sunny today.', "Paris is sunny today.", []),
    (MISTRAL, 'Broken [TOOL_CALLS][{"name": "f", "arguments": {"q": ', 'Broken [TOOL_CALLS][{"name": "f", "arguments": {"q": ', []),
    (MISTRAL, '[TOOL_CALLS][{"nom": "f"}]', '[TOOL_CALLS][{"nom": "f"}]', []),
    (ARGS, '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}', None,
     [("get_weather", {"city": "Paris"}), ("get_time", {})]),
    (HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', None,
     [("get_weather", {"city": "Paris"})]),
    (HERMES, 'Sure. <tool_call>{"name": "a", "arguments": {"n": 1}}</tool_call>\n<tool_call>{"name": "b", '
             '"arguments": {}}</tool_call>', "Sure. ", [("a", {"n": 1}), ("b", {})]),
    (HERMES, 'A <tool_call> is how I call tools.', 'A <tool_call> is how I call tools.', []),
    (HERMES, 'x < y and <tool', 'x < y and <tool', []),
]


def _joined(deltas: list[dict[str, Any]]) -> tuple[str | None, list[tuple[str, str]], list[str]]:
    """Stream deltas → (content, [(name, arguments text)], ids), joined as an OpenAI client does."""
    content, calls, ids = None, [], []
    for d in deltas:
        if "content" in d:
            content = (content or "") + d["content"]
        for tc in d.get("tool_calls", []):
            if tc["index"] == len(calls):
                assert tc["id"].startswith("call_") and tc["type"] == "function" and tc["function"]["arguments"] == ""
                calls.append([tc["function"]["name"], ""])
                ids.append(tc["id"])
            else:
                assert "id" not in tc and tc["index"] == len(calls) - 1
                calls[tc["index"]][1] += tc["function"]["arguments"]
    return content, [(n, a) for n, a in calls], ids


def _stream(fmt: ToolFormat, pieces: list[str], parallel: bool = True) -> list[dict[str, Any]]:
    p = ToolStreamParser(fmt, parallel=parallel)
    out = [d for piece in pieces for d in p.push(piece)]
    return out + p.finish()


@pytest.mark.parametrize("case", range(len(CASES)))
def test_finished_output(case: int) -> None:
    fmt, text, content, calls = CASES[case]
    parsed = parse_tool_calls(text, fmt)
    assert parsed.content == content
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == calls
    assert all(c.id.startswith("call_") and len(c.id) == 29 for c in parsed.calls)
    assert len({c.id for c in parsed.calls}) == len(calls)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_streamed_deltas_join_to_the_finished_parse(case: int) -> None:
    fmt, text, _, _ = CASES[case]
    whole = parse_tool_calls(text, fmt)
    expect = (whole.content, [(c.name, c.arguments) for c in whole.calls])
    rng = random.Random(case)
    cuts_list = [[], list(range(1, len(text)))]  # one piece; one character per piece
    cuts_list += [sorted(rng.sample(range(1, len(text)), min(len(text) - 1, k))) for k in (2, 5, 11) for _ in range(4)]
    for cuts in cuts_list:
        pieces = [text[a:b] for a, b in itertools.pairwise([0, *cuts, len(text)])]
        content, calls, _ = _joined(_stream(fmt, pieces))
        assert (content, calls) == expect, pieces


def test_content_streams_before_the_calls_finish() -> None:
    # the content is out as soon as it cannot begin the marker; the call only once its JSON is complete
    p = ToolStreamParser(HERMES)
    assert p.push("Sure") == [{"content": "Sure"}]
    assert p.push(" <tool") == [{"content": " "}]   # "<tool" may begin <tool_call>: held
    assert p.push('_call>{"name": "f", "arguments": {"a"') == []
    deltas = p.push(": 1}}</tool_call>")
    assert [list(d["tool_calls"][0]) for d in deltas] == [["index", "id", "type", "function"], ["index", "function"]]
    assert deltas[0]["tool_calls"][0]["function"] == {"name": "f", "arguments": ""}
    assert deltas[1]["tool_calls"][0]["function"] == {"arguments": '{"a": 1}'}
    assert p.called and p.finish() == []


def test_one_call_when_parallel_calls_are_off() -> None:
    fmt, text = CASES[1][0], CASES[1][1]
    assert [c.name for c in parse_tool_calls(text, fmt, parallel=False).calls] == ["a"]
    _, calls, _ = _joined(_stream(fmt, [text], parallel=False))
    assert [n for n, _ in calls] == ["a"]
