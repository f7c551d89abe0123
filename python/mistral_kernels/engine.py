"""Continuous-batching generation engine over the paged KV cache.

The engine composes three parts, each step in this order:

=====================  ==========================================================================
part                   role
=====================  ==========================================================================
:mod:`.scheduler`      decide which requests run how many tokens within the token budget
                       (``max_tokens_per_step``), the batch cap (``max_batch``) and the free KV
                       blocks, and which are preempted (recomputed later); host bookkeeping only
:mod:`.runner`         build the input tensors and :class:`~mistral_kernels.batch.AttentionBatch`,
                       run ``model.forward``, sample; reads back only the sampled ids
:mod:`.output`         detokenise, apply stop strings / EOS / max tokens, produce completions
=====================  ==========================================================================

A request that could never fit in the KV cache even alone is rejected by :meth:`Engine.add_request` with
a clear error; :class:`~mistral_kernels.stats.EngineStats` keeps the counters of the stats line.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from .cache import BlockManager, cache_salt
from .logprobs import TokenLogprob
from .output import Completion, OutputProcessor
from .request import Request, RequestTimings
from .runner import ModelRunner, PagedModel
from .sampling import SamplingParams
from .scheduler import Scheduler
from .stats import DecodeTraffic, EngineStats
from .tokenization import Tokenizer

__all__ = ["Completion", "Engine", "EngineStats", "PagedModel", "RequestTimings"]


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
    """

    def __init__(self, model: PagedModel, tokenizer: Tokenizer | None, *, num_blocks: int, block_size: int = 16,
                 max_batch: int = 8, max_tokens_per_step: int = 512, eos_ids: Sequence[int] | None = None,
                 prefix_caching: bool = True, enforce_eager: bool | None = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = model.config
        blocks = BlockManager(num_blocks, block_size, model.config.sliding_window, prefix_caching=prefix_caching,
                              salt=cache_salt(model.config, model.dtype))
        self.scheduler = Scheduler(blocks, max_batch, max_tokens_per_step)
        self.runner = ModelRunner(model, blocks.num_physical_blocks, block_size, max_batch=max_batch,
                                  enforce_eager=enforce_eager)
        if eos_ids is None:
            eos_ids = sorted(tokenizer.eos_ids) if tokenizer is not None else list(model.config.eos_token_ids)
        self.output = OutputProcessor(tokenizer, eos_ids)
        self.stats = EngineStats()
        self._traffic = DecodeTraffic.of(model)
        self._next_id = 0
        self._finished: dict[int, Request] = {}
        self.last_sampled: list[int] = []  # ids of the requests that got a token in the last step

    # ------------------------------------------------------------------ parts
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

    # ------------------------------------------------------------------ requests
    def check_request(self, prompt_ids: Sequence[int], params: SamplingParams | None = None) -> list[int]:
        """Validate a request without queueing it; returns its prompt as a list of ints.

        Raises
        ------
        ValueError
            Empty prompt, token ids outside the vocabulary, longer than the model's positions, or a request
            that cannot fit in the KV cache even alone.
        """
        params = params or SamplingParams()
        ids = [int(t) for t in prompt_ids]
        if not ids:
            raise ValueError("add_request: prompt_ids is empty (need at least one token)")
        v = self.config.vocab_size
        bad = [t for t in ids if not 0 <= t < v]
        if bad:
            raise ValueError(f"add_request: prompt_ids contains {bad[:5]} outside the vocabulary [0, {v})")
        total = len(ids) + params.max_new_tokens
        if total > self.config.max_position:
            raise ValueError(f"add_request: prompt ({len(ids)} tokens) + max_new_tokens ({params.max_new_tokens}) "
                             f"= {total} exceeds the model's max_position {self.config.max_position}")
        self.scheduler.check_fits(len(ids), params.max_new_tokens)
        return ids

    def add_request(self, prompt_ids: Sequence[int], params: SamplingParams | None = None) -> int:
        """Queue a request; it joins the batch at the next :meth:`step`. Returns its id.

        Raises
        ------
        ValueError
            As :meth:`check_request`; nothing is queued then.
        """
        params = params or SamplingParams()
        ids = self.check_request(prompt_ids, params)
        request = Request(self._next_id, ids, params, self.runner.generator_for(params),
                          RequestTimings(arrival=time.perf_counter()))
        self._next_id += 1
        self.output.add(request)
        self.scheduler.add(request)
        return request.rid

    def has_unfinished(self) -> bool:
        return bool(self.scheduler.num_waiting or self.scheduler.num_running)

    @property
    def num_running(self) -> int:
        return self.scheduler.num_running

    @property
    def num_waiting(self) -> int:
        return self.scheduler.num_waiting

    def is_finished(self, rid: int) -> bool:
        return rid in self._finished

    def pop_completion(self, rid: int) -> Completion:
        """The finished request's :class:`Completion` (removed from the engine)."""
        return self.output.completion(self._finished.pop(rid))

    def abort(self, rid: int) -> bool:
        """Drop a request, finished or not: its KV blocks return to the pool at once and its completion is
        discarded. Returns False when no such request exists (already popped or aborted)."""
        request = self._finished.pop(rid, None) or self.scheduler.abort(rid)
        if request is None:
            return False
        self.output.drop(rid)
        return True

    def drain_text(self, rid: int) -> str:
        """New final text of a request since the last call (for streaming). Text that might still become
        part of a stop string is held back until it cannot."""
        return self.output.drain_text(rid)

    def drain_logprobs(self, rid: int) -> list[TokenLogprob]:
        """Log-probabilities of the tokens generated since the last call (for streaming; empty unless the
        request's params ask for ``logprobs``)."""
        return self.output.drain_logprobs(rid)

    # ------------------------------------------------------------------ one step
    def step(self) -> list[int]:
        """Run one forward over the scheduled mix; returns the ids of requests that finished in it."""
        plan = self.scheduler.schedule()
        self.stats.preemptions += plan.num_preempted
        self.last_sampled = []
        if not plan.chunks:
            if self.scheduler.num_waiting and not self.scheduler.num_running:
                raise RuntimeError("Engine.step: no request can be scheduled although none is running "
                                   "(KV cache too small); raise num_blocks")
            return []
        t0 = time.perf_counter()
        sampled = self.runner.execute(plan)
        now = time.perf_counter()
        self.scheduler.commit(plan)
        finished = self.output.process(plan.sampling_requests, sampled, now, self.runner.logprobs)
        self.last_sampled = [r.rid for r in plan.sampling_requests]
        for r in finished:
            self.scheduler.finish(r)
            r.timings.finished = now
            self._finished[r.rid] = r
        self.stats.record_step(plan, len(sampled), now - t0, self._traffic)
        return [r.rid for r in finished]

    def has_request(self, rid: int) -> bool:
        """The request is queued, running, or finished and not yet popped."""
        return self.output.has(rid)

    def run(self, rids: Sequence[int] | None = None) -> list[Completion]:
        """Step until the given requests (default: all) finish; return their completions in id order.

        If a step raises (or the call is interrupted, e.g. KeyboardInterrupt), the given requests are aborted
        before the exception propagates: their KV blocks return to the pool and nothing of them is kept.

        Raises
        ------
        ValueError
            An id that is not in the engine (never added, already popped or aborted).
        """
        wanted = list(rids) if rids is not None else self.scheduler.request_ids() + list(self._finished)
        unknown = [rid for rid in wanted if not self.has_request(rid)]
        if unknown:
            raise ValueError(f"Engine.run: no request with id(s) {unknown[:5]} (never added, popped or aborted)")
        try:
            while any(not self.is_finished(rid) for rid in wanted):
                self.step()
            return [self.pop_completion(rid) for rid in sorted(wanted)]
        except BaseException:
            self.abort_all(wanted)
            raise

    def generate(self, requests: Sequence[tuple[Sequence[int], SamplingParams]]) -> list[Completion]:
        """Validate every (prompt ids, params) first (nothing is queued if one is bad), then queue and
        :meth:`run` them all; completions in the given order. A failed or interrupted call leaves the engine
        as it found it (its requests aborted, their blocks freed).

        Raises
        ------
        ValueError
            ``requests[i]`` is invalid (see :meth:`check_request`); the message names i.
        """
        for i, (ids, params) in enumerate(requests):
            try:
                self.check_request(ids, params)
            except ValueError as e:
                raise ValueError(f"request {i}: {e}") from e
        rids: list[int] = []
        try:
            for ids, params in requests:
                rids.append(self.add_request(ids, params))
        except BaseException:
            self.abort_all(rids)
            raise
        return self.run(rids)  # rids increase, so id order is the given order

    def abort_all(self, rids: Sequence[int]) -> int:
        """:meth:`abort` each request; returns how many existed."""
        return sum(self.abort(rid) for rid in rids)
