"""The engine's side of speculative decoding: before a step, ask the proposer for drafts of the decoding
requests; after it, count what was accepted and how many of each verify chunk's k/v stay.

Per step: no drafts while a running request has a structured-output grammar (verify rows take no masks yet),
or when more requests decode than ``SpeculativeConfig.max_batch`` (a verify row costs more
than the tokens it brings there: the cost model in benchmarks/results/cpu_speculative.md). A request proposes
at most ``num_tokens``, at most ``max_rows`` // (decoding requests) - 1, and never past its
``max_new_tokens`` (the last new token is always the target's own) or the model's context.

Adapting to acceptance (with ``backoff`` > 0): each request proposes k_r tokens, k_r starting at
``num_tokens``; after a step that accepted a of its m proposals, k_r = a + 1 when some were rejected, one more
(up to ``num_tokens``) when all were accepted. A wholly rejected proposal also makes the request skip proposing
for 1 step, then 2, 4 … up to ``backoff`` steps after further wholly rejected ones; an accepted token resets
it. So a request whose proposals are all wrong verifies one token now and then: its steps cost about a plain
step's.

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
from dataclasses import dataclass

from ..output import RequestOutput
from ..request import Request
from ..scheduler import SchedulerOutput
from .config import SpeculativeConfig
from .proposer import Proposer

__all__ = ["Speculator", "StepCounts"]


@dataclass
class _Backoff:
    k: int  # tokens to propose next
    skip: int = 0  # steps left without proposing
    next: int = 1  # skip length after the next wholly rejected proposal


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
    """

    def __init__(self, config: SpeculativeConfig, proposer: Proposer, max_position: int) -> None:
        self.config = config
        self.proposer = proposer
        self.max_position = max_position
        self._backoff: dict[int, _Backoff] = {}

    def prepare(self, running: Sequence[Request]) -> None:
        """Set ``draft_ids`` (and ``draft_probs``) of the running requests for the next step."""
        for r in running:
            r.draft_ids, r.draft_probs = [], None
        decoding = [r for r in running if r.decoding]
        if not decoding or len(decoding) > self.config.max_batch:
            return
        if any(r.grammar is not None for r in running):
            # Structured outputs: the grammar masks apply to plain steps only (runner.execute); verify rows would
            # need each row's mask after its proposals (the hook in verify.target_tokens). Until then a step
            # with a constrained request does not speculate.
            return
        most = self.config.max_rows // len(decoding) - 1
        asking, ks = [], []
        for r in decoding:
            b = self._state(r.rid)
            if b.skip:
                b.skip -= 1
                continue
            k = min(b.k, most, r.params.max_new_tokens - len(r.output_ids) - 1,  # type: ignore[operator]
                    self.max_position - r.num_tokens)
            if k > 0:
                asking.append(r)
                ks.append(k)
        if not asking:
            return
        for r, k, proposal in zip(asking, ks, self.proposer.propose(asking, ks)):
            r.draft_ids = list(proposal.token_ids[:k])
            r.draft_probs = None if proposal.probs is None else proposal.probs[:len(r.draft_ids)]

    def record(self, plan: SchedulerOutput, outputs: Sequence[RequestOutput],
               new_tokens: Sequence[Sequence[int]]) -> StepCounts:
        """After a verify step: ``new_tokens`` per sampling request (accepted proposals + one) and the outputs
        the output processor made of them (cut at a stop). Updates the backoff; returns the step's counts."""
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
            b = self._state(c.request.rid)
            if not self.config.backoff:
                continue
            b.k = min(self.config.num_tokens, b.k + 1) if a == len(c.draft) else a + 1
            if a == 0:
                b.skip, b.next = b.next, min(2 * b.next, self.config.backoff)
            else:
                b.skip, b.next = 0, 1
        return StepCounts(kept, proposed, accepted, verified)

    def _state(self, rid: int) -> _Backoff:
        b = self._backoff.get(rid)
        if b is None:
            b = self._backoff[rid] = _Backoff(self.config.num_tokens)
        return b

    def forget(self, rid: int) -> None:
        """The request left the engine (finished or aborted)."""
        self._backoff.pop(rid, None)
        self.proposer.forget(rid)
