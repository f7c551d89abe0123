"""The engine's side of speculative decoding: before a step, ask the proposer for drafts of the decoding
requests; after it, count what was accepted and how many of each verify chunk's k/v stay.

Per step: no drafts when more requests decode than ``SpeculativeConfig.max_batch``. A request proposes at most
``num_tokens``, at most ``max_rows`` // (decoding requests) - 1, and never past its ``max_new_tokens`` (the last
new token is always the target's own) or the model's context.

Adapting to acceptance (``adaptive``, the default): within those caps each request proposes the k that
:meth:`.cost.CostModel.best_k` gives for its acceptance α (:class:`.cost.Acceptance`, updated after each of its
verify steps) and the step's B decoding requests; at k = 0 it decodes plainly and, after
:meth:`~.cost.CostModel.probe_interval` such steps, proposes one token (a probe). So a request whose
proposals are all wrong soon costs about a plain decode, and one whose proposals are right keeps the most.

Structured outputs: a constrained request's proposals are cut at the first one its grammar forbids
(``GrammarState.allowed_prefix``: the matcher after the proposals before it) — for point-mass proposals (n-gram,
or a greedy request) the row would only ever sample from its masked distribution, as a bonus row does; a
drawn proposal (a q) keeps that forbidden token, whose row then rejects it (p = 0 there) and redraws from
the residual, so the rejection rule stays exact. The runner masks every verify row with the grammar's state
after the proposals before it (:func:`~mistral_kernels.structured.bitmask.constrain_verify_logits`).

KV bookkeeping of a verify chunk (its request's last token + K proposals, at positions c … c+K): after the
step the request holds its last token, the accepted proposals d_1 … d_a and one more token t. Positions
c … c+a hold the right k/v (those tokens, each computed after the right prefix); position c+a+1 holds
d_{a+1}'s, not t's, so the chunk *keeps* 1 + a new tokens (``Scheduler.commit``) and t is the next step's
input; the slots c+a+1 … c+K are overwritten by later steps. Only blocks full of kept tokens get a content
address, so no prefix-cached block ever holds a rejected token. When a stop ends the request at the e-th new
token (e ≤ a), it keeps 1 + e.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..output import RequestOutput
from ..request import Request
from ..scheduler import SchedulerOutput
from .config import SpeculativeConfig
from .cost import Acceptance, CostModel, RowCostTracker
from .proposer import Proposer

__all__ = ["Speculator", "StepCounts"]


@dataclass
class _RequestState:
    acceptance: Acceptance = field(default_factory=Acceptance)
    plain: int = 0  # steps decoded plainly since the last proposal (k = 0)


@dataclass(frozen=True)
class StepCounts:
    """What a step's verification did: kept new tokens per chunk (``Scheduler.commit``), proposed and accepted
    tokens, verify chunks."""

    kept: list[int]
    proposed: int
    accepted: int
    verified: int


class Speculator:
    """Drafts for the engine's decoding requests (module docstring).

    Parameters
    ----------
    config : the speculative settings
    proposer : gives the drafts
    max_position : the model's context (no draft reaches past it)
    cost : the machine's cost model (kept when ``config.adaptive``, as ``cost``; None otherwise)
    """

    def __init__(self, config: SpeculativeConfig, proposer: Proposer, max_position: int,
                 cost: CostModel | None = None, calibrate: bool = False) -> None:
        if config.adaptive and cost is None:
            raise ValueError("Speculator: adaptive speculation needs a cost model (cost=CostModel(row_cost))")
        self.config = config
        self.proposer = proposer
        self.max_position = max_position
        # the cost model that adapts k: the given one when adaptive (required above), else None (fixed k)
        self.cost: CostModel | None = cost if config.adaptive else None
        # calibrate: ρ was measured (not fixed by the config), so the running steps may correct it
        self._tracker: RowCostTracker | None = RowCostTracker() if calibrate and self.cost is not None else None
        self._state: dict[int, _RequestState] = {}

    def observe_step(self, rows: int, seconds: float) -> None:
        """A decode-only step of ``rows`` rows (every sequence's token and proposals) took ``seconds``: with
        calibration on, ρ follows :class:`~.cost.RowCostTracker` once it has two row counts."""
        if self._tracker is None:
            return
        rho = self._tracker.observe(rows, seconds)
        if rho is not None:
            self.cost = CostModel(rho)

    def prepare(self, running: Sequence[Request]) -> None:
        """Set ``draft_ids`` (and ``draft_probs``) of the running requests for the next step."""
        for r in running:
            r.draft_ids, r.draft_probs = [], None
        decoding = [r for r in running if r.decoding]
        if not decoding or len(decoding) > self.config.max_batch:
            return
        most = self.config.max_rows // len(decoding) - 1
        asking, ks = [], []
        for r in decoding:
            left = r.params.max_new_tokens - len(r.output_ids) - 1  # type: ignore[operator]
            k = min(self.config.num_tokens, most, left, self.max_position - r.num_tokens)
            if k > 0 and self.cost is not None:
                k = self._adapted(self.cost, r.rid, k, len(decoding))
            if k > 0:
                asking.append(r)
                ks.append(k)
        if not asking:
            return
        for r, k, proposal in zip(asking, ks, self.proposer.propose(asking, ks)):
            ids = list(proposal.token_ids[:k])
            if r.grammar is not None and ids:
                allowed = r.grammar.allowed_prefix(ids)
                ids = ids[:allowed if proposal.probs is None else allowed + 1]  # (module docstring)
            r.draft_ids = ids
            r.draft_probs = None if proposal.probs is None else proposal.probs[:len(ids)]

    def _adapted(self, cost: CostModel, rid: int, most: int, batch: int) -> int:
        """The request's k this step (≤ ``most``): the cost model's for its acceptance, or a probe of 1 token
        after ``probe_interval`` plain steps."""
        st = self._request(rid)
        k = cost.best_k(st.acceptance.rate, most, batch)
        if k > 0:
            st.plain = 0
            return k
        st.plain += 1
        if st.plain <= cost.probe_interval():
            return 0
        st.plain = 0
        return 1

    def record(self, plan: SchedulerOutput, outputs: Sequence[RequestOutput],
               new_tokens: Sequence[Sequence[int]]) -> StepCounts:
        """After a verify step: ``new_tokens`` per sampling request (accepted proposals + one) and the outputs
        the output processor made of them (cut at a stop). Updates each request's acceptance; returns the
        step's counts."""
        kept: list[int] = []
        proposed = accepted = verified = 0
        i = 0
        for c in plan.chunks:
            if not c.samples:
                kept.append(c.num_new)
                continue
            emitted, new = len(outputs[i].token_ids), new_tokens[i]
            i += 1
            if not c.draft:
                kept.append(c.num_new)
                continue
            a = len(new) - 1
            kept.append(1 + min(a, emitted))
            proposed += len(c.draft)
            accepted += a
            verified += 1
            self._request(c.request.rid).acceptance.update(a, len(c.draft))
        return StepCounts(kept, proposed, accepted, verified)

    def acceptance(self, rid: int) -> float:
        """The request's acceptance estimate α (1 before its first verify step)."""
        return self._request(rid).acceptance.rate

    def _request(self, rid: int) -> _RequestState:
        st = self._state.get(rid)
        if st is None:
            st = self._state[rid] = _RequestState()
        return st

    def forget(self, rid: int) -> None:
        """The request left the engine (finished or aborted)."""
        self._state.pop(rid, None)
        self.proposer.forget(rid)
