"""mistral-common tokenizers (tekken.json, SentencePiece tokenizer.model.vN): encoding, decoding and chat
prompts through the ``mistral-common`` package (an optional dependency)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .base import Message, Tokenizer

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class MistralCommonTokenizer(Tokenizer):
    """A mistral-common tokenizer (tekken.json or SentencePiece tokenizer.model.vN); chat via its encoder."""

    def __init__(self, path: Path) -> None:
        try:
            from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
        except ImportError as e:  # optional dependency
            raise ImportError(
                f"{path} is a mistral-common tokenizer; install it with `pip install mistral-common`"
            ) from e
        self.kind = "mistral-common"
        self._mt = MistralTokenizer.from_file(str(path))
        self._raw = self._mt.instruct_tokenizer.tokenizer
        self.bos_id = int(self._raw.bos_id)
        self.eos_ids = frozenset([int(self._raw.eos_id)])
        self.vocab_size = int(self._raw.n_words)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._raw.encode(text, bos=add_special_tokens, eos=False))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``. Special tokens kept: tekken decodes them in place; SentencePiece kinds (whose
        mistral-common decode then returns raw pieces, ``▁`` and ``<0x0A>`` included) decode the runs between
        special tokens as text and write each special token as its piece."""
        from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy

        ids = [int(i) for i in ids]
        if skip_special_tokens or hasattr(self._raw, "id_to_byte_piece"):
            policy = SpecialTokenPolicy.IGNORE if skip_special_tokens else SpecialTokenPolicy.KEEP
            return self._raw.decode(ids, special_token_policy=policy)
        out, run = [], []
        for t in ids:
            if self._raw.is_special(t):
                out.append(self._raw.decode(run, special_token_policy=SpecialTokenPolicy.IGNORE) if run else "")
                out.append(self._raw.id_to_piece(t))
                run = []
            else:
                run.append(t)
        out.append(self._raw.decode(run, special_token_policy=SpecialTokenPolicy.IGNORE) if run else "")
        return "".join(out)

    def token_bytes(self, token_id: int) -> bytes:
        """Tekken pieces are bytes (``id_to_byte_piece``). SentencePiece pieces: a byte-fallback piece
        (``<0x0D>``) is its byte, ``▁`` is a space (``▁a`` → b" a"), a special token its own text."""
        from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy

        piece = getattr(self._raw, "id_to_byte_piece", None)
        if piece is not None:
            return bytes(piece(int(token_id), SpecialTokenPolicy.KEEP))
        text = self._raw.id_to_piece(int(token_id))
        if self._raw.is_special(int(token_id)):
            return text.encode("utf-8")
        byte = _BYTE_PIECE.fullmatch(text)
        if byte is not None:
            return bytes([int(byte.group(1), 16)])
        return text.replace("\u2581", " ").encode("utf-8")

    def apply_chat_template(self, messages: Sequence[Message], add_generation_prompt: bool = True,
                            tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
        """mistral-common's ``encode_chat_completion`` of the messages (tool calls and results included) and
        ``tools``. Call ids that are not mistral-common's 9 alphanumerics (OpenAI's ``call_...``) are mapped to
        9 stable ones (:func:`mistral_call_id`), the same in a call and in its result."""
        from mistral_common.protocol.instruct.messages import (AssistantMessage, SystemMessage, ToolMessage,
                                                               UserMessage)
        from mistral_common.protocol.instruct.request import ChatCompletionRequest
        from mistral_common.protocol.instruct.tool_calls import FunctionCall, Tool, ToolCall

        converted: list[Any] = []
        for i, m in enumerate(messages):
            role, content = m.get("role"), m.get("content")
            if role == "system":
                converted.append(SystemMessage(content=content))
            elif role == "user":
                converted.append(UserMessage(content=content))
            elif role == "assistant":
                calls = [ToolCall(id=mistral_call_id(c["id"]), function=FunctionCall(
                    name=c["function"]["name"], arguments=c["function"]["arguments"])) for c in m.get("tool_calls") or []]
                converted.append(AssistantMessage(content=content, tool_calls=calls or None))
            elif role == "tool":
                converted.append(ToolMessage(content=content, tool_call_id=mistral_call_id(m.get("tool_call_id") or "")))
            else:
                raise ValueError(f"messages[{i}].role={role!r}; expected system, user, assistant or tool")
        request = ChatCompletionRequest(messages=converted, tools=[Tool.model_validate(dict(t)) for t in tools]
                                        if tools else None)
        return list(self._mt.encode_chat_completion(request).tokens)


def mistral_call_id(call_id: str) -> str:
    """A call id as mistral-common wants it (9 characters a-z A-Z 0-9): kept if it is one, else 9 characters
    derived from it (the same for the same id)."""
    if len(call_id) == 9 and call_id.isascii() and call_id.isalnum():
        return call_id
    return hashlib.sha256(call_id.encode()).hexdigest()[:9]
