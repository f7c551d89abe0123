"""Streaming detokenization: token ids in, text pieces out, each piece emitted once it is final.

A piece is final when the decoded text does not end in the middle of a character. A token can end inside a
multi-byte UTF-8 character (byte-level BPE, SentencePiece byte fallback ``<0xNN>``); such a token yields ""
until the character completes. Each new token is decoded together with the tokens of the previous piece (the
window), so that SentencePiece's ``▁`` (a space that a lone decode would strip at the start of a text) comes
out between the words. The pieces concatenate to ``tokenizer.decode(all_ids)``.

Worked example (byte-level BPE: "é" is the two byte tokens ``Ã`` ``©``; then SentencePiece-style ``▁world``)::

    window         decode(window)   prefix (emitted part)   push returns
    [Ã]            "\\ufffd"         ""                      ""         incomplete: held back
    [Ã, ©]         "é"              ""                      "é"        window becomes [Ã, ©], all emitted
    [Ã, ©, ▁world] "é world"        "é"                     " world"   window becomes [▁world]

:class:`IncrementalDecoder` runs this with ``tokenizer.decode`` (any :class:`Tokenizer`);
:class:`StreamDecoder` lets ``tokenizers.decoders.DecodeStream`` (the same algorithm, in Rust) do it for the
kinds backed by a ``tokenizers.Tokenizer``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from tokenizers.decoders import DecodeStream


class Tokenizer(Protocol):
    """What streaming needs of a tokenizer (:class:`~mistral_kernels.tokenization.base.Tokenizer` has it)."""

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

_INCOMPLETE = "\ufffd"  # what a decode ends with when its last character is cut


class IncrementalDecoder:
    """Turns a growing list of token ids into text pieces, for streaming one sequence."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._window: list[int] = []  # window[:read]: ids of the last emitted piece (context); window[read:]: held
        self._read = 0
        self._prefix: str | None = ""  # decode(window[:read]); None = not computed yet

    def push(self, token_ids: Sequence[int]) -> str:
        """Add tokens; return the newly final text (possibly "")."""
        return "".join(self._step(int(t)) for t in token_ids)

    def flush(self) -> str:
        """Text still held back (an incomplete character at the end decodes as U+FFFD); ends the sequence:
        a later :meth:`push` starts a new text."""
        piece = self._decode(self._window)[len(self._prefix_text()):]
        self._window, self._read, self._prefix = [], 0, ""
        return piece

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip)

    def _prefix_text(self) -> str:
        if self._prefix is None:
            self._prefix = self._decode(self._window[:self._read])
        return self._prefix

    def _advance(self) -> None:
        """Everything in the window has been emitted: its unread ids become the next token's context."""
        self._window = self._window[self._read:]
        self._read = len(self._window)
        self._prefix = None

    def _step(self, token_id: int) -> str:
        self._window.append(token_id)
        text, prefix = self._decode(self._window), self._prefix_text()
        if len(text) <= len(prefix) or text.endswith(_INCOMPLETE):
            return ""
        self._advance()
        # When the decode is not an extension of the emitted text (a byte-fallback run that turned invalid
        # replaces all its bytes, even those already emitted), emitted text cannot be taken back: the part
        # past its length is what this token adds.
        return text[len(prefix):]


class StreamDecoder(IncrementalDecoder):
    """:class:`IncrementalDecoder` whose steps run in ``tokenizers.decoders.DecodeStream``.

    ``DecodeStream`` keeps the same window as its base class (mirrored here for :meth:`flush`); it raises
    "Invalid prefix" where the window's decode stops extending the emitted text (see
    :meth:`IncrementalDecoder._step`): that step is then taken by the base class and the stream restarted on
    the new window.
    """

    def __init__(self, tokenizer: Tokenizer, backend: Any, skip_special_tokens: bool = True) -> None:
        super().__init__(tokenizer, skip_special_tokens)
        self._backend = backend  # the tokenizers.Tokenizer behind `tokenizer`
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)

    def _step(self, token_id: int) -> str:
        try:
            piece = self._stream.step(self._backend, token_id)
        except Exception as e:  # tokenizers raises a plain Exception; only "Invalid prefix" is recoverable
            if "Invalid prefix" not in str(e):
                raise
            piece = super()._step(token_id)  # emits (DecodeStream only raises where it would emit)
            self._stream = DecodeStream(self._window, skip_special_tokens=self._skip)  # window all emitted
            return piece
        self._window.append(token_id)
        if piece is None:
            return ""
        self._advance()
        return piece

    def flush(self) -> str:
        piece = super().flush()
        self._stream = DecodeStream(skip_special_tokens=self._skip)
        return piece
