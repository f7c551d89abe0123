"""One request's grammar state: which tokens may come next, and the tokens consumed so far.

Shape letters: V the model's vocabulary, W = ceil(V / 32) int32 words of a bitmask row (bit ``t % 32`` of
word ``t // 32`` set = token t allowed), k proposed tokens.

The state lives with the :class:`~mistral_kernels.request.Request` (``Request.grammar``); the output
processor feeds it each sampled token (:meth:`GrammarState.accept`), the runner reads its mask before
sampling (:mod:`.bitmask`). A preempted request keeps its generated tokens and is recomputed from them, so
its state stays valid as it is (nothing to replay). For speculative decoding,
:meth:`GrammarState.allowed_prefix` says how many proposals the grammar allows in turn,
:meth:`GrammarState.masks_for_proposals` gives the masks along a proposed continuation (both leave the state
as they found it); :meth:`GrammarState.rollback` undoes accepted tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import warnings

import llguidance
import torch

__all__ = ["GrammarState", "bitmask_words"]


def bitmask_words(vocab_size: int) -> int:
    """W: int32 words of one bitmask row."""
    return (vocab_size + 31) // 32


class GrammarState:
    """A request's matcher (an ``llguidance.LLMatcher`` of its own) over a vocabulary of ``vocab_size`` ids."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.words = bitmask_words(vocab_size)

    @property
    def is_complete(self) -> bool:
        """The output is a full sentence of the grammar and cannot go on (only EOS may follow): the request
        finishes ("stop")."""
        return self.matcher.is_stopped()

    @property
    def error(self) -> str:
        """llguidance's error message when the matcher failed (a resource limit hit mid-output); else ""."""
        return self.matcher.get_error() if self.matcher.is_error() else ""

    def fill(self, row: torch.Tensor) -> None:
        """Write the allowed next tokens into ``row``: int32 [W], contiguous, on the CPU."""
        if row.dtype != torch.int32 or row.device.type != "cpu" or row.shape != (self.words,) \
                or not row.is_contiguous():
            raise ValueError(f"GrammarState.fill: row must be a contiguous CPU int32 [{self.words}], got "
                             f"{row.dtype} {tuple(row.shape)} on {row.device}")
        self.matcher.unsafe_compute_mask_ptr(row.data_ptr(), self.words * 4)

    def accept(self, token: int) -> bool:
        """Consume one sampled token; True when the grammar is then complete (the request finishes).

        A token the mask allowed always succeeds; a failure (llguidance hit a resource limit) leaves the
        state in error (:attr:`error`) and also returns True: nothing valid can follow.
        """
        if self.matcher.is_stopped():  # only EOS was allowed: nothing more to consume
            return True
        if not self.matcher.consume_token(int(token)):
            warnings.warn(f"structured output: the grammar matcher failed, the request stops: {self.error}",
                          RuntimeWarning, stacklevel=2)
            return True
        return self.matcher.is_stopped()

    def rollback(self, n: int) -> None:
        """Undo the last ``n`` consumed tokens (``n`` ≤ the tokens consumed; an EOS taken after the grammar
        was complete does not count).

        Raises
        ------
        ValueError
            ``n`` exceeds the tokens consumed (the state is then in error).
        """
        if n < 0:
            raise ValueError(f"GrammarState.rollback: n must be ≥ 0, got {n}")
        if n and not self.matcher.rollback(n):
            raise ValueError(f"GrammarState.rollback({n}): {self.matcher.get_error().strip()}")

    def allowed_prefix(self, proposed: Sequence[int]) -> int:
        """How many of ``proposed`` the grammar allows in turn from the current state (each after the ones
        before it; an EOS is allowed where the grammar accepts). The state is not changed."""
        if self.matcher.is_stopped():
            return 0
        return int(self.matcher.validate_tokens([int(t) for t in proposed]))

    def masks_for_proposals(self, proposed: Sequence[int]) -> torch.Tensor:
        """The masks at the k+1 positions of a proposed continuation, as if the proposals were accepted in turn.

        Row 0 is the mask now; row i+1 the mask after ``proposed[:i+1]``. If the grammar rejects proposal j
        (row j does not allow it), rows j+1 … k are all-allowed (-1): a verifier that samples position j from
        row j never keeps proposal j, so the later rows are never read. Once the proposals complete the
        grammar (a full sentence, or an EOS taken), the next row allows only EOS and the rows after it are
        all-allowed. The state is left as it was (proposals consumed tentatively, then rolled back).

        Returns
        -------
        int32 [k+1, W] on the CPU.
        """
        k = len(proposed)
        out = torch.full((k + 1, self.words), -1, dtype=torch.int32)
        consumed = 0
        try:
            self.fill(out[0])
            for i, tok in enumerate(proposed):
                t = int(tok)
                if not 0 <= t < self.vocab_size or not (int(out[i, t // 32]) >> (t % 32)) & 1:
                    break  # rejected by the grammar: rows i+1.. stay all-allowed
                if self.matcher.is_stopped():
                    break  # the allowed EOS ends the output
                if not self.matcher.consume_token(t):
                    raise RuntimeError(f"GrammarState.masks_for_proposals: {self.matcher.get_error().strip()}")
                consumed += 1
                self.fill(out[i + 1])
        finally:
            self.rollback(consumed)
        return out
