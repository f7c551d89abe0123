"""Tokenizers backed by a ``tokenizers.Tokenizer``: an HF tokenizer.json directory, or one built from GGUF
metadata (:mod:`.gguf`). Chat prompts come from the jinja2 chat template, rendered like transformers does."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .base import Message, Tokenizer
from .byte_level import byte_of_char
from .streaming import IncrementalDecoder, StreamDecoder


class HFTokenizer(Tokenizer):
    """A ``tokenizers.Tokenizer`` plus an HF-style config (special tokens, jinja2 chat template).

    Built from a tokenizer.json (+ tokenizer_config.json / chat_template.jinja / generation_config.json next
    to it, :func:`load_hf_json`) or from GGUF metadata (:func:`mistral_kernels.tokenization.gguf.gguf_tokenizer`).
    """

    def __init__(self, backend: Any, config: dict[str, Any], kind: str, extra_eos: Sequence[int] = ()) -> None:
        self._tok = backend
        self.kind = kind
        self.config = config
        self.chat_template: str | None = config.get("chat_template")
        self.bos_token: str | None = _token_text(config.get("bos_token"))
        self.eos_token: str | None = _token_text(config.get("eos_token"))
        self.bos_id = config.get("bos_token_id")
        if self.bos_id is None and self.bos_token is not None:
            self.bos_id = backend.token_to_id(self.bos_token)
        eos_id = config.get("eos_token_id")
        if eos_id is None and self.eos_token is not None:
            eos_id = backend.token_to_id(self.eos_token)
        self.eos_ids = frozenset(([eos_id] if eos_id is not None else []) + [int(e) for e in extra_eos])
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        self._byte_level: bool | None = None  # decoder is byte-level BPE's (found on first token_bytes)

    @property
    def backend(self) -> Any:
        """The underlying ``tokenizers.Tokenizer``."""
        return self._tok

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """A byte-fallback piece (``<0xE2>``) is its byte; a byte-level BPE piece (``ðŁ``) the bytes its
        characters spell; other tokens (added / special tokens, SentencePiece pieces) their text's UTF-8."""
        piece = self._tok.id_to_token(int(token_id))
        if piece is not None:
            m = _BYTE_PIECE.fullmatch(piece)
            if m is not None:
                return bytes([int(m.group(1), 16)])
            if self._byte_level is None:
                state = self._tok.decoder.__getstate__() if self._tok.decoder is not None else b""
                self._byte_level = b'"ByteLevel"' in state
            table = byte_of_char()
            if self._byte_level and all(c in table for c in piece):
                return bytes(table[c] for c in piece)
        return super().token_bytes(token_id)

    def incremental_decoder(self, skip_special_tokens: bool = True) -> IncrementalDecoder:
        return StreamDecoder(self, self._tok, skip_special_tokens)

    def render_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True,
                    tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        """The chat template rendered to text (special tokens spelled out); ``tools`` is passed to the template
        as transformers' ``apply_chat_template(tools=...)`` does."""
        if not self.chat_template:
            raise ValueError(f"this {self.kind} tokenizer has no chat template; generate without --chat")
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"], undefined=jinja2.Undefined)
        env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
        env.globals["raise_exception"] = _raise_exception
        template = env.from_string(self.chat_template)
        extra = {"tools": list(tools)} if tools else {}
        return template.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                               bos_token=self.bos_token or "", eos_token=self.eos_token or "", **extra)

    def apply_chat_template(self, messages: Sequence[Message], add_generation_prompt: bool = True,
                            tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
        # The template writes BOS itself when the model wants one: tokenize without adding specials.
        return self.encode(self.render_chat(messages, add_generation_prompt, tools), add_special_tokens=False)


_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _raise_exception(message: str) -> None:
    raise ValueError(f"chat template: {message}")


def _token_text(token: Any) -> str | None:
    if token is None or isinstance(token, str):
        return token
    if isinstance(token, dict):  # {"content": "<s>", "__type": "AddedToken", ...}
        return token.get("content")
    return str(token)


def load_hf_json(path: Path) -> HFTokenizer:
    """An HF tokenizer.json, with the tokenizer_config.json / chat_template.jinja / special_tokens_map.json /
    generation_config.json found next to it."""
    from tokenizers import Tokenizer as _Backend

    backend = _Backend.from_file(str(path))
    folder = path.parent
    config: dict[str, Any] = {}
    cfg_file = folder / "tokenizer_config.json"
    if cfg_file.is_file():
        config = json.loads(cfg_file.read_text(encoding="utf-8"))
    template_file = folder / "chat_template.jinja"
    if template_file.is_file():
        config["chat_template"] = template_file.read_text(encoding="utf-8")
    elif isinstance(config.get("chat_template"), list):  # [{"name": "default", "template": ...}, ...]
        named = {t["name"]: t["template"] for t in config["chat_template"]}
        config["chat_template"] = named.get("default")
    special_map = folder / "special_tokens_map.json"
    if special_map.is_file():
        for k, v in json.loads(special_map.read_text(encoding="utf-8")).items():
            config.setdefault(k, v)
    extra_eos: list[int] = []
    gen_file = folder / "generation_config.json"
    if gen_file.is_file():
        eos = json.loads(gen_file.read_text(encoding="utf-8")).get("eos_token_id")
        extra_eos = [eos] if isinstance(eos, int) else list(eos or [])
    return HFTokenizer(backend, config, kind="hf", extra_eos=extra_eos)
