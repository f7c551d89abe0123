"""When speculation pays: the verify-row cost of this machine, each request's acceptance, and the k they give.

Shape letters: T tokens of the probe's context, N verify rows of a probe forward.

**Row cost** ρ — one extra query row of a decode step costs ρ of a one-row decode step: a step of n rows takes
t₁·(1 + ρ(n − 1)). Where decode streams the weights at memory bandwidth (a GPU, a large model) ρ is small; where
per-row compute dominates (a small model on a CPU) it nears 1 and speculation cannot pay. It is measured once
when the engine starts (:func:`measure_row_cost`: a decode-shaped forward of 1 row and of N = 1 + k rows of one
sequence, each warmed up once, the faster of two timed; ρ = (t_N / t₁ − 1) / (N − 1)), or fixed by
``SpeculativeConfig.row_cost``. A plain step of B decoding sequences (B rows) then takes 1 + ρ(B − 1),
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

__all__ = ["ACCEPTANCE_DECAY", "PROBE_CONTEXT", "PROBE_SHARE", "Acceptance", "CostModel", "measure_row_cost"]

ACCEPTANCE_DECAY = 0.7  # λ: an outcome's weight after each later verify step (~3 steps of memory)
PROBE_SHARE = 0.02  # most share of plain decode time spent on probe rows
PROBE_CONTEXT = 64  # tokens of context the row-cost probe decodes after


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
