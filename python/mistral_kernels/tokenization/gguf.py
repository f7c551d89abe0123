"""Build a `tokenizers.Tokenizer` from the tokenizer a GGUF file describes in its metadata.

A GGUF carries no tokenizer.json; llama.cpp stores the vocabulary under ``tokenizer.ggml.*``:

- ``tokenizer.ggml.model``: ``"gpt2"`` (byte-level BPE: tokens already spelled in the GPT-2 byte alphabet,
  merges given) or ``"llama"`` (SentencePiece BPE: ``▁`` for spaces, ``<0xNN>`` byte-fallback tokens, a score per
  token and usually no merges — they are rebuilt from the scores);
- ``tokenizer.ggml.pre``: which regex splits the text before BPE (``"smollm"``, ``"llama-bpe"``, ``"tekken"``…);
- ``tokenizer.ggml.token_type``: 1 normal, 2 unknown, 3 control (special), 4 user-defined, 5 unused, 6 byte
  (SentencePiece's own piece types, same numbers);
- ``tokenizer.ggml.{bos,eos,unknown,padding}_token_id``, ``tokenizer.ggml.add_bos_token``,
  ``tokenizer.chat_template``.

:func:`load_gguf_tokenizer` builds the ``tokenizers.Tokenizer`` plus a config dict (special tokens, chat
template) in the shape of an HF ``tokenizer_config.json``.

SentencePiece (``"llama"``) text handling, pinned against ``sentencepiece`` itself on Mistral's tokenizer models
(tests/test_tokenizer_gguf_spm.py): spaces become ``▁`` and the text gets one ``▁`` in front (the "dummy
prefix", ``tokenizer.ggml.add_space_prefix``); user-defined pieces are matched in that normalized text. Control
tokens are not text to SentencePiece; here they are matched in the raw text (chat templates spell them out)
and, as llama.cpp does, each text part after one gets its own prefix. Worked example (Mistral v3 vocabulary,
``[INST]`` control, ``[REFERENCE_DOC_1]`` user-defined)::

    "x [REFERENCE_DOC_1] y"  ->  "▁x▁[REFERENCE_DOC_1]▁y"  ->  ▁x  ▁  [REFERENCE_DOC_1]  ▁y
    "<s>[INST]Hi there"      ->  <s>  [INST]  "▁Hi▁there"  ->  <s>  [INST]  ▁Hi  ▁there
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from ..checkpoint.gguf_header import read_gguf_metadata
from .hf import HFTokenizer
from .byte_level import byte_alphabet

# The regexes below are the pre-tokenizer splits named by `tokenizer.ggml.pre` (the same ones llama.cpp applies).
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# pre name -> (split digits one by one first?, main split regex)
_PRE_SPLITS: dict[str, tuple[bool, str]] = {
    "default": (False, _GPT2_SPLIT),
    "gpt2": (False, _GPT2_SPLIT),
    "gpt-2": (False, _GPT2_SPLIT),
    "smollm": (True, _GPT2_SPLIT),
    "starcoder": (True, _GPT2_SPLIT),
    "refact": (True, _GPT2_SPLIT),
    "codeshell": (True, _GPT2_SPLIT),
    "llama3": (False, _LLAMA3_SPLIT),
    "llama-v3": (False, _LLAMA3_SPLIT),
    "llama-bpe": (False, _LLAMA3_SPLIT),
    "smaug-bpe": (False, _LLAMA3_SPLIT),
    "pixtral": (False, _LLAMA3_SPLIT),
    "tekken": (False, _TEKKEN_SPLIT),
    "qwen2": (False, _QWEN2_SPLIT),
}

_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED = 1, 2, 3, 4


def _byte_level_model(tokens: list[str], merges: list[str], pre: str) -> Tokenizer:
    alphabet = set(byte_alphabet().values())
    spelling = byte_alphabet()
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        # Control tokens such as <|im_start|> are spelled in plain text; everything else is in the byte alphabet.
        key = token if set(token) <= alphabet else "".join(spelling[b] for b in token.encode("utf-8"))
        vocab.setdefault(key, index)
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, ignore_merges=False))
    if pre not in _PRE_SPLITS:
        raise ValueError(
            f"GGUF tokenizer.ggml.pre={pre!r} is not supported; supported: {sorted(_PRE_SPLITS)}. "
            "Use the model's tokenizer.json instead (load_tokenizer(path_to_tokenizer_json))."
        )
    digits, split = _PRE_SPLITS[pre]
    steps: list[Any] = []
    if digits:
        steps.append(pre_tokenizers.Digits(individual_digits=True))
    steps.append(pre_tokenizers.Split(Regex(split), behavior="isolated"))
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece_model(tokens: list[str], scores: list[float], merges: list[str] | None,
                         token_types: list[int], add_space_prefix: bool) -> Tokenizer:
    vocab = {t: i for i, t in enumerate(tokens)}
    if merges:
        pairs = [tuple(m.split(" ", 1)) for m in merges]
    else:
        # SentencePiece BPE merges in the order of the merged piece's score (higher first).
        found: list[tuple[float, int, str, str]] = []
        for piece, index in vocab.items():
            if token_types and token_types[index] != _NORMAL:
                continue
            for cut in range(1, len(piece)):
                left, right = piece[:cut], piece[cut:]
                if left in vocab and right in vocab:
                    found.append((-scores[index], index, left, right))
        found.sort()
        pairs = [(left, right) for _, _, left, right in found]
    unk = next((t for t, ty in zip(tokens, token_types) if ty == _UNKNOWN), None)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, unk_token=unk, fuse_unk=True, byte_fallback=True))
    # The dummy prefix is added by SentencePieceTokenizer.encode, not by a Prepend normalizer: that would also
    # prefix every text part after a user-defined piece, and rewrite the pieces themselves ("[R]" -> "▁[R]").
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    tok.pre_tokenizer = None
    steps: list[Any] = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    tok.decoder = decoders.Sequence(steps)
    return tok


class SentencePieceTokenizer(HFTokenizer):
    """A GGUF SentencePiece tokenizer: :class:`HFTokenizer` plus the dummy prefix of each text part (the
    module docstring has the rules and a worked example)."""

    def __init__(self, backend: Tokenizer, config: dict[str, Any], control_tokens: Sequence[str]) -> None:
        super().__init__(backend, config, kind="gguf")
        longest_first = sorted(control_tokens, key=len, reverse=True)  # leftmost-longest, like the backend
        self._controls = re.compile("(" + "|".join(map(re.escape, longest_first)) + ")") if longest_first else None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return super().encode(self._with_dummy_prefix(text), add_special_tokens)

    def _with_dummy_prefix(self, text: str) -> str:
        """A space in front of every non-empty text part; the split alternates text parts and control tokens:
        "<s>[INST]Hi" -> ["", "<s>", "", "[INST]", "Hi"] -> "<s>[INST] Hi"."""
        parts = self._controls.split(text) if self._controls is not None else [text]
        return "".join(" " + part if i % 2 == 0 and part else part for i, part in enumerate(parts))


def load_gguf_tokenizer(path: str | Path) -> HFTokenizer:
    """The tokenizer described by a GGUF file's ``tokenizer.ggml.*`` metadata (:func:`gguf_tokenizer` of the
    file's header)."""
    return gguf_tokenizer(read_gguf_metadata(path), path)


def gguf_tokenizer(meta: Mapping[str, Any], path: str | Path) -> HFTokenizer:
    """The tokenizer described by GGUF metadata ``meta`` (a header already read, e.g. by
    :class:`~mistral_kernels.checkpoint.Checkpoint`).

    Parameters
    ----------
    meta : the GGUF key/value metadata (``tokenizer.ggml.*`` read here)
    path : the file it comes from, for messages

    Returns
    -------
    HFTokenizer
        Kind "gguf"; its config has ``bos_token``, ``eos_token``, ``bos_token_id``, ``eos_token_id``,
        ``add_bos_token``, ``chat_template``. BOS is added by a post-processor when ``add_bos_token``.
        A SentencePiece vocabulary with ``add_space_prefix`` gives a :class:`SentencePieceTokenizer`.
    """
    kind = meta.get("tokenizer.ggml.model")
    if kind is None:
        raise ValueError(f"{path}: GGUF file has no tokenizer (tokenizer.ggml.model missing)")
    tokens: list[str] = list(meta.get("tokenizer.ggml.tokens"))
    token_types: list[int] = list(meta.get("tokenizer.ggml.token_type", []) or [])
    merges = meta.get("tokenizer.ggml.merges")
    merges = list(merges) if merges is not None else None
    pre = meta.get("tokenizer.ggml.pre", "default")
    add_space_prefix = kind == "llama" and bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    if kind == "gpt2":
        if merges is None:
            raise ValueError(f"{path}: byte-level BPE GGUF tokenizer has no tokenizer.ggml.merges")
        tok = _byte_level_model(tokens, merges, pre)
        add_bos_default = False
    elif kind == "llama":
        scores = list(meta.get("tokenizer.ggml.scores", []) or [0.0] * len(tokens))
        tok = _sentencepiece_model(tokens, scores, merges, token_types, add_space_prefix)
        add_bos_default = True
    else:
        raise ValueError(f"{path}: GGUF tokenizer.ggml.model={kind!r} not supported (supported: 'gpt2', 'llama')")

    controls = [t for t, ty in zip(tokens, token_types) if ty == _CONTROL]
    if controls:  # matched in the raw text
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in controls])
    # SentencePiece matches user-defined pieces in the normalized text (a piece "▁x" matches the text " x")
    user = [AddedToken(t, special=False, normalized=kind == "llama")
            for t, ty in zip(tokens, token_types) if ty == _USER_DEFINED]
    if user:
        tok.add_tokens(user)

    def tid(key: str) -> int | None:
        value = meta.get(f"tokenizer.ggml.{key}")
        return int(value) if value is not None else None

    bos_id, eos_id = tid("bos_token_id"), tid("eos_token_id")
    add_bos = meta.get("tokenizer.ggml.add_bos_token")
    add_bos = add_bos_default if add_bos is None else bool(add_bos)
    if add_bos and bos_id is not None:
        bos = tokens[bos_id]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, bos_id)])
    config: dict[str, Any] = {
        "bos_token": tokens[bos_id] if bos_id is not None else None,
        "eos_token": tokens[eos_id] if eos_id is not None else None,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "add_bos_token": add_bos,
        "chat_template": meta.get("tokenizer.chat_template"),
    }
    if add_space_prefix:
        return SentencePieceTokenizer(tok, config, controls)
    return HFTokenizer(tok, config, kind="gguf")
