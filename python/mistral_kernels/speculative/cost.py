"""When speculation pays: the verify-row cost of this machine, each request's acceptance, and the k they give.

Shape letters: T tokens of the probe's context, N verify rows of a probe forward.

**Row cost** ρ — one extra query row of a decode step costs ρ of a one-row decode step: a step of n rows takes
t₁·(1 + ρ(n − 1)). Where decode streams the weights at memory bandwidth (a GPU, a large model) ρ is small; where
per-row compute dominates (a small model on a CPU) it nears 1 and speculation cannot pay. It is measured once
when the engine starts (:func:`measure_row_cost`: a decode-shaped forward of 1 row and of N = 1 + k rows of one
sequence, each warmed up once, the faster of two timed; ρ = (t_N / t₁ − 1) / (N − 1)) and recalibrated from
the engine's own decode steps as they run (:class:`RowCostTracker`), or fixed by ``SpeculativeConfig.row_cost``. A plain step of B decoding sequences (B rows) then takes 1 + ρ(B − 1),
and one whose request verifies k proposals 1 + ρ(B − 1 + k): the larger the batch, the larger a step already
is and the less an extra row costs relative to it — but the fewer of the step's tokens the row can add to
(the batch threshold of speculation falls out of the same measurement).

**Acceptance** α — each request keeps decayed counts of its proposals' outcomes (:class:`Acceptance`): a
verify step that accepted a of m proposals saw a successes in a + [a < m] trials (the proposals after the
first rejection were never tried); accepted ← λ·accepted + a, trials ← λ·trials + a + [a < m], λ =
:data:`ACCEPTANCE_DECAY`, α = accepted / trials, starting at 1 of 1 (a new request first tries the most).

**The k that pays** — with each proposal accepted with probability α, k proposals bring
E(k) = 1 + α + … + α^k = (1 − α^{k+1}) / (1 − α) tokens. In a step of B decoding sequences, a request that
verifies k proposals makes the step bring B − 1 + E(k) tokens in 1 + ρ(B − 1 + k) time, against B tokens in
1 + ρ(B − 1) plain. :meth:`CostModel.best_k` picks the k ≤ k_max with the most tokens per time, 0 (plain decode
for that request) unless some k beats plain strictly. A request at k = 0 *probes*: after
:meth:`CostModel.probe_interval` plain steps it proposes one token, whose outcome updates α; the interval
I = ⌈ρ / :data:`PROBE_SHARE`⌉ makes a probe row cost at most 2 % of the plain steps around it. Only the
target's rows are counted: a draft model's own forwards are not (with a draft model the rule is optimistic).

Worked example (ρ = 0.7, a 135M model on an idle 2-core CPU; B = 1): α = 0.6 → E(1)/1.7 = 0.94, E(2)/2.4 =
0.82 … all below 1: plain decode, a probe every ⌈0.7 / 0.02⌉ = 35 steps. α = 0.9 → E(1)/1.7 = 1.12,
E(2)/2.4 = 1.13, E(3)/3.1 = 1.11: k = 2. With ρ = 0.15 (the same CPU under load, or a larger model) α = 0.6 →
k = 2 (E(2)/1.3 = 1.51, E(3)/1.45 = 1.50). A request whose proposals are all rejected starts at k = 3 (α = 1);
after that first verify step α = 0.7/1.7 = 0.41 and k = 0 from then on at ρ = 0.7 (2.1 plain steps lost once),
then one probe row per 36 steps (0.7 of a step each: ~2 %).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..engine_sizing import fastest, scratch_forward

__all__ = ["ACCEPTANCE_DECAY", "PROBE_CONTEXT", "PROBE_SHARE", "ROW_COST_DECAY", "ROW_COST_MIN_WEIGHT", "Acceptance",
           "CostModel", "RowCostTracker", "measure_row_cost"]

ACCEPTANCE_DECAY = 0.7  # λ: an outcome's weight after each later verify step (~3 steps of memory)
PROBE_SHARE = 0.02  # most share of plain decode time spent on probe rows
PROBE_CONTEXT = 64  # tokens of context the row-cost probe decodes after
ROW_COST_DECAY = 0.95  # a timed step's weight after each later step of the same row count (~20 steps of memory)
ROW_COST_MIN_WEIGHT = 2.5  # decayed weight a row count needs before its mean counts (3 steps: 1 + 0.95 + 0.95²)


@dataclass
class Acceptance:
    """A request's decayed proposal outcomes (module docstring); ``rate`` is α."""

    accepted: float = 1.0
    trials: float = 1.0

    def update(self, accepted: int, proposed: int) -> None:
        """One verify step of ``proposed`` ≥ 1 proposals, the first ``accepted`` of them kept."""
        if not 0 <= accepted <= proposed or proposed < 1:
            raise ValueError(f"Acceptance.update: need 0 ≤ accepted ≤ proposed, proposed ≥ 1; got {accepted}, "
                             f"{proposed}")
        self.accepted = ACCEPTANCE_DECAY * self.accepted + accepted
        self.trials = ACCEPTANCE_DECAY * self.trials + accepted + (accepted < proposed)

    @property
    def rate(self) -> float:
        return self.accepted / self.trials


@dataclass(frozen=True)
class CostModel:
    """The speculation rule of a machine whose extra verify row costs ``row_cost`` (ρ) of a one-row decode step."""

    row_cost: float

    def __post_init__(self) -> None:
        if not (self.row_cost >= 0 and math.isfinite(self.row_cost)):
            raise ValueError(f"speculative row_cost must be a finite number ≥ 0, got {self.row_cost}")

    @staticmethod
    def expected_tokens(alpha: float, k: int) -> float:
        """E(k): tokens a verify step of k proposals brings when each is accepted with probability ``alpha``."""
        return float(k + 1) if alpha >= 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)

    def best_k(self, alpha: float, k_max: int, batch: int = 1) -> int:
        """The k in 0 … ``k_max`` that gives a step of ``batch`` decoding sequences the most tokens per time when
        this request verifies k proposals; 0 unless one beats plain decode strictly (module docstring)."""
        rho, others = self.row_cost, batch - 1
        best, value = 0, batch / (1.0 + rho * others)
        for k in range(1, k_max + 1):
            v = (others + self.expected_tokens(alpha, k)) / (1.0 + rho * (others + k))
            if v > value * (1.0 + 1e-9):
                best, value = k, v
        return best

    def probe_interval(self) -> int:
        """Plain steps between two probes of a request at k = 0: ⌈ρ / PROBE_SHARE⌉ (at least 1)."""
        return max(1, math.ceil(self.row_cost / PROBE_SHARE - 1e-9))


class RowCostTracker:
    """ρ recalibrated from the engine's own decode-only steps, so that a start-up measurement taken under other
    load than the run sees does not decide every step after it. Per total row count n of a step, a decayed mean
    of its seconds (each step's weight × :data:`ROW_COST_DECAY` per later step of that n); once two or more row
    counts have a decayed weight ≥ :data:`ROW_COST_MIN_WEIGHT`, the weighted least-squares line t = a + b·n through
    their means gives t₁ = a + b and ρ = b / t₁ (the module's t₁·(1 + ρ(n − 1))). Plain steps give n = B, probes
    and verify steps n = B + k, so an adaptive engine always sees two row counts.

    Worked example: mean 10 ms over steps of 1 row and 13 ms over steps of 2 → b = 3 ms, a = 7 ms, t₁ = 10 ms,
    ρ = 0.3."""

    def __init__(self) -> None:
        self._mean: dict[int, float] = {}
        self._weight: dict[int, float] = {}

    def observe(self, rows: int, seconds: float) -> float | None:
        """A decode-only step of ``rows`` rows took ``seconds``; returns ρ (None until two row counts count)."""
        if rows < 1 or not (seconds > 0 and math.isfinite(seconds)):
            raise ValueError(f"RowCostTracker.observe: need rows ≥ 1 and finite seconds > 0, got {rows}, {seconds}")
        w = ROW_COST_DECAY * self._weight.get(rows, 0.0)
        self._mean[rows] = (w * self._mean.get(rows, 0.0) + seconds) / (w + 1.0)
        self._weight[rows] = w + 1.0
        return self.row_cost()

    def row_cost(self) -> float | None:
        """ρ from the row counts that count, or None (fewer than two, or a line with t₁ ≤ 0)."""
        pts = [(n, self._mean[n], w) for n, w in self._weight.items() if w >= ROW_COST_MIN_WEIGHT]
        if len(pts) < 2:
            return None
        total = sum(w for _, _, w in pts)
        n_bar = sum(w * n for n, _, w in pts) / total
        t_bar = sum(w * t for _, t, w in pts) / total
        b = sum(w * (n - n_bar) * (t - t_bar) for n, t, w in pts) / sum(w * (n - n_bar) ** 2 for n, _, w in pts)
        t1 = t_bar + b * (1 - n_bar)
        return max(0.0, b / t1) if t1 > 0 else None


def measure_row_cost(model: Any, block_size: int, rows: int) -> float:
    """ρ of ``model`` on its device (module docstring): one sequence of :data:`PROBE_CONTEXT` tokens prefilled into
    a scratch KV cache, then decode-shaped forwards of 1 and of ``rows`` single-token rows after it."""
    if rows < 2:
        raise ValueError(f"measure_row_cost: rows must be ≥ 2, got {rows}")
    context = max(1, min(PROBE_CONTEXT, model.config.max_position - rows))
    forward = scratch_forward(model, block_size, context + rows)
    forward([0], [context + rows])  # the context's k/v (and the verify rows' slots) written once
    best = {n: fastest(lambda n=n: forward([context + j for j in range(n)], [1] * n))  # n single-token rows
            for n in (1, rows)}
    return max(0.0, (best[rows] / best[1] - 1.0) / (rows - 1))
