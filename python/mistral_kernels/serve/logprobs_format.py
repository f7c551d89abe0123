"""The OpenAI ``logprobs`` objects of a choice (or of one streamed chunk) from the engine's
:class:`~mistral_kernels.logprobs.TokenLogprob` entries.

* chat (``logprobs: true, top_logprobs: k``)::

    {"content": [{"token": " Paris", "logprob": -0.01, "bytes": [32, 80, 97, 114, 105, 115],
                  "top_logprobs": [{"token": " Paris", "logprob": -0.01, "bytes": [...]}, ...k entries]}]}

* completions (``logprobs: k``)::

    {"tokens": [" Paris"], "token_logprobs": [-0.01], "top_logprobs": [{" Paris": -0.01, ...}],
     "text_offset": [0]}

  ``top_logprobs`` holds the k most likely tokens and the sampled one (k + 1 entries when it is not among
  them); ``text_offset`` is where each token's text starts in the choice's text (counted across chunks when
  streaming).

A token's text is its own decoding (special tokens included); a token that is only part of a UTF-8
character decodes to U+FFFD, but its chat ``bytes`` are its real bytes (:meth:`Tokenizer.token_bytes`), so
the bytes of consecutive entries join to the text's UTF-8 — that is what the field is for.

Which tokens have an entry: chat leaves out EOS tokens (their text is not in the content), so the entries'
bytes join to exactly the content's UTF-8 when the choice ends on EOS or a length limit, as the OpenAI API
does (a stop string's tokens keep their entries though the content is cut before it). Completions keep one
entry per generated token, EOS included (vLLM's convention; their count is ``usage.completion_tokens``).
Log-probabilities of -inf (a token the model rules out) are sent as -9999.0,
which JSON can carry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..logprobs import TokenLogprob
from ..tokenization import Tokenizer

__all__ = ["LogprobFormatter"]

_FLOOR = -9999.0


def _value(lp: float) -> float:
    return max(lp, _FLOOR)


class LogprobFormatter:
    """Formats entries for one response; caches token texts."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._texts: dict[int, str] = {}
        self._bytes: dict[int, list[int]] = {}

    def text(self, token_id: int) -> str:
        t = self._texts.get(token_id)
        if t is None:
            t = self._texts[token_id] = self._tokenizer.decode([token_id], skip_special_tokens=False)
        return t

    def _chat_token(self, token_id: int, lp: float) -> dict[str, Any]:
        b = self._bytes.get(token_id)
        if b is None:
            b = self._bytes[token_id] = list(self._tokenizer.token_bytes(token_id))
        return {"token": self.text(token_id), "logprob": _value(lp), "bytes": b}

    def chat(self, entries: Sequence[TokenLogprob]) -> dict[str, Any]:
        """The chat object; EOS entries are left out (see the module's docstring)."""
        eos = self._tokenizer.eos_ids
        return {"content": [{**self._chat_token(e.token_id, e.logprob),
                             "top_logprobs": [self._chat_token(t, v) for t, v in e.top]}
                            for e in entries if e.token_id not in eos],
                "refusal": None}

    def completion(self, entries: Sequence[TokenLogprob], offset: int = 0) -> tuple[dict[str, Any], int]:
        """The object and the text offset after its last token (the next chunk's start)."""
        tokens, offsets, top = [], [], []
        for e in entries:
            t = self.text(e.token_id)
            tokens.append(t)
            offsets.append(offset)
            offset += len(t)
            alts = {self.text(i): _value(v) for i, v in e.top}
            alts.setdefault(t, _value(e.logprob))
            top.append(alts)
        return {"tokens": tokens, "token_logprobs": [_value(e.logprob) for e in entries], "top_logprobs": top,
                "text_offset": offsets}, offset
