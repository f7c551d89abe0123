"""Request and response bodies of the OpenAI-compatible API (pydantic models).

Requests are validated here, so a bad field becomes a 400 naming it (see :mod:`.errors`); unknown fields
are ignored, as the OpenAI API does for clients that send newer ones. Types are strict (pydantic's strict
mode): a string is not coerced to a number or a boolean, nor a boolean to an integer. Responses are plain dicts built by
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

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..sampling_params import SamplingParams

__all__ = ["ChatCompletionRequest", "ChatMessage", "CompletionRequest", "InvalidField", "SamplingFields",
           "StreamOptions", "TextPart"]


class InvalidField(ValueError):
    """A body field whose value :class:`SamplingParams` rejects; ``param`` is the body's name for it."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class StreamOptions(_Body):
    include_usage: bool = False


class SamplingFields(_Body):
    """Fields shared by both completion endpoints: every :class:`SamplingParams` field (OpenAI names and
    defaults; ``top_k``, ``min_p``, ``repetition_penalty``, ``stop_token_ids`` and ``ignore_eos`` are
    extensions, sent by the ``openai`` client through ``extra_body``), ``n`` choices, streaming. The values
    are checked once, by :meth:`to_sampling_params` (SamplingParams' own rules); an error names the body's
    field (:attr:`param_names`)."""

    # SamplingParams field → the body field that carries it (where the names differ)
    param_names: ClassVar[dict[str, str]] = {"max_new_tokens": "max_tokens"}

    model: str
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    n: int = Field(default=1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None

    def requested_max_tokens(self) -> int | None:
        """The body's token limit (None: as many as the context and the KV cache allow)."""
        return self.max_tokens

    def requested_logprobs(self) -> int | None:
        """The number of alternatives per token asked for (None: no log-probabilities)."""
        return None

    def param_name(self, field: str) -> str:
        """The body's name of a SamplingParams field (for error messages)."""
        return self.param_names.get(field, field)

    def to_sampling_params(self) -> SamplingParams:
        """This body's sampling parameters (choice i of ``n``: ``.for_choice(i)``, seed + i).

        Raises
        ------
        InvalidField
            A value SamplingParams rejects; ``param`` names the body field.
        """
        values: dict[str, Any] = {
            "max_new_tokens": self.requested_max_tokens(), "temperature": self.temperature, "top_k": self.top_k,
            "top_p": self.top_p, "min_p": self.min_p, "repetition_penalty": self.repetition_penalty,
            "presence_penalty": self.presence_penalty, "frequency_penalty": self.frequency_penalty,
            "seed": self.seed, "stop": self.stop_strings(), "stop_token_ids": tuple(self.stop_token_ids or ()),
            "ignore_eos": self.ignore_eos, "logprobs": self.requested_logprobs()}
        try:
            return SamplingParams(**values)
        except ValueError as e:  # SamplingParams' messages begin with the field ("stop strings must be ...")
            name = str(e).split()[0]
            param = self.param_name(name) if name in values else None
            raise InvalidField(f"{param}: {e}" if param else str(e), param) from e

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
    """``logprobs: true`` with ``top_logprobs: k`` asks for log-probabilities (k alternatives, default 0)."""

    param_names: ClassVar[dict[str, str]] = {"max_new_tokens": "max_tokens", "logprobs": "top_logprobs"}

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def requested_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def param_name(self, field: str) -> str:
        if field == "max_new_tokens" and self.max_completion_tokens is not None:
            return "max_completion_tokens"
        return super().param_name(field)


class CompletionRequest(SamplingFields):
    """``logprobs: k`` asks for log-probabilities with k alternatives."""

    param_names: ClassVar[dict[str, str]] = {"max_new_tokens": "max_tokens", "logprobs": "logprobs"}

    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None

    def requested_logprobs(self) -> int | None:
        return self.logprobs
