""":class:`SpeculativeConfig`: how the engine speculates (which proposer, how many tokens, when not to).

Checked when made (a ValueError names the field). ``None`` in the engine = no speculation.

The batch threshold ``max_batch`` comes from the measured cost model in
benchmarks/results/cpu_speculative.md: a verify step (k+1 query rows per sequence) costs about a plain decode
step only while decode is memory-bound (weights streamed once for all rows); past that many decoding
sequences the extra rows cost more than the accepted tokens save, so a step with more decoding sequences runs
plain decode.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_MAX_BATCH", "DEFAULT_MAX_ROWS", "METHODS", "SpeculativeConfig"]

METHODS = ("ngram", "draft")
DEFAULT_MAX_BATCH = 2  # from the CPU cost model (benchmarks/results/cpu_speculative.md)
DEFAULT_MAX_ROWS = 16  # the CPU's fused decode step takes up to 16 rows (mistral_kernels.cpu_decode)


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding settings.

    Attributes
    ----------
    method : "ngram" (prompt lookup: propose what followed the last n tokens earlier in prompt + output) or
        "draft" (a smaller model with the same vocabulary proposes greedily)
    num_tokens : k, most tokens proposed per sequence and step (each verified in the same forward)
    ngram_max, ngram_min : the n-gram lengths tried, longest first
    draft_model : path of the draft model (method "draft")
    max_batch : speculate only in steps with at most this many decoding sequences
    max_rows : at most this many verify rows in a step (decoding sequences × (k+1)): k is cut to fit
    backoff : after a proposal is wholly rejected, the sequence skips proposing for 1, 2, 4 … up to this many
        steps (reset by an accepted token) and proposes one token at a time until one is accepted:
        all-rejected proposals then cost little (0 = never skip, always k)
    """

    method: str = "ngram"
    num_tokens: int = 3
    ngram_max: int = 4
    ngram_min: int = 2
    draft_model: str | None = None
    max_batch: int = DEFAULT_MAX_BATCH
    max_rows: int = DEFAULT_MAX_ROWS
    backoff: int = 16

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"speculative method must be one of {METHODS}, got {self.method!r}")
        if not 1 <= self.num_tokens <= 16:
            raise ValueError(f"num_speculative_tokens must be in [1, 16], got {self.num_tokens}")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError(f"need 1 ≤ ngram_min ≤ ngram_max, got ngram_min={self.ngram_min}, "
                             f"ngram_max={self.ngram_max}")
        if self.method == "draft" and not self.draft_model:
            raise ValueError("speculative method 'draft' needs draft_model (--draft-model PATH)")
        if self.method != "draft" and self.draft_model:
            raise ValueError(f"draft_model is given but the speculative method is {self.method!r}; use 'draft'")
        if self.max_batch < 1:
            raise ValueError(f"speculative max_batch must be ≥ 1, got {self.max_batch}")
        if self.max_rows < 2:
            raise ValueError(f"speculative max_rows must be ≥ 2 (one sequence, one proposal), got {self.max_rows}")
        if self.backoff < 0:
            raise ValueError(f"speculative backoff must be ≥ 0, got {self.backoff}")
