"""Chat prompts with tools and tool-call history, in the model's own format.

* mistral-common tokenizers: its encoder (``[AVAILABLE_TOOLS]``, ``[TOOL_CALLS]``, ``[TOOL_RESULTS]``), through
  :meth:`~mistral_kernels.tokenization.MistralCommonTokenizer.apply_chat_template` with ``tools``.
* HF / GGUF tokenizers whose jinja chat template reads ``tools``: the template, given ``tools`` and the
  messages as transformers passes them (an assistant call's ``arguments`` as a dict).
* any other template (SmolLM2's has no tool support): the **fallback** — the tools go into the system message
  as JSON with the instruction to answer a call as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
  (the ``hermes`` format of :mod:`.formats`); an assistant's earlier calls are written that way, a tool result
  becomes a user turn ``<tool_response>{"name"?, "content"}</tool_response>``.

Messages are OpenAI-shaped dicts: ``role`` (system / user / assistant / tool), ``content`` (str or None),
an assistant's ``tool_calls`` (``[{"id", "type": "function", "function": {"name", "arguments": JSON text}}]``),
a tool message's ``tool_call_id``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..tokenization import Tokenizer
from .formats import HERMES_CLOSE, HERMES_OPEN
from .spec import ToolDef

__all__ = ["FALLBACK_INSTRUCTIONS", "chat_prompt_ids", "fallback_messages", "template_reads_tools"]

FALLBACK_INSTRUCTIONS = (
    "You can call functions. The functions, as JSON schemas:\n{tools}\n"
    f"To call one, answer with {HERMES_OPEN}{{\"name\": <function name>, \"arguments\": <arguments object>}}"
    f"{HERMES_CLOSE} and nothing else. Function results come back as <tool_response>...</tool_response>.")


def template_reads_tools(template: str | None) -> bool:
    """The jinja template uses a ``tools`` variable."""
    if not template:
        return False
    import jinja2
    from jinja2 import meta

    return "tools" in meta.find_undeclared_variables(jinja2.Environment().parse(template))


def _arguments(text: Any) -> Any:
    if isinstance(text, str):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text
    return text


def _template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as transformers hands them to a template: a call's arguments parsed to a dict."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": _arguments(c["function"]["arguments"])}}
                               for c in m["tool_calls"]]
        out.append(m)
    return out


def fallback_messages(messages: Sequence[Mapping[str, Any]], tools: Sequence[ToolDef]) -> list[dict[str, str]]:
    """Plain system / user / assistant messages carrying the tools and the call history (see above)."""
    names = {c["id"]: c["function"]["name"] for m in messages for c in (m.get("tool_calls") or [])}
    out: list[dict[str, str]] = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "tool":
            result: dict[str, Any] = {"content": content}
            if m.get("tool_call_id") in names:
                result = {"name": names[m["tool_call_id"]], **result}
            out.append({"role": "user", "content": f"<tool_response>{json.dumps(result, ensure_ascii=False)}"
                                                   "</tool_response>"})
        elif role == "assistant" and m.get("tool_calls"):
            calls = "".join(HERMES_OPEN + json.dumps({"name": c["function"]["name"],
                                                      "arguments": _arguments(c["function"]["arguments"])},
                                                     ensure_ascii=False) + HERMES_CLOSE for c in m["tool_calls"])
            out.append({"role": "assistant", "content": content + calls})
        else:
            out.append({"role": role, "content": content})
    if tools:
        listing = "\n".join(json.dumps(t.to_openai()["function"], ensure_ascii=False) for t in tools)
        text = FALLBACK_INSTRUCTIONS.replace("{tools}", listing)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + text}
        else:
            out.insert(0, {"role": "system", "content": text})
    return out


def chat_prompt_ids(tok: Tokenizer, messages: Sequence[Mapping[str, Any]], tools: Sequence[ToolDef]) -> list[int]:
    """Token ids of a conversation with ``tools`` offered (may be empty) and tool history, in the model's
    format (see the module docstring)."""
    has_tool_history = any(m.get("tool_calls") or m["role"] == "tool" for m in messages)
    if tok.kind == "mistral-common":
        return tok.apply_chat_template(messages, tools=[t.to_openai() for t in tools])  # type: ignore[call-arg]
    if not tools and not has_tool_history:
        return tok.apply_chat_template(messages)  # type: ignore[arg-type]
    if template_reads_tools(getattr(tok, "chat_template", None)):
        return tok.apply_chat_template(_template_messages(messages),  # type: ignore[arg-type, call-arg]
                                       tools=[t.to_openai() for t in tools] or None)
    return tok.apply_chat_template(fallback_messages(messages, tools))
