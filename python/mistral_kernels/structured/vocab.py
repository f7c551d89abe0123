"""The vocabulary a grammar is matched against: an ``llguidance.LLTokenizer`` built from our own
:class:`~mistral_kernels.tokenization.Tokenizer`, once per (tokenizer object, model vocabulary, EOS ids).

Shape letters: V the model's vocabulary (rows of its logits; may exceed the tokenizer's: padding ids).

Each token id maps to its real bytes (:meth:`Tokenizer.token_bytes`: a byte-fallback or byte-level piece is
its bytes, not the U+FFFD its lone decoding gives), so a grammar over text matches any tokenization of that
text. Special tokens are those whose text the tokenizer drops when it skips special tokens (the rule every
kind shares: HF / GGUF added tokens marked special, mistral-common control tokens) plus BOS and EOS; they
never match grammar text. Ids the tokenizer lacks (V above its vocabulary) have no bytes: never allowed.
EOS is allowed exactly where the grammar accepts. Building it takes about a second for a 50k vocabulary
(benchmarks/results/cpu_structured.md), paid on the first constrained request only.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Collection

import llguidance

from ..tokenization import Tokenizer

__all__ = ["grammar_vocabulary", "special_token_ids"]

_cache: weakref.WeakKeyDictionary[Tokenizer, dict[tuple[int, tuple[int, ...]], llguidance.LLTokenizer]] = \
    weakref.WeakKeyDictionary()
_lock = threading.Lock()


def special_token_ids(tokenizer: Tokenizer, vocab_size: int) -> list[int]:
    """Ids below ``vocab_size`` whose text disappears when special tokens are skipped, plus BOS / EOS."""
    n = min(vocab_size, tokenizer.vocab_size)
    out = {t for t in range(n) if tokenizer.decode([t], skip_special_tokens=True) == ""
           and tokenizer.decode([t], skip_special_tokens=False) != ""}
    out |= {t for t in tokenizer.eos_ids if t < n}
    if tokenizer.bos_id is not None and tokenizer.bos_id < n:
        out.add(tokenizer.bos_id)
    return sorted(out)


class _Vocabulary:
    """What ``llguidance.TokenizerWrapper`` reads: each id's bytes, the special ids, EOS / BOS, an encoder."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos: int) -> None:
        n = min(vocab_size, tokenizer.vocab_size)
        self.tokens = [tokenizer.token_bytes(t) for t in range(n)] + [b""] * (vocab_size - n)
        self.special_token_ids = special_token_ids(tokenizer, vocab_size)
        self.eos_token_id = eos
        self.bos_token_id = tokenizer.bos_id
        self._tokenizer = tokenizer
        self._specials = frozenset(self.special_token_ids)
        self._byte_ids: dict[int, int] | None = None  # byte value → a token spelling exactly that byte

    def __call__(self, text: bytes) -> list[int]:
        """Token ids whose bytes spell ``text`` (llguidance tokenizes forced text mid-output with it).

        A SentencePiece tokenizer encodes a text as the start of a sentence, with a dummy-prefix space
        (``"name"`` → ``▁name`` = b" name"): then the text is encoded after a newline and the tokens spelling
        the newline (and its dummy space) are dropped; failing that, one byte token per byte."""
        s = text.decode("utf-8", errors="replace")
        ids = self._tokenizer.encode(s, add_special_tokens=False)
        if self._spell(ids) == text:
            return ids
        ids = self._tokenizer.encode("\n" + s, add_special_tokens=False)
        for k in range(1, min(len(ids), 3) + 1):
            if self._spell(ids[:k]) in (b"\n", b" \n") and self._spell(ids[k:]) == text:
                return ids[k:]
        if self._byte_ids is None:
            self._byte_ids = {b[0]: t for t, b in enumerate(self.tokens) if len(b) == 1 and t not in self._specials}
        if all(b in self._byte_ids for b in text):
            return [self._byte_ids[b] for b in text]
        return self._tokenizer.encode(s, add_special_tokens=False)

    def _spell(self, ids: list[int]) -> bytes:
        return b"".join(self.tokens[t] if 0 <= t < len(self.tokens) else b"" for t in ids)


def grammar_vocabulary(tokenizer: Tokenizer, vocab_size: int, eos_ids: Collection[int]) -> llguidance.LLTokenizer:
    """The llguidance vocabulary of ``tokenizer`` for a model of ``vocab_size`` ids ending on ``eos_ids``
    (cached per tokenizer object; thread-safe).

    Raises
    ------
    ValueError
        ``eos_ids`` is empty or outside the vocabulary (a grammar needs a token that ends the output).
    """
    eos = tuple(sorted(int(e) for e in eos_ids))
    if not eos or not all(0 <= e < vocab_size for e in eos):
        raise ValueError(f"structured outputs need EOS token ids in [0, {vocab_size}), got {list(eos)}")
    key = (int(vocab_size), eos)
    with _lock:
        per = _cache.setdefault(tokenizer, {})
        if key not in per:
            wrapper = llguidance.TokenizerWrapper(_Vocabulary(tokenizer, vocab_size, eos[0]))
            per[key] = llguidance.LLTokenizer(wrapper, n_vocab=vocab_size, eos_token=list(eos))
        return per[key]
