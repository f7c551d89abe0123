"""Request and response bodies of the OpenAI-compatible API (pydantic models).

Requests are validated here, so a bad field becomes a 400 naming it (see :mod:`.errors`); unknown fields
are ignored, as the OpenAI API does for clients that send newer ones. Responses are plain dicts built by
:mod:`.app` with these shapes:

* chat completion ``{"id", "object": "chat.completion", "created", "model", "choices": [{"index",
  "message": {"role": "assistant", "content"}, "finish_reason", "logprobs"}], "usage"}``
* chat chunk (streaming) ``{"object": "chat.completion.chunk", "choices": [{"index", "delta": {...},
  "finish_reason", "logprobs"}], ...}``, then with ``stream_options.include_usage`` a last chunk with
  ``"choices": []`` and ``usage``; the stream ends with ``data: [DONE]``
* completion ``{"object": "text_completion", "choices": [{"index", "text", "finish_reason", "logprobs"}],
  ...}``

``logprobs`` is None unless asked for (shapes in :mod:`.logprobs_format`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..sampling import MAX_LOGPROBS

__all__ = ["ChatCompletionRequest", "ChatMessage", "CompletionRequest", "SamplingFields", "StreamOptions",
           "TextPart"]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False


class SamplingFields(_Body):
    """Fields shared by both completion endpoints (OpenAI names and defaults; ``top_k`` and ``min_p`` are
    extensions, sent by the ``openai`` client through ``extra_body``)."""

    model: str
    max_tokens: int | None = Field(default=None, gt=0)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False

    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: Literal["system", "user", "assistant"]
    content: str | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, gt=0)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
