"""The scheduler: each step, decide which requests run how many tokens — within the token budget, the batch
cap and the free KV blocks — and which are preempted.

Pure host bookkeeping over Python ints (no tensors): it owns the waiting and running queues and the
:class:`~mistral_kernels.cache.BlockManager`; the model runner turns its :class:`SchedulerOutput` into
tensors. One :meth:`Scheduler.schedule` fills the step's token budget B (``max_tokens_per_step``) in three
passes — chunked prefill, decode first:

1. **decodes**: every running request that decodes (one new token) brings it, oldest first, with its
   proposed tokens to verify when speculating (``Request.num_draft``, cut so that every later decode still
   fits, and by the free blocks). They come first so a long prompt being prefilled never holds up the
   running streams' next tokens (B ≥ ``max_batch``, so every decode fits);
2. **running prefills** (a prompt, or a recomputation, in chunks), oldest first;
3. **admissions**: waiting requests join (arrival order) while budget, batch slots and KV blocks last.

A prefill chunk (passes 2 and 3) is as long as the request's remaining tokens and the budget left allow, but
*while another request behind it wants prefill tokens* — a later running prefill, or a waiting request
with a free batch slot — it takes at most the **prefill share** S = ⌈(B − D) / 2⌉, half of what the D
decodes leave. So one long prompt cannot fill every step of its prefill: a request arriving meanwhile is
admitted in the next step with at least B − D − S tokens of that step, and a short prompt gets its first
token one step later (head-of-line bound: the step in progress + one step), while the long prompt still
advances by S tokens a step (it is never starved either). With nobody behind it, a chunk takes all that
is left. The cap is the role of vLLM's ``long_prefill_token_threshold``, made relative to the step's
budget so that it needs no tuning of its own.

When a running request cannot get the block it needs, the most recently arrived running request not yet
chosen in this step is *preempted*: its blocks are released and it goes back to the waiting queue with its
tokens so far (prompt + generated), to be recomputed by a later prefill; its sampler state (own generator)
is untouched, so its output is the same as without pressure. Waiting requests simply wait for blocks.

Prefix caching (:mod:`.cache`): on admission — first or after a preemption — a request starts from the
longest cached prefix of its tokens (:meth:`BlockManager.match_prefix`) and computes only the rest (at least
its last token, so the step has its logits); a preempted request thus usually finds its own blocks again.
After each step :meth:`Scheduler.commit` gives the newly computed full blocks their content address. A
waiting request whose next block is being computed in this step by an already chosen chunk (same address)
waits for the next step instead of computing it too: a batch sharing a system prompt computes it once.

Worked example 1 — blocks (block_size 4, 3 free blocks, budget 8). Running: A (arrived first; 4 tokens
cached in 1 full block, decoding its 5th) and B (8 cached in 2 full blocks, decoding its 9th); waiting: C
(prompt of 6 tokens). A's 5th token needs a 2nd block (2 free left), B's 9th a 3rd block (1 free left). C
wants min(6, budget 8-2) = 6 tokens = 2 blocks; only a 3-token chunk fits, and a sliver is not admitted
while others run, so C waits. Chunks: A 1 token after 4 cached, B 1 token after 8 cached.

Worked example 2 — head of line (budget 64, blocks plenty). Running: A decoding, L with 100 of its
300-token prompt computed; N (a 20-token prompt) arrives. Pass 1: A 1 token, 63 left. Pass 2: N waits
behind L with a free slot, so L takes S = ⌈63 / 2⌉ = 32 tokens, 31 left. Pass 3: N is admitted with all
its 20 tokens and samples its first token in this step. Next step nobody is behind L: A 1, N 1, L 62.
Without the share L would have taken all 63 tokens of every step for 4 more steps and N would wait.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .cache import BlockManager, OutOfBlocksError
from .request import Request

__all__ = ["AdmissionError", "ScheduledChunk", "Scheduler", "SchedulerOutput"]


class AdmissionError(ValueError):
    """A request that can never run on this engine, however long it waits.

    Attributes
    ----------
    argument : what to lower: "prompt_ids" (the prompt alone is too long), "max_new_tokens", or "copies" (too
        many copies of the request to fit together)
    """

    def __init__(self, message: str, argument: str) -> None:
        super().__init__(message)
        self.argument = argument


@dataclass(frozen=True)
class ScheduledChunk:
    """``num_new`` tokens of one request in this step, after ``num_cached`` already in the cache.

    Attributes
    ----------
    request : the request
    num_cached, num_new : tokens before the chunk (in the cache) and in it
    token_ids : the chunk's tokens (positions num_cached … num_cached+num_new-1 of prompt + output)
    block_table : the request's KV blocks after allocation (logical block → physical id)
    samples : the chunk reaches the end of the request's known tokens: its last row is sampled
    is_decode : one new token right after generated ones (a decode, not a prefill, for the stats), possibly
        followed by proposed tokens
    draft : the proposed tokens verified in this chunk (the last ``len(draft)`` of ``token_ids``)
    """

    request: Request
    num_cached: int
    num_new: int
    token_ids: list[int]
    block_table: list[int]
    samples: bool
    is_decode: bool
    draft: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class SchedulerOutput:
    """One step's plan: the chunks in batch order, the KV block size, how many requests were preempted, and
    the prefix-cache lookups of the requests admitted in it."""

    chunks: list[ScheduledChunk]
    block_size: int
    num_preempted: int
    prefix_query_tokens: int = 0  # tokens of the requests admitted in this step
    prefix_hit_tokens: int = 0  # of which found in the prefix cache (not computed)

    @property
    def sampling_requests(self) -> list[Request]:
        """Requests whose chunk samples a token, in batch order (the rows of the step's logits)."""
        return [c.request for c in self.chunks if c.samples]

    @property
    def num_prefill_tokens(self) -> int:
        """New tokens of the chunks that are not decodes (prompt tokens, recomputation included)."""
        return sum(c.num_new for c in self.chunks if not c.is_decode)


class Scheduler:
    """Waiting / running queues over a block pool (see the module docstring for the policy).

    Parameters
    ----------
    blocks : the KV block pool
    max_batch : most requests in one step
    max_tokens_per_step : token budget of one step (prefill chunks are cut to it)
    """

    def __init__(self, blocks: BlockManager, max_batch: int, max_tokens_per_step: int) -> None:
        if max_batch < 1:
            raise ValueError(f"Engine: max_batch must be ≥ 1, got {max_batch}")
        if max_tokens_per_step < max_batch:
            raise ValueError(f"Engine: max_tokens_per_step={max_tokens_per_step} must be ≥ max_batch={max_batch}")
        self.blocks = blocks
        self.max_batch = max_batch
        self.max_tokens_per_step = max_tokens_per_step
        self._waiting: list[Request] = []  # sorted by rid (arrival order)
        self._running: list[Request] = []  # sorted by rid

    # ------------------------------------------------------------------ queues
    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    def running(self) -> list[Request]:
        """The running requests, in arrival order (a copy)."""
        return list(self._running)

    def request_ids(self) -> list[int]:
        """Ids of the unfinished requests: waiting, then running."""
        return [r.rid for r in self._waiting + self._running]

    def check_fits(self, num_prompt: int, max_new_tokens: int, copies: int = 1) -> None:
        """Raise an :class:`AdmissionError` if a request of this size could not fit in the pool even alone
        (``argument`` "prompt_ids" when even one new token does not fit, else "max_new_tokens"), or ``copies``
        of it not together ("copies")."""
        bs, pool = self.blocks.block_size, self.blocks.num_blocks
        if self.blocks.max_blocks_per_sequence(num_prompt + 1, chunk=1) > pool:
            raise AdmissionError(f"the prompt is {num_prompt} tokens but the KV cache holds {pool} blocks of {bs} "
                                 "tokens; raise num_blocks (--num-blocks) or shorten the prompt", "prompt_ids")
        need = self.blocks.max_blocks_per_sequence(num_prompt + max_new_tokens, chunk=1)
        if need > pool:
            raise AdmissionError(
                f"the request needs {need} KV blocks of {bs} tokens (prompt {num_prompt} + max_new_tokens "
                f"{max_new_tokens}) but the cache has only {pool}; raise num_blocks (--num-blocks) or lower "
                "max_new_tokens", "max_new_tokens")
        if copies * need > pool:
            raise AdmissionError(f"{copies} copies of a request of {need} KV blocks exceed the cache's {pool} "
                                 "blocks; ask for fewer copies or lower max_new_tokens", "copies")

    def most_new_tokens(self, num_prompt: int, limit: int) -> int:
        """The most new tokens (≤ ``limit``, ≥ 1) a request of ``num_prompt`` tokens can have in the pool alone
        (a multiple of the block size below ``limit`` when ``limit`` does not fit)."""
        n = limit
        while n > 1 and self.blocks.max_blocks_per_sequence(num_prompt + n) > self.blocks.num_blocks:
            n -= self.blocks.block_size
        return max(1, n)

    def add(self, request: Request) -> None:
        """Queue a new request (its rid must be larger than every queued one)."""
        self._waiting.append(request)

    def abort(self, rid: int) -> Request | None:
        """Remove an unfinished request (waiting or running) and release its blocks; None if it is not queued."""
        for queue in (self._waiting, self._running):
            for r in queue:
                if r.rid == rid:
                    queue.remove(r)
                    self.blocks.free(rid)
                    return r
        return None

    def finish(self, request: Request) -> None:
        """Remove a finished running request and release its blocks."""
        self._running.remove(request)
        self.blocks.free(request.rid)

    # ------------------------------------------------------------------ one step
    def schedule(self) -> SchedulerOutput:
        """Pick this step's chunks (allocating their KV blocks), preempting when blocks run out."""
        budget = self.max_tokens_per_step
        chosen: list[tuple[Request, int]] = []
        taken: set[int] = set()  # rids chosen in this step (never preempted by a later pass)
        gone: set[int] = set()  # rids preempted in this step
        # 1. decodes, oldest first (every one fits: budget ≥ max_batch ≥ running).
        decodes = [r for r in self._running if r.num_tokens - r.num_computed == 1]
        for i, r in enumerate(decodes):
            if r.rid not in gone and budget > 0:
                later = sum(x.rid not in gone for x in decodes[i + 1:])  # each still needs its 1 token
                want = max(1, min(1 + r.num_draft, budget - later))
                got = self._allocate_running(r, want, taken, gone)
                if got:
                    chosen.append((r, got))
                    taken.add(r.rid)
                    budget -= got
        # 2. running prefills, oldest first; capped at the prefill share while others want tokens behind.
        share = budget - budget // 2
        prefills = [r for r in self._running if r.rid not in taken]
        for i, r in enumerate(prefills):
            if budget <= 0 or len(chosen) >= self.max_batch:
                break
            if r.rid in gone:  # preempted by an older prefill of this pass
                continue
            behind = any(x.rid not in gone for x in prefills[i + 1:]) or self._admissible()
            want = min(r.num_tokens - r.num_computed, budget, share if behind else budget)
            got = self._allocate_running(r, want, taken, gone)
            if got:
                chosen.append((r, got))
                taken.add(r.rid)
                budget -= got
        # 3. admit waiting requests, oldest first, while blocks last (no preemption for newcomers).
        queried = hit = 0
        pending = self._pending_addresses(chosen) if self._waiting else set()
        while self._waiting and budget > 0 and len(self._running) < self.max_batch:
            r = self._waiting[0]
            r.num_computed = self.blocks.match_prefix(r.rid, r.all_ids)
            behind = len(self._waiting) > 1 and len(self._running) + 1 < self.max_batch
            want = min(r.num_tokens - r.num_computed, budget, share if behind else budget)
            got = 0 if self._next_block_pending(r, pending) else self._try_allocate(r, want)
            if got == 0 or (got < want and chosen):
                # nothing fits, only a sliver while others run (wait for a full chunk), or the next block is
                # being computed by another request (wait for it)
                self.blocks.free(r.rid)
                r.num_computed = 0
                break
            queried += r.num_tokens
            hit += r.num_computed
            self._waiting.pop(0)
            self._running.append(r)
            self._running.sort(key=lambda x: x.rid)
            if r.timings.first_scheduled is None:
                r.timings.first_scheduled = time.perf_counter()
            chosen.append((r, got))
            taken.add(r.rid)
            budget -= got
            pending.update(self._pending_addresses([(r, got)]))
        return SchedulerOutput([self._chunk(r, n) for r, n in chosen], self.blocks.block_size, len(gone),
                               queried, hit)

    def _admissible(self) -> bool:
        """A waiting request could join this step (a free batch slot), so it wants prefill tokens."""
        return bool(self._waiting) and len(self._running) < self.max_batch

    def _allocate_running(self, r: Request, want: int, taken: set[int], gone: set[int]) -> int:
        """Blocks for ``want`` tokens of running ``r``, preempting the newest running requests not chosen in
        this step (their rids join ``gone``) while none is free; ``r`` itself yields (is preempted) when it is
        that newest one. Returns the tokens granted (0 when ``r`` was preempted)."""
        got = self._try_allocate(r, want)
        while got == 0:
            victim = next(x for x in reversed(self._running) if x.rid not in taken)  # r is a candidate
            self._preempt(victim)
            gone.add(victim.rid)
            if victim is r:
                return 0
            got = self._try_allocate(r, want)
        return got

    def commit(self, output: SchedulerOutput, kept: list[int] | None = None) -> None:
        """After the step's forward: the chunks' k/v are in the cache (full blocks become cached). ``kept``:
        per chunk, how many of its new tokens' k/v stay (a verify chunk keeps its last token and the accepted
        proposals; the rejected ones' slots are overwritten later); None = all."""
        for i, c in enumerate(output.chunks):
            r = c.request
            r.num_computed += c.num_new if kept is None else kept[i]
            self.blocks.cache_computed(r.rid, r.num_computed, r.token_ids)

    def _chunk(self, r: Request, n: int) -> ScheduledChunk:
        c = r.num_computed
        draft = r.draft_ids[:max(0, c + n - r.num_tokens)]
        return ScheduledChunk(
            request=r, num_cached=c, num_new=n, token_ids=r.token_ids(c, c + n - len(draft)) + draft,
            block_table=list(self.blocks.block_table(r.rid)), samples=c + n >= r.num_tokens,
            is_decode=r.decoding, draft=draft)

    def _pending_addresses(self, chosen: list[tuple[Request, int]]) -> set[bytes]:
        """Addresses of the blocks the chosen chunks complete in this step (empty without prefix caching)."""
        if not self.blocks.prefix_caching:
            return set()
        return {h for r, n in chosen
                for h in self.blocks.completing_addresses(r.rid, min(r.num_computed + n, r.num_tokens), r.token_ids)}

    def _next_block_pending(self, r: Request, pending: set[bytes]) -> bool:
        """Whether the first block ``r`` would compute (after its matched prefix) is completed by a chosen chunk
        of this step — then ``r`` had better wait a step and share it."""
        i = r.num_computed // self.blocks.block_size
        if not pending or i >= (r.num_tokens - 1) // self.blocks.block_size:
            return False
        return self.blocks.addresses(r.all_ids, i + 1)[-1] in pending

    def _preempt(self, r: Request) -> None:
        self.blocks.free(r.rid)
        r.num_computed = 0
        r.num_preemptions += 1
        self._running.remove(r)
        self._waiting.append(r)
        self._waiting.sort(key=lambda x: x.rid)

    def _try_allocate(self, r: Request, num_new: int) -> int:
        """Allocate blocks for ``num_new`` tokens of ``r`` (shrinking the chunk when only a smaller one fits);
        returns the tokens granted, 0 if none."""
        while num_new >= 1:
            try:
                self.blocks.allocate(r.rid, r.num_computed, r.num_computed + num_new)
                return num_new
            except OutOfBlocksError:
                if num_new == 1:
                    return 0
                num_new = max(1, num_new // 2)
        return 0
