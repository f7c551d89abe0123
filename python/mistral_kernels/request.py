"""One generation request's host state, shared by the scheduler, the model runner and the output processor.

The scheduler advances ``num_computed`` (tokens whose k/v are in the cache) and counts preemptions; the
output processor appends ``output_ids`` and sets the finish reason; the runner reads the token ids, the
sampling parameters and the request's own random generator. With speculative decoding the engine sets
``draft_ids`` (:mod:`.speculative`) before each step: tokens proposed to follow, verified in that step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .sampling_params import SamplingParams
from .structured.matcher import GrammarState

__all__ = ["CheckedRequest", "Request", "RequestTimings"]


@dataclass(frozen=True)
class CheckedRequest:
    """A request the engine has checked and can queue (:meth:`mistral_kernels.engine.Engine.check_request`).

    Attributes
    ----------
    prompt_ids : the prompt, ints in the vocabulary
    params : its sampling parameters, ``max_new_tokens`` resolved (never None)
    """

    prompt_ids: list[int]
    params: SamplingParams

    def for_choice(self, i: int) -> CheckedRequest:
        """The i-th choice of this request: its seed + i (``SamplingParams.for_choice``; the seed does not
        change admission)."""
        return self if i == 0 else CheckedRequest(self.prompt_ids, self.params.for_choice(i))


@dataclass
class RequestTimings:
    """Wall-clock seconds (``time.perf_counter``) of one request's life."""

    arrival: float = 0.0
    first_scheduled: float | None = None
    first_token: float | None = None
    finished: float | None = None

    @property
    def time_to_first_token(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival

    @property
    def total(self) -> float | None:
        return None if self.finished is None else self.finished - self.arrival


@dataclass
class Request:
    """A request inside the engine.

    Attributes
    ----------
    rid : engine id (arrival order)
    prompt_ids : the prompt as fed to the model
    params : sampling and stopping parameters
    generator : the request's own generator (seeded sampling), None = the runner's shared one
    timings : arrival / first scheduled / first token / finished
    output_ids : generated tokens so far
    num_computed : tokens (prompt + output) whose k/v are in the KV cache; 0 again after a preemption
    num_preemptions : how often the request was preempted and recomputed
    finish_reason : None while running; "stop" or "length"
    stop_reason : the matched stop string or stop / EOS token id
    grammar : the structured-output state when ``params.structured`` is set (it has consumed ``output_ids``)
    draft_ids : tokens proposed to follow (speculative decoding), verified when the request decodes in the next
        step; not part of the request's tokens until accepted
    draft_probs : float32 [len(draft_ids), V], the proposer's distribution of each; None = point masses
    """

    rid: int
    prompt_ids: list[int]
    params: SamplingParams
    generator: torch.Generator | None
    timings: RequestTimings
    output_ids: list[int] = field(default_factory=list)
    num_computed: int = 0
    num_preemptions: int = 0
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    grammar: GrammarState | None = None
    draft_ids: list[int] = field(default_factory=list)
    draft_probs: torch.Tensor | None = None

    @property
    def all_ids(self) -> list[int]:
        """Prompt + generated tokens."""
        return self.prompt_ids + self.output_ids

    @property
    def decoding(self) -> bool:
        """Past its prompt with only its last token not in the cache: the next step decodes it."""
        return self.num_computed == self.num_tokens - 1 and bool(self.output_ids)

    @property
    def num_draft(self) -> int:
        """Proposed tokens the next step verifies: the draft when the request decodes, else 0."""
        return len(self.draft_ids) if self.decoding else 0

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def token_ids(self, start: int, stop: int) -> list[int]:
        """Tokens at positions ``start`` … ``stop``-1 of prompt + output (without copying the whole sequence).

        Prompt [5, 6, 7], output [8, 9]: ``token_ids(2, 4)`` → [7, 8].
        """
        n = len(self.prompt_ids)
        if stop <= n:
            return self.prompt_ids[start:stop]
        if start >= n:
            return self.output_ids[start - n:stop - n]
        return self.prompt_ids[start:] + self.output_ids[:stop - n]
