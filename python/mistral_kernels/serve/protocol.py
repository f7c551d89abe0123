"""Request and response bodies of the OpenAI-compatible API (pydantic models).

Requests are validated here, so a bad field becomes a 400 naming it (see :mod:`.errors`). No field is
silently ignored: a field not declared here is a 400 naming it, except the accepted-and-ignored ones of
:data:`IGNORED_FIELDS` (they do not change the output); fields this server cannot honour (``best_of`` other
than ``n``, ``suffix``, ``functions`` / ``function_call``) are declared so that their 400 says why. Types are strict (pydantic's strict
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

import json
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from ..sampling_params import SamplingParams
from ..structured.spec import JsonSchema, StructuredOutput

__all__ = ["IGNORED_FIELDS", "JSON_LAYOUT", "ChatCompletionRequest", "ChatMessage", "CompletionRequest", "InvalidField",
           "ResponseFormat", "SamplingFields", "StreamOptions", "TextPart", "ToolChoiceFunction", "ToolDefinition"]

# Accepted and ignored (they do not change the output): OpenAI's bookkeeping and routing fields. Every other
# unknown field is a 400 naming it.
IGNORED_FIELDS = ("user", "store", "metadata", "service_tier", "prompt_cache_key", "safety_identifier")


class InvalidField(ValueError):
    """A body field whose value :class:`SamplingParams` rejects; ``param`` is the body's name for it."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Body):
    include_usage: bool = False


# The server's JSON layout (llguidance's ``x-guidance`` options): ", " and ": " between items, no other
# whitespace, as OpenAI's API and json.dumps write JSON. Free whitespace would let a sampled small model pad
# with newlines and tabs until max_tokens.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class JsonSchemaFormat(_Body):
    name: str
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None  # accepted: the output always follows the schema


class ResponseFormat(_Body):
    """``{"type": "text" | "json_object" | "json_schema", "json_schema": {"name", "schema", "strict"}}``."""

    type: str
    json_schema: JsonSchemaFormat | None = None

    @field_validator("type")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in ("text", "json_object", "json_schema"):
            raise ValueError(f"unsupported response_format type {v!r}; use text, json_object or json_schema")
        return v

    @model_validator(mode="after")
    def _schema(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type json_schema needs json_schema: {name, schema}")
        if self.type != "json_schema" and self.json_schema is not None:
            raise ValueError(f"json_schema is only for type json_schema, not {self.type}")
        return self

    def spec(self) -> StructuredOutput | None:
        """The constraint: JSON written as OpenAI's API writes it (:data:`JSON_LAYOUT`) — any object, or a value
        valid under the schema (a schema's own ``x-guidance`` layout wins)."""
        if self.type == "json_object":
            return JsonSchema({"type": "object", "x-guidance": JSON_LAYOUT})
        if self.type == "json_schema":
            assert self.json_schema is not None
            return JsonSchema({"x-guidance": JSON_LAYOUT, **(self.json_schema.schema_ or {})})
        return None


class SamplingFields(_Body):
    """Fields shared by both completion endpoints: every :class:`SamplingParams` field (OpenAI names and
    defaults; ``top_k``, ``min_p``, ``repetition_penalty``, ``stop_token_ids`` and ``ignore_eos`` are
    extensions, sent by the ``openai`` client through ``extra_body``), ``n`` choices, streaming. The values
    are checked once, by :meth:`to_sampling_params` (SamplingParams' own rules); an error names the body's
    field (:attr:`param_names`)."""

    # SamplingParams field → the body field that carries it (where the names differ)
    param_names: ClassVar[dict[str, str]] = {"max_new_tokens": "max_tokens", "structured": "response_format"}

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
    logit_bias: dict[str, float] | None = None
    min_tokens: int = 0
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    response_format: ResponseFormat | None = None
    n: int = Field(default=1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    # accepted and ignored (IGNORED_FIELDS)
    user: str | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None

    @field_validator("logit_bias")
    @classmethod
    def _bias_keys(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for key in v or {}:
            if not key.strip().lstrip("-").isdigit():
                raise ValueError(f"keys are token ids (integers as strings), got {key!r}")
        return v

    def structured_output(self) -> StructuredOutput | None:
        """The output constraint of ``response_format`` (None: free text)."""
        return self.response_format.spec() if self.response_format is not None else None

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
            "ignore_eos": self.ignore_eos, "logprobs": self.requested_logprobs(),
            "logit_bias": {int(k): v for k, v in (self.logit_bias or {}).items()}, "min_tokens": self.min_tokens,
            "include_stop_str_in_output": self.include_stop_str_in_output,
            "skip_special_tokens": self.skip_special_tokens}
        structured = self.structured_output()
        if structured is not None:  # (only then: the field is the engine's, SamplingParams.structured)
            values["structured"] = structured
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


class FunctionCallOut(_Body):
    name: str
    arguments: str


class ToolCallOut(_Body):
    """An assistant message's earlier call, sent back in the history."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class ChatMessage(_Body):
    """A message of the conversation. ``developer`` is OpenAI's newer name of ``system`` (rendered as system);
    an assistant message may carry ``tool_calls`` (``content`` null then); a ``tool`` message is a call's
    result and names it with ``tool_call_id``."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCallOut] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _shape(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content may be null only in an assistant message with tool_calls")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if (self.role == "tool") != (self.tool_call_id is not None):
            raise ValueError("a tool message, and only a tool message, needs tool_call_id")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)

    def as_dict(self) -> dict[str, Any]:
        """The message as the tokenizers and :mod:`mistral_kernels.tools.prompt` take it."""
        out: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role,
                               "content": None if self.content is None else self.text()}
        if self.tool_calls:
            out["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


class FunctionDefinition(_Body):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # accepted: required / named calls always follow the schema


class ToolDefinition(_Body):
    type: Literal["function"]
    function: FunctionDefinition


class ToolChoiceName(_Body):
    name: str


class ToolChoiceFunction(_Body):
    type: Literal["function"]
    function: ToolChoiceName


class ChatCompletionRequest(SamplingFields):
    """``logprobs: true`` with ``top_logprobs: k`` asks for log-probabilities (k alternatives, default 0)."""

    param_names: ClassVar[dict[str, str]] = {"max_new_tokens": "max_tokens", "logprobs": "top_logprobs",
                                             "structured": "response_format"}

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceFunction | None = None
    parallel_tool_calls: bool = True
    functions: list[Any] | None = None       # refused (the legacy form of tools)
    function_call: Any = None                # refused

    @field_validator("functions", "function_call")
    @classmethod
    def _legacy(cls, v: Any) -> Any:
        if v is not None:
            raise ValueError("the legacy function-calling fields are not supported; send tools and tool_choice")
        return v

    def tool_choice_name(self) -> str | None:
        """"auto" / "none" / "required" / the named function; None when not given."""
        c = self.tool_choice
        return c.function.name if isinstance(c, ToolChoiceFunction) else c

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

    param_names: ClassVar[dict[str, str]] = {"max_new_tokens": "max_tokens", "logprobs": "logprobs",
                                             "structured": "response_format"}

    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False
    best_of: int | None = None   # refused unless it equals n (then it changes nothing)
    suffix: str | None = None    # refused

    @field_validator("best_of")
    @classmethod
    def _best_of(cls, v: int | None, info: ValidationInfo) -> int | None:
        n = info.data.get("n", 1)
        if v is not None and v != n:
            raise ValueError(f"only best_of = n ({n}) is supported (every candidate is returned), got {v}")
        return v

    @field_validator("suffix")
    @classmethod
    def _suffix(cls, v: str | None) -> str | None:
        if v is not None:
            raise ValueError("insertion (a suffix after the completion) is not supported")
        return v

    def requested_logprobs(self) -> int | None:
        return self.logprobs
