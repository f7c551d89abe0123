"""The proposer interface: what a speculative decoding proposer gives the engine each step.

Shape letters: K proposed tokens of one sequence, V vocabulary.

A proposer sees the running sequences that decode in the next step (their prompt + generated tokens) and
returns, for each, up to ``k`` tokens it guesses will follow, with the distribution it drew them from: ``None``
for a point mass (n-gram lookup: the token was chosen, not sampled) or float32 [K, V] probabilities (a draft
model's q). The verifier accepts each with min(1, p/q) against the target's p (:mod:`.verify`), so a proposer
only changes speed, never the output distribution. EAGLE-style heads or MTP fit the same interface.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from ..request import Request

__all__ = ["Proposal", "Proposer"]


@dataclass(frozen=True)
class Proposal:
    """Tokens proposed to follow a sequence.

    Attributes
    ----------
    token_ids : K proposed tokens (may be empty: nothing to propose)
    probs : float32 [K, V], the proposer's distribution q of each token; None = point masses
    """

    token_ids: list[int] = field(default_factory=list)
    probs: torch.Tensor | None = None


class Proposer(Protocol):
    """Proposes continuations (see the module docstring)."""

    def propose(self, requests: Sequence[Request], k: Sequence[int]) -> list[Proposal]:
        """One :class:`Proposal` per request, at most ``k[i]`` tokens for ``requests[i]``."""
        ...

    def forget(self, rid: int) -> None:
        """The request finished or was aborted: drop any state kept for it."""
        ...
