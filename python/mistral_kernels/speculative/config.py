""":class:`SpeculativeConfig`: how the engine speculates (which proposer, how many tokens, when not to).

Checked when made (a ValueError names the field). ``None`` in the engine = no speculation.

Within the hard caps ``max_batch`` and ``max_rows``, each request's k follows its acceptance and the verify-row
cost of the machine (:mod:`.cost`: measured when the engine starts unless ``row_cost`` fixes it), down to 0 —
plain decode for that request, with a probe now and then — when speculation does not pay. ``max_batch`` is a
cap from the CPU measurements in benchmarks/results/cpu_speculative.md (past a few decoding sequences a verify
row costs about a whole row's share of the step there); the cost model turns speculation off earlier where it
does not pay.
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
    adaptive : each request's k from its acceptance and the cost model (:mod:`.cost`), 0 when speculation does
        not pay (probing now and then); False: always ``num_tokens`` (within the caps)
    row_cost : ρ, one extra verify row's cost as a share of a one-row decode step; None (default): measured
        on the model when the engine starts (:func:`.cost.measure_row_cost`); a number fixes it (tests,
        or a value measured before)
    """

    method: str = "ngram"
    num_tokens: int = 3
    ngram_max: int = 4
    ngram_min: int = 2
    draft_model: str | None = None
    max_batch: int = DEFAULT_MAX_BATCH
    max_rows: int = DEFAULT_MAX_ROWS
    adaptive: bool = True
    row_cost: float | None = None

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
        if self.row_cost is not None and not 0 <= self.row_cost < float("inf"):
            raise ValueError(f"speculative row_cost must be a finite number ≥ 0 (or None: measured), got "
                             f"{self.row_cost}")
