"""Continuous-batching generation engine over the paged KV cache.

The engine composes three parts, each step in this order:

=====================  ==========================================================================
part                   role
=====================  ==========================================================================
:mod:`.scheduler`      decide which requests run how many tokens within the token budget
                       (``max_tokens_per_step``), the batch cap (``max_batch``) and the free KV
                       blocks, and which are preempted (recomputed later); host bookkeeping only
:mod:`.runner`         build the input tensors and :class:`~mistral_kernels.batch.AttentionBatch`,
                       run ``model.forward``, sample; returns the sampled ids (and log-probabilities)
:mod:`.output`         detokenise, apply stop strings / EOS / max tokens, produce the step's outputs
=====================  ==========================================================================

The step's contract: :meth:`Engine.step` returns one :class:`~mistral_kernels.output.RequestOutput` per
request that got a token in it (batch order): the new token ids, the text that became final, their
log-probabilities, and for a request that finished its :class:`Completion` — the engine then forgets it
(its KV blocks are free). Callers read these outputs and nothing else: :meth:`Engine.iterate` /
:meth:`Engine.run` (and so ``LLM.generate`` / ``LLM.stream``) and the server's engine loop.

Admission is the engine's: :meth:`Engine.check_request` checks a request once (prompt ids, the model's
context, the KV pool: :meth:`Engine.max_new_tokens_for`) and gives a :class:`CheckedRequest` that
:meth:`Engine.add_checked` queues without checking again; :meth:`Engine.add_request` is both.
:class:`~mistral_kernels.stats.EngineStats` keeps the counters of the stats line.

Speculative decoding (``speculative=``, :mod:`.speculative`): before scheduling, the decoding requests get
proposed tokens (``Request.draft_ids``); the scheduler puts them in their chunks, the runner verifies them
(:meth:`~mistral_kernels.runner.ModelRunner.execute_verify`), the output processor takes each request's
accepted run (cut at a stop), and the commit keeps the k/v of the accepted tokens only.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Generator, Sequence
from typing import Any

import torch

from .cache import BlockManager, cache_salt
from .output import Completion, OutputProcessor, RequestOutput
from .request import CheckedRequest, Request, RequestTimings
from .runner import ModelRunner, PagedModel
from .sampling_params import SamplingParams
from .scheduler import AdmissionError, Scheduler
from .speculative.config import SpeculativeConfig
from .speculative.cost import CostModel, measure_row_cost
from .speculative.ngram import NgramProposer
from .speculative.proposer import Proposer
from .speculative.speculator import Speculator
from .stats import DecodeTraffic, EngineStats
from .structured.grammar import GrammarCompiler
from .tokenization import Tokenizer

__all__ = ["AdmissionError", "CheckedRequest", "Completion", "Engine", "EngineStats", "PagedModel",
           "RequestOutput", "RequestTimings"]


class Engine:
    """Continuous batching over a model with a paged KV cache.

    Parameters
    ----------
    model : PagedModel
        Provides ``config``, ``device``, ``new_cache(num_blocks, block_size)`` and
        ``forward(token_ids [T], batch, cache) -> logits [N, V]``.
    tokenizer : Tokenizer or None
        For EOS ids, text output and stop strings; None → token ids only (``eos_ids`` then apply).
    num_blocks, block_size : int
        KV cache pool.
    max_batch : int
        Most sequences in one step.
    max_tokens_per_step : int
        Token budget of one step (prefill chunks are cut to it).
    eos_ids : token ids that end generation (default: the tokenizer's).
    prefix_caching : bool
        Share the KV blocks of common prompt prefixes between requests (:mod:`.cache`; on by default).
    enforce_eager : decode steps without CUDA graphs (see :class:`~mistral_kernels.runner.ModelRunner`;
        None = graphs on CUDA, plain forward elsewhere).
    speculative : speculative decoding settings; None = off
    proposer : the proposer for ``speculative`` (default: :class:`~mistral_kernels.speculative.NgramProposer`
        for method "ngram"; method "draft" needs one, e.g. :class:`~mistral_kernels.speculative.draft.DraftProposer`)
    """

    def __init__(self, model: PagedModel, tokenizer: Tokenizer | None, *, num_blocks: int, block_size: int = 16,
                 max_batch: int = 8, max_tokens_per_step: int = 512, eos_ids: Sequence[int] | None = None,
                 prefix_caching: bool = True, enforce_eager: bool | None = None,
                 speculative: SpeculativeConfig | None = None, proposer: Proposer | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = model.config
        blocks = BlockManager(num_blocks, block_size, model.config.sliding_window, prefix_caching=prefix_caching,
                              salt=cache_salt(model.config, model.dtype))
        self.scheduler = Scheduler(blocks, max_batch, max_tokens_per_step)
        self.runner = ModelRunner(model, blocks.num_physical_blocks, block_size, max_batch=max_batch,
                                  enforce_eager=enforce_eager, verify_rows=0 if speculative is None else
                                  min(min(max_batch, speculative.max_batch) * (1 + speculative.num_tokens),
                                      speculative.max_rows))
        if eos_ids is None:
            eos_ids = sorted(tokenizer.eos_ids) if tokenizer is not None else list(model.config.eos_token_ids)
        self.output = OutputProcessor(tokenizer, eos_ids)
        self.runner.eos_ids = self.output.eos_ids
        # structured outputs: the grammars compiled against the tokenizer (its vocabulary built on first use)
        self.grammars = GrammarCompiler(tokenizer, model.config.vocab_size, self.output.eos_ids) \
            if tokenizer is not None else None
        self.stats = EngineStats()
        self.speculator: Speculator | None = None
        if speculative is not None:
            if proposer is None and speculative.method != "ngram":
                raise ValueError(f"Engine: speculative method {speculative.method!r} needs a proposer")
            proposer = proposer or NgramProposer(speculative.ngram_max, speculative.ngram_min)
            cost = _cost_model(model, speculative, block_size) if speculative.adaptive else None
            # a measured ρ follows the running steps, except under tensor parallelism (ranks must schedule alike)
            calibrate = speculative.row_cost is None and getattr(model, "broadcast_tokens", None) is None
            self.speculator = Speculator(speculative, proposer, model.config.max_position, cost, calibrate)
        self._traffic = DecodeTraffic.of(model)
        self._next_id = 0
        # outputs that :meth:`iterate` stepped for requests it was not iterating, kept for their own caller
        self._backlog: dict[int, list[RequestOutput]] = {}

    # ------------------------------------------------------------------ parts
    @property
    def speculative_cost(self) -> CostModel | None:
        """The cost model adaptive speculation uses (None: no speculation, or not adaptive)."""
        return None if self.speculator is None else self.speculator.cost

    @property
    def blocks(self) -> BlockManager:
        """The KV block pool (owned by the scheduler)."""
        return self.scheduler.blocks

    @property
    def cache(self) -> Any:
        """The paged KV cache (owned by the runner)."""
        return self.runner.cache

    @property
    def device(self) -> torch.device:
        return self.runner.device

    @property
    def eos_ids(self) -> frozenset[int]:
        return self.output.eos_ids

    @property
    def max_batch(self) -> int:
        return self.scheduler.max_batch

    @property
    def max_tokens_per_step(self) -> int:
        return self.scheduler.max_tokens_per_step

    # ------------------------------------------------------------------ admission
    def max_new_tokens_for(self, num_prompt: int, max_new_tokens: int | None = None, copies: int = 1) -> int:
        """The admission rule: how many tokens a request with ``num_prompt`` prompt tokens may generate.

        ``max_new_tokens`` given: it, if prompt + it fit the model's context and the KV pool (``copies`` such
        requests together); None: the most that fits alone (the model's context, the KV pool).

        Raises
        ------
        AdmissionError
            The request can never run; ``argument`` says what to lower ("prompt_ids", "max_new_tokens",
            "copies").
        """
        max_position = self.config.max_position
        if num_prompt >= max_position:
            raise AdmissionError(f"the prompt is {num_prompt} tokens; the model's max_position is {max_position}",
                                 "prompt_ids")
        if max_new_tokens is None:
            self.scheduler.check_fits(num_prompt, 1)
            blocks = self.scheduler.blocks
            limit = min(max_position, blocks.num_blocks * blocks.block_size) - num_prompt
            max_new_tokens = self.scheduler.most_new_tokens(num_prompt, limit)
        total = num_prompt + max_new_tokens
        if total > max_position:
            raise AdmissionError(f"prompt ({num_prompt} tokens) + max_new_tokens ({max_new_tokens}) = {total} "
                                 f"exceeds the model's max_position {max_position}", "max_new_tokens")
        self.scheduler.check_fits(num_prompt, max_new_tokens, copies)
        return max_new_tokens

    def check_request(self, prompt_ids: Sequence[int], params: SamplingParams | None = None,
                      copies: int = 1) -> CheckedRequest:
        """Check a request without queueing it (``copies``: that many of it must fit the KV pool together).
        Thread-safe: reads only the engine's fixed sizes.

        Raises
        ------
        ValueError
            Empty prompt or token ids outside the vocabulary; an invalid ``params.structured`` (the grammar
            library's message); an :class:`AdmissionError` when it can never run (see
            :meth:`max_new_tokens_for`).
        """
        params = params or SamplingParams()
        ids = [int(t) for t in prompt_ids]
        if not ids:
            raise ValueError("prompt_ids is empty (need at least one token)")
        v = self.config.vocab_size
        bad = [t for t in ids if not 0 <= t < v]
        if bad:
            raise ValueError(f"prompt_ids contains {bad[:5]} outside the vocabulary [0, {v})")
        params.check_vocabulary(v)
        if params.structured is not None:
            if self.grammars is None:
                raise ValueError("params.structured needs an engine with a tokenizer (grammars match text)")
            self.grammars.compile(params.structured)  # compiled once and cached: a bad spec fails here
        n = self.max_new_tokens_for(len(ids), params.max_new_tokens, copies)
        if n != params.max_new_tokens:
            params = dataclasses.replace(params, max_new_tokens=n)
        return CheckedRequest(ids, params)

    def add_checked(self, request: CheckedRequest) -> int:
        """Queue a request :meth:`check_request` gave; it joins the batch at the next :meth:`step`. Returns its id."""
        params = request.params
        r = Request(self._next_id, list(request.prompt_ids), params, self.runner.generator_for(params),
                    RequestTimings(arrival=time.perf_counter()))
        if params.structured is not None and self.grammars is not None:
            r.grammar = self.grammars.state(params.structured)
        self._next_id += 1
        self.output.add(r)
        self.scheduler.add(r)
        return r.rid

    def add_request(self, prompt_ids: Sequence[int], params: SamplingParams | None = None) -> int:
        """:meth:`check_request` then :meth:`add_checked`. Returns the request's id.

        Raises
        ------
        ValueError
            As :meth:`check_request`; nothing is queued then.
        """
        return self.add_checked(self.check_request(prompt_ids, params))

    # ------------------------------------------------------------------ requests
    def has_unfinished(self) -> bool:
        return bool(self.scheduler.num_waiting or self.scheduler.num_running)

    @property
    def num_running(self) -> int:
        return self.scheduler.num_running

    @property
    def num_waiting(self) -> int:
        return self.scheduler.num_waiting

    def has_request(self, rid: int) -> bool:
        """The request is queued or running, or has outputs :meth:`iterate` keeps for it."""
        return self.output.has(rid) or rid in self._backlog

    def abort(self, rid: int) -> bool:
        """Drop a request, finished or not: its KV blocks return to the pool at once and its kept outputs are
        discarded. Returns False when no such request exists (finished and handed out, or aborted)."""
        kept = self._backlog.pop(rid, None)
        request = self.scheduler.abort(rid)
        if self.speculator is not None:
            self.speculator.forget(rid)
        self.output.drop(rid)
        return kept is not None or request is not None

    def abort_all(self, rids: Sequence[int]) -> int:
        """:meth:`abort` each request; returns how many existed."""
        return sum(self.abort(rid) for rid in rids)

    # ------------------------------------------------------------------ one step
    def step(self) -> list[RequestOutput]:
        """Run one forward over the scheduled mix; the outputs of the requests that got a token, in batch
        order (see the module docstring). A finished request's output carries its completion; the engine
        holds nothing of it afterwards."""
        if self.speculator is not None:
            self.speculator.prepare(self.scheduler.running())
        plan = self.scheduler.schedule()
        self.stats.preemptions += plan.num_preempted
        if not plan.chunks:
            if self.scheduler.num_waiting and not self.scheduler.num_running:
                raise RuntimeError("Engine.step: no request can be scheduled although none is running "
                                   "(KV cache too small); raise num_blocks")
            return []
        t0 = time.perf_counter()
        requests = plan.sampling_requests
        if self.speculator is not None and any(c.draft for c in plan.chunks):
            new, new_logprobs = self.runner.execute_verify(plan)
            now = time.perf_counter()
            outputs = self.output.process_many(requests, new, now, new_logprobs)  # before commit: token ids
            counts = self.speculator.record(plan, outputs, new)
            self.scheduler.commit(plan, counts.kept)
            self.stats.record_speculation(counts.proposed, counts.accepted, counts.verified)
        else:
            sampled, logprobs = self.runner.execute(plan)
            now = time.perf_counter()
            self.scheduler.commit(plan)
            outputs = self.output.process(requests, sampled, now, logprobs)
        if self.speculator is not None and all(c.is_decode for c in plan.chunks):
            self.speculator.observe_step(sum(c.num_new for c in plan.chunks), now - t0)
        for r, out in zip(requests, outputs):
            if out.completion is not None:
                self.scheduler.finish(r)
                if self.speculator is not None:
                    self.speculator.forget(r.rid)
        self.stats.record_step(plan, sum(len(out.token_ids) for out in outputs), now - t0, self._traffic)
        return outputs

    # ------------------------------------------------------------------ stepping for callers
    def iterate(self, rids: Sequence[int]) -> Generator[RequestOutput, None, None]:
        """Step until the given requests finish, yielding their outputs as they come (each request's last one
        carries its completion). Outputs of other requests stepped meanwhile are kept for their own
        :meth:`iterate` / :meth:`run`.

        If a step raises, or the iteration is closed early (``close()``, garbage collection, an interrupt),
        the given requests that have not finished are aborted: their KV blocks return to the pool.

        Raises
        ------
        ValueError
            An id that is not in the engine (never added, handed out or aborted).
        """
        wanted = list(dict.fromkeys(rids))
        unknown = [rid for rid in wanted if not self.has_request(rid)]
        if unknown:
            raise ValueError(f"Engine.iterate: no request with id(s) {unknown[:5]} (never added, finished and "
                             "handed out, or aborted)")
        return self._iterate(wanted)

    def _iterate(self, wanted: list[int]) -> Generator[RequestOutput, None, None]:
        pending = set(wanted)
        try:
            for rid in wanted:
                for out in self._backlog.pop(rid, ()):
                    if out.completion is not None:
                        pending.discard(rid)
                    yield out
            while pending:
                for out in self.step():
                    if out.request_id in pending:
                        if out.completion is not None:
                            pending.discard(out.request_id)
                        yield out
                    else:
                        self._backlog.setdefault(out.request_id, []).append(out)
        finally:
            self.abort_all(list(pending))

    def run(self, rids: Sequence[int] | None = None) -> list[Completion]:
        """Step until the given requests (default: all) finish; return their completions in id order.

        If a step raises (or the call is interrupted, e.g. KeyboardInterrupt), the given requests are aborted
        before the exception propagates: their KV blocks return to the pool and nothing of them is kept.

        Raises
        ------
        ValueError
            An id that is not in the engine (never added, handed out or aborted).
        """
        wanted = list(rids) if rids is not None else self.scheduler.request_ids() + list(self._backlog)
        done = {out.request_id: out.completion for out in self.iterate(wanted) if out.completion is not None}
        return [done[rid] for rid in sorted(set(wanted))]

    def generate(self, requests: Sequence[tuple[Sequence[int], SamplingParams]],
                 name: str = "requests") -> list[Completion]:
        """Check every (prompt ids, params) first (nothing is queued if one is bad), then queue and :meth:`run`
        them all; completions in the given order. A failed or interrupted call leaves the engine as it found
        it (its requests aborted, their blocks freed).

        Raises
        ------
        ValueError
            ``requests[i]`` is invalid (see :meth:`check_request`); the message begins ``{name}[i]: ``.
        """
        checked = []
        for i, (ids, params) in enumerate(requests):
            try:
                checked.append(self.check_request(ids, params))
            except ValueError as e:
                raise ValueError(f"{name}[{i}]: {e}") from e
        rids: list[int] = []
        try:
            for c in checked:
                rids.append(self.add_checked(c))
        except BaseException:
            self.abort_all(rids)
            raise
        return self.run(rids)  # rids increase, so id order is the given order


def _cost_model(model: PagedModel, config: SpeculativeConfig, block_size: int) -> CostModel:
    """The speculation cost model: ``config.row_cost``, or measured on ``model`` now (rows of a verify step of
    one sequence at the most proposals); rank 0's on every tensor-parallel rank (they must schedule alike)."""
    rho = config.row_cost
    if rho is None:
        rho = measure_row_cost(model, block_size, 1 + min(config.num_tokens, config.max_rows - 1))
        broadcast = getattr(model, "broadcast_tokens", None)
        if broadcast is not None:  # tensor parallel: rank 0's measurement, in millionths
            sent = torch.tensor([round(rho * 1e6)], dtype=torch.int64, device=model.device)
            rho = int(broadcast(sent).cpu()[0]) / 1e6
    return CostModel(rho)
