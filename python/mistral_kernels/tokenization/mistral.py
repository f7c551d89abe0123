"""mistral-common tokenizers (tekken.json, SentencePiece tokenizer.model.vN): encoding, decoding and chat
prompts through the ``mistral-common`` package (an optional dependency)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .base import Message, Tokenizer


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
        from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy

        policy = SpecialTokenPolicy.IGNORE if skip_special_tokens else SpecialTokenPolicy.KEEP
        return self._raw.decode([int(i) for i in ids], special_token_policy=policy)

    def token_bytes(self, token_id: int) -> bytes:
        """Tekken pieces are bytes (``id_to_byte_piece``); other kinds: the base rule."""
        from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy

        piece = getattr(self._raw, "id_to_byte_piece", None)
        if piece is None:
            return super().token_bytes(token_id)
        return bytes(piece(int(token_id), SpecialTokenPolicy.KEEP))

    def apply_chat_template(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> list[int]:
        from mistral_common.protocol.instruct.messages import AssistantMessage, SystemMessage, UserMessage
        from mistral_common.protocol.instruct.request import ChatCompletionRequest

        kinds = {"system": SystemMessage, "user": UserMessage, "assistant": AssistantMessage}
        converted = []
        for i, m in enumerate(messages):
            if m.get("role") not in kinds:
                raise ValueError(f"messages[{i}].role={m.get('role')!r}; expected one of {sorted(kinds)}")
            converted.append(kinds[m["role"]](content=m["content"]))
        return list(self._mt.encode_chat_completion(ChatCompletionRequest(messages=converted)).tokens)
