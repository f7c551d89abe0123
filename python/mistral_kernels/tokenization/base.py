"""The tokenizer interface every kind implements (HF tokenizer.json, GGUF metadata, mistral-common)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

from .streaming import IncrementalDecoder

# {"role": "system" | "user" | "assistant", "content": str}; with tools also role "tool" (+ "tool_call_id") and
# assistant "tool_calls" (OpenAI shape, content None) — see mistral_kernels.tools.prompt
Message = dict[str, Any]


class Tokenizer(ABC):
    """Common interface. Attributes: ``bos_id``, ``eos_ids`` (set; generation stops on any),
    ``vocab_size``, ``kind`` ("hf", "gguf", "mistral-common")."""

    bos_id: int | None
    eos_ids: frozenset[int]
    vocab_size: int
    kind: str

    @abstractmethod
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` adds BOS when the tokenizer's config asks for it."""

    @abstractmethod
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``."""

    @abstractmethod
    def apply_chat_template(self, messages: Sequence[Message], add_generation_prompt: bool = True,
                            tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
        """Token ids of a conversation in the model's chat format, ending with the assistant turn's opening;
        ``tools``: OpenAI tool definitions offered to the model (kinds whose format has no tools ignore them:
        :mod:`mistral_kernels.tools.prompt` decides what to pass)."""

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for. A token may be part of a UTF-8 character: its own bytes then, not
        those of the U+FFFD its decoding alone gives. Default: the UTF-8 of its decoding (kinds that know
        their pieces' bytes override it)."""
        return self.decode([token_id], skip_special_tokens=False).encode("utf-8")

    def incremental_decoder(self, skip_special_tokens: bool = True) -> IncrementalDecoder:
        """A fresh :class:`IncrementalDecoder` for streaming one sequence."""
        return IncrementalDecoder(self, skip_special_tokens)
