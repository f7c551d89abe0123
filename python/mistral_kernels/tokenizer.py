"""Tokenizers: HF tokenizer.json, GGUF-embedded, and mistral-common (tekken.json / tokenizer.model.vN).

:func:`load_tokenizer` picks the kind from the file's contents and returns a :class:`Tokenizer` with one API:

>>> tok = load_tokenizer("SmolLM2-135M-Instruct.Q4_1.gguf")              # doctest: +SKIP
>>> ids = tok.encode("Hello")                                           # doctest: +SKIP
>>> tok.decode(ids)                                                     # doctest: +SKIP
'Hello'
>>> prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}])  # list[int], ends with the
>>> # assistant header so generation starts the answer                  # doctest: +SKIP
>>> dec = tok.incremental_decoder()                                     # doctest: +SKIP
>>> "".join(dec.push([i]) for i in ids) + dec.flush() == tok.decode(ids)  # doctest: +SKIP
True
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from abc import ABC, abstractmethod

Message = dict[str, str]  # {"role": "system" | "user" | "assistant", "content": str}


class IncrementalDecoder:
    """Turns a growing list of token ids into text pieces, for streaming.

    Text is emitted only once it is final: a token that ends in the middle of a multi-byte UTF-8 character
    (byte-fallback / byte-level BPE) yields "" until the character completes, and SentencePiece's ``▁``
    spaces are resolved by decoding each new token together with the tokens just before it. The pieces
    concatenate to exactly ``tokenizer.decode(all_ids)``.

    Worked example (byte-level BPE, "é" split into two byte tokens ``Ã`` ``©``)::

        push([tok("Ã")]) -> ""        # decodes to "\\ufffd": incomplete, hold back
        push([tok("©")]) -> "é"       # now complete
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # start of the context window re-decoded with each new token
        self._read = 0  # ids[:read] have been emitted

    def push(self, token_ids: Sequence[int]) -> str:
        """Add tokens; return the newly final text (possibly "")."""
        self._ids.extend(int(t) for t in token_ids)
        before = self._tok.decode(self._ids[self._prefix:self._read], skip_special_tokens=self._skip)
        after = self._tok.decode(self._ids[self._prefix:], skip_special_tokens=self._skip)
        if after.endswith("\ufffd") or len(after) <= len(before):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return after[len(before):]

    def flush(self) -> str:
        """Text still held back (an incomplete character at the end decodes as U+FFFD)."""
        before = self._tok.decode(self._ids[self._prefix:self._read], skip_special_tokens=self._skip)
        after = self._tok.decode(self._ids[self._prefix:], skip_special_tokens=self._skip)
        self._prefix = self._read = len(self._ids)
        return after[len(before):]


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
    def apply_chat_template(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of a conversation in the model's chat format, ending with the assistant turn's opening."""

    def incremental_decoder(self, skip_special_tokens: bool = True) -> IncrementalDecoder:
        """A fresh :class:`IncrementalDecoder` for streaming one sequence."""
        return IncrementalDecoder(self, skip_special_tokens)


def _raise_exception(message: str) -> None:
    raise ValueError(f"chat template: {message}")


class HFTokenizer(Tokenizer):
    """A `tokenizers.Tokenizer` plus an HF-style config (special tokens, jinja2 chat template).

    Built from a tokenizer.json (+ tokenizer_config.json / chat_template.jinja / generation_config.json next
    to it) or from GGUF metadata (:mod:`mistral_kernels.tokenizer_gguf`).
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

    @property
    def backend(self) -> Any:
        """The underlying ``tokenizers.Tokenizer``."""
        return self._tok

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def render_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        """The chat template rendered to text (special tokens spelled out)."""
        if not self.chat_template:
            raise ValueError(f"this {self.kind} tokenizer has no chat template; generate without --chat")
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"], undefined=jinja2.Undefined)
        env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
        env.globals["raise_exception"] = _raise_exception
        template = env.from_string(self.chat_template)
        return template.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                               bos_token=self.bos_token or "", eos_token=self.eos_token or "")

    def apply_chat_template(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> list[int]:
        # The template writes BOS itself when the model wants one: tokenize without adding specials.
        return self.encode(self.render_chat(messages, add_generation_prompt), add_special_tokens=False)


def _token_text(token: Any) -> str | None:
    if token is None or isinstance(token, str):
        return token
    if isinstance(token, dict):  # {"content": "<s>", "__type": "AddedToken", ...}
        return token.get("content")
    return str(token)


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


def _is_gguf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def _load_hf_json(path: Path) -> HFTokenizer:
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




def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load a tokenizer from a file or a model directory.

    Parameters
    ----------
    path : str or Path
        One of: a ``.gguf`` file (tokenizer built from its metadata); an HF ``tokenizer.json`` (its folder's
        tokenizer_config.json / chat_template.jinja / generation_config.json are read too); a mistral-common
        ``tekken.json`` or SentencePiece ``tokenizer.model[.vN]``; or a directory holding one of those
        (searched in that order: tokenizer.json, tekken.json, tokenizer.model*, a single *.gguf).

    Returns
    -------
    Tokenizer

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist or the directory holds no tokenizer.
    ValueError
        The file is not a tokenizer this function knows.
    """
    p = Path(path)
    if p.is_dir():
        candidates = [p / "tokenizer.json", p / "tekken.json", *sorted(p.glob("tokenizer.model*")),
                      *sorted(p.glob("*.gguf"))]
        found = [c for c in candidates if c.is_file()]
        if not found:
            raise FileNotFoundError(
                f"load_tokenizer: no tokenizer in directory {p} (looked for tokenizer.json, tekken.json, "
                "tokenizer.model*, *.gguf)")
        p = found[0]
    if not p.is_file():
        raise FileNotFoundError(f"load_tokenizer: path {p} does not exist")
    if _is_gguf(p):
        from .tokenizer_gguf import read_gguf_tokenizer

        backend, config = read_gguf_tokenizer(p)
        return HFTokenizer(backend, config, kind="gguf")
    with open(p, "rb") as f:
        first = f.read(1)
    if first == b"{":
        data = json.loads(p.read_text(encoding="utf-8"))
        if isinstance(data, dict) and "model" in data and "pre_tokenizer" in data:
            return _load_hf_json(p)
        if isinstance(data, dict) and "vocab" in data and "config" in data:  # tekken.json
            return MistralCommonTokenizer(p)
        raise ValueError(f"load_tokenizer: {p} is JSON but neither an HF tokenizer.json nor a tekken.json")
    # Otherwise a SentencePiece protobuf model (mistral-common names them tokenizer.model.v1/v2/v3/v7...).
    return MistralCommonTokenizer(p)
