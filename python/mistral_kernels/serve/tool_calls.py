"""The chat endpoint's tool fields → :class:`~mistral_kernels.tools.chat.ChatTools` (the prompt, the forced-call
constraint, the parsed reply; rules there), with a 400 naming ``tools`` / ``tool_choice`` /
``response_format`` when they do not fit together."""

from __future__ import annotations

from typing import Any

from ..sampling_params import SamplingParams
from ..tokenization import Tokenizer
from ..tools import ToolDef
from ..tools.chat import ChatTools
from .errors import APIError
from .protocol import ChatCompletionRequest

__all__ = ["ChatTools", "chat_tools", "message", "tool_params"]


def chat_tools(body: ChatCompletionRequest, tok: Tokenizer) -> ChatTools:
    try:
        tools = [ToolDef(t.function.name, t.function.description,
                         t.function.parameters or {"type": "object", "properties": {}}) for t in body.tools or []]
        return ChatTools.make(tok, tools, body.tool_choice_name(), body.parallel_tool_calls)
    except ValueError as e:
        param = "tool_choice" if "tool_choice" in str(e) else "tools"
        raise APIError(400, f"{param}: {e}", param) from e


def tool_params(tools: ChatTools, params: SamplingParams) -> SamplingParams:
    try:
        return tools.params(params)
    except ValueError as e:
        raise APIError(400, f"response_format: {e}", "response_format") from e


def message(tools: ChatTools, text: str, finish_reason: str) -> tuple[dict[str, Any], str]:
    """The choice's OpenAI message and finish reason."""
    reply = tools.reply(text, finish_reason)
    return reply.message(), reply.finish_reason
