"""N-gram prompt lookup: propose what followed the sequence's last n tokens the last time they occurred.

For n from ``n_max`` down to ``n_min``: find the most recent earlier occurrence of the last n tokens in the
sequence (prompt + generated); the (up to k) tokens after it are the proposal. Example, n 2..3, k 3:
tokens ``a b c d x a b`` → the 3-gram ``x a b`` has no earlier match, the 2-gram ``a b`` matches at 0 →
propose ``c d x``. Tasks that copy from their input (edits, rewrites, code changes, extraction,
summaries quoting the text) get long accepted runs; open generation gets few proposals, so little cost.

The search is C-level: the sequence as int32 bytes, ``bytes.rfind`` of the pattern (a match must sit on a
4-byte boundary; misaligned ones are skipped).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from ..request import Request
from .proposer import Proposal

__all__ = ["NgramProposer", "ngram_lookup"]


def ngram_lookup(tokens: Sequence[int], k: int, n_max: int, n_min: int) -> list[int]:
    """The up-to-``k`` tokens that followed the most recent earlier occurrence of the longest suffix of
    ``tokens`` of length n_max … n_min (module docstring); [] when none occurs earlier or k < 1."""
    total = len(tokens)
    if k < 1 or total < n_min + 1:
        return []
    data = array("i", tokens).tobytes()
    for n in range(min(n_max, total - 1), n_min - 1, -1):
        pattern = data[4 * (total - n):]
        end = 4 * (total - 1)  # a match starts at token ≤ total-n-1: at least one token follows it
        while (at := data.rfind(pattern, 0, end)) >= 0:
            if at % 4 == 0:
                start = at // 4 + n
                return list(tokens[start:start + k])
            end = at + 4 * n - 1  # misaligned hit: look again strictly before it
    return []


class NgramProposer:
    """Prompt-lookup proposer (module docstring); keeps no per-request state."""

    def __init__(self, n_max: int = 4, n_min: int = 2) -> None:
        if not 1 <= n_min <= n_max:
            raise ValueError(f"NgramProposer: need 1 ≤ n_min ≤ n_max, got n_min={n_min}, n_max={n_max}")
        self.n_max, self.n_min = n_max, n_min

    def propose(self, requests: Sequence[Request], k: Sequence[int]) -> list[Proposal]:
        return [Proposal(ngram_lookup(r.all_ids, n, self.n_max, self.n_min)) for r, n in zip(requests, k)]

    def forget(self, rid: int) -> None:
        return None
