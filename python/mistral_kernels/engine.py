"""Continuous-batching generation engine over the paged KV cache.

Shape letters: T packed new tokens of one step, B sequences in the step, N sequences that sample, V vocab.

Each :meth:`Engine.step` runs one forward over a mix of sequences, chosen under a token budget
(``max_tokens_per_step``) and a batch cap (``max_batch``):

1. running requests first, in arrival order: a decoding request brings its 1 new token; one still in
   (chunked) prefill brings up to the remaining budget of its prompt;
2. then waiting requests are admitted (arrival order) while budget, batch slots and KV blocks last.

KV blocks come from a :class:`~mistral_kernels.cache.BlockManager`. When a running request cannot get the
block it needs, the most recently arrived running request is *preempted*: its blocks are freed and it goes
back to the waiting queue with its tokens so far (prompt + generated), to be recomputed by a later
prefill; its sampler state (own generator) is untouched, so its output is the same as without pressure.
Waiting requests simply wait for blocks. A request that could never fit even alone is rejected by
:meth:`Engine.add_request` with a clear error.

Only the sequences whose chunk reaches the end of their known tokens sample (``logits_indices``); the
sampled ids are read back once per step (the one host sync), then stop conditions and detokenisation run
on the host.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from .batch import AttentionBatch
from .cache import BlockManager, OutOfBlocksError, blocks_for
from .sampling import SamplingParams, sample
from .tokenizer import IncrementalDecoder, Tokenizer

__all__ = ["Completion", "Engine", "EngineStats", "RequestTimings"]


class PagedModel(Protocol):
    """What the engine needs from a model (:class:`mistral_kernels.model.Model` provides it).

    Optional: ``broadcast_tokens(ids [N]) -> ids`` makes the sampled ids identical on all tensor-parallel
    ranks (called once per step when present).
    """

    config: Any  # ModelConfig: n_layers, n_kv_heads, head_dim, sliding_window, max_position, vocab_size
    device: torch.device
    dtype: torch.dtype

    def new_cache(self, num_blocks: int, block_size: int) -> Any: ...

    def forward(self, token_ids: torch.Tensor, batch: AttentionBatch, cache: Any) -> torch.Tensor: ...


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
class Completion:
    """Result of one request.

    Attributes
    ----------
    request_id : engine id
    text : generated text (special tokens skipped; cut before a matched stop string)
    token_ids : generated token ids (including the EOS / stop token that ended it)
    prompt_token_ids : the prompt as fed to the model
    finish_reason : "stop" (EOS, stop token or stop string) or "length" (max_new_tokens)
    stop_reason : the matched stop string or stop token id; None otherwise
    num_preemptions : how often the request was preempted and recomputed
    timings : arrival / first token / finish times
    """

    request_id: int
    text: str
    token_ids: list[int]
    prompt_token_ids: list[int]
    finish_reason: str
    stop_reason: str | int | None
    num_preemptions: int
    timings: RequestTimings


@dataclass
class EngineStats:
    """Counters for the stats line. Steps with any prefill token count as prefill time (tokens: the prompt
    tokens computed, recomputation included); decode-only steps count as decode time."""

    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    decode_bytes: float = 0.0  # weights + KV bytes read by decode-only steps
    steps: int = 0
    preemptions: int = 0

    @property
    def prompt_tok_per_s(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds else 0.0

    @property
    def decode_tok_per_s(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds else 0.0

    @property
    def decode_gb_per_s(self) -> float:
        return self.decode_bytes / self.decode_seconds / 1e9 if self.decode_seconds else 0.0


@dataclass
class _Request:
    rid: int
    prompt_ids: list[int]
    params: SamplingParams
    generator: torch.Generator | None
    decoder: IncrementalDecoder | None
    timings: RequestTimings
    output_ids: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens whose k/v are in the cache
    text: str = ""
    emitted: int = 0  # text[:emitted] was handed out by drain_text
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    num_preemptions: int = 0

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)


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
    """

    def __init__(self, model: PagedModel, tokenizer: Tokenizer | None, *, num_blocks: int, block_size: int = 16,
                 max_batch: int = 8, max_tokens_per_step: int = 512, eos_ids: Sequence[int] | None = None) -> None:
        if max_batch < 1:
            raise ValueError(f"Engine: max_batch must be ≥ 1, got {max_batch}")
        if max_tokens_per_step < max_batch:
            raise ValueError(f"Engine: max_tokens_per_step={max_tokens_per_step} must be ≥ max_batch={max_batch}")
        self.model = model
        self.tokenizer = tokenizer
        self.config = model.config
        self.blocks = BlockManager(num_blocks, block_size, model.config.sliding_window)
        self.cache = model.new_cache(num_blocks, block_size)
        self.max_batch = max_batch
        self.max_tokens_per_step = max_tokens_per_step
        if eos_ids is None:
            eos_ids = sorted(tokenizer.eos_ids) if tokenizer is not None else list(model.config.eos_token_ids)
        self.eos_ids = frozenset(int(e) for e in eos_ids)
        self.device = torch.device(model.device)
        self.stats = EngineStats()
        self._next_id = 0
        self._waiting: list[_Request] = []  # sorted by rid (arrival order)
        self._running: list[_Request] = []  # sorted by rid
        self._finished: dict[int, _Request] = {}
        self._default_generator = torch.Generator(device=self.device)
        self._default_generator.seed()
        self._weight_bytes = _weight_bytes(model)
        c = model.config
        self._kv_bytes_per_token = 2 * c.n_layers * c.n_kv_heads * c.head_dim * torch.empty(
            (), dtype=model.dtype).element_size()

    # ------------------------------------------------------------------ requests
    def add_request(self, prompt_ids: Sequence[int], params: SamplingParams | None = None) -> int:
        """Queue a request; it joins the batch at the next :meth:`step`. Returns its id.

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
        need = self.blocks.max_blocks_per_sequence(total, chunk=1)
        if need > self.blocks.num_blocks:
            raise ValueError(
                f"add_request: the request needs {need} KV blocks of {self.blocks.block_size} tokens "
                f"(prompt {len(ids)} + max_new_tokens {params.max_new_tokens}) but the cache has only "
                f"{self.blocks.num_blocks}; raise num_blocks (--num-blocks) or lower max_new_tokens")
        rid = self._next_id
        self._next_id += 1
        gen = None
        if params.seed is not None and not params.greedy:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(params.seed)
        dec = self.tokenizer.incremental_decoder() if self.tokenizer is not None else None
        self._waiting.append(_Request(rid, ids, params, gen, dec, RequestTimings(arrival=time.perf_counter())))
        return rid

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def is_finished(self, rid: int) -> bool:
        return rid in self._finished

    def pop_completion(self, rid: int) -> Completion:
        """The finished request's :class:`Completion` (removed from the engine)."""
        r = self._finished.pop(rid)
        return Completion(r.rid, r.text, list(r.output_ids), list(r.prompt_ids), r.finish_reason or "length",
                          r.stop_reason, r.num_preemptions, r.timings)

    def drain_text(self, rid: int) -> str:
        """New final text of a request since the last call (for streaming). Text that might still become
        part of a stop string is held back until it cannot."""
        r = self._finished.get(rid) or next((x for x in self._running + self._waiting if x.rid == rid), None)
        if r is None:
            raise KeyError(f"drain_text: no request {rid}")
        end = len(r.text)
        if r.finish_reason is None and r.params.stop:
            end = max(r.emitted, end - (max(len(s) for s in r.params.stop) - 1))
        piece = r.text[r.emitted:end]
        r.emitted = end
        return piece

    # ------------------------------------------------------------------ scheduling
    def _preempt(self, r: _Request) -> None:
        self.blocks.free(r.rid)
        r.num_computed = 0
        r.num_preemptions += 1
        self.stats.preemptions += 1
        self._running.remove(r)
        self._waiting.append(r)
        self._waiting.sort(key=lambda x: x.rid)

    def _try_allocate(self, r: _Request, num_new: int) -> int:
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

    def _schedule(self) -> list[tuple[_Request, int]]:
        budget = self.max_tokens_per_step
        chosen: list[tuple[_Request, int]] = []
        # 1. running requests, oldest first; preempt the newest when blocks run out.
        i = 0
        while i < len(self._running) and budget > 0 and len(chosen) < self.max_batch:
            r = self._running[i]
            want = min(r.num_tokens - r.num_computed, budget)
            got = self._try_allocate(r, want)
            while got == 0:
                victim = self._running[-1]
                if victim is r:
                    break
                self._preempt(victim)
                got = self._try_allocate(r, want)
            if got == 0:  # r itself is the newest: it yields its blocks and waits
                self._preempt(r)
                continue
            chosen.append((r, got))
            budget -= got
            i += 1
        # 2. admit waiting requests, oldest first, while blocks last (no preemption for newcomers).
        while self._waiting and budget > 0 and len(chosen) < self.max_batch:
            r = self._waiting[0]
            want = min(r.num_tokens - r.num_computed, budget)
            got = self._try_allocate(r, want)
            if got == 0 or (got < want and chosen):
                if got:
                    self.blocks.free(r.rid)  # only a sliver fits while others run: wait for a full chunk
                break
            self._waiting.pop(0)
            self._running.append(r)
            self._running.sort(key=lambda x: x.rid)
            if r.timings.first_scheduled is None:
                r.timings.first_scheduled = time.perf_counter()
            chosen.append((r, got))
            budget -= got
        return chosen

    # ------------------------------------------------------------------ one step
    def step(self) -> list[int]:
        """Run one forward over the scheduled mix; returns the ids of requests that finished in it."""
        chosen = self._schedule()
        if not chosen:
            if self._waiting and not self._running:
                raise RuntimeError("Engine.step: no request can be scheduled although none is running "
                                   "(KV cache too small); raise num_blocks")
            return []
        t0 = time.perf_counter()
        tokens: list[int] = []
        tables, cached, new, sampling_rows = [], [], [], []
        for b, (r, n) in enumerate(chosen):
            tokens.extend(r.all_ids[r.num_computed:r.num_computed + n])
            tables.append(self.blocks.block_table(r.rid))
            cached.append(r.num_computed)
            new.append(n)
            if r.num_computed + n == r.num_tokens:
                sampling_rows.append(b)
        batch = AttentionBatch.build(tables, cached, new, self.blocks.block_size, self.device)
        ends, acc = [], 0
        for n in new:
            acc += n
            ends.append(acc - 1)  # packed row of each sequence's last new token
        batch = dataclasses.replace(batch, logits_indices=torch.tensor(
            [ends[b] for b in sampling_rows], dtype=torch.int64, device=self.device))
        ids = torch.tensor(tokens, dtype=torch.int64, device=self.device)
        logits = self.model.forward(ids, batch, self.cache)  # [N, V]
        samplers = [chosen[b][0] for b in sampling_rows]
        finished: list[int] = []
        if samplers:
            next_ids = sample(logits, [r.params for r in samplers], [r.generator or self._default_generator
                                                                     for r in samplers],
                              [r.all_ids for r in samplers]
                              if any(r.params.repetition_penalty != 1.0 for r in samplers) else None)
            broadcast = getattr(self.model, "broadcast_tokens", None)  # tensor parallel: rank 0's tokens
            if broadcast is not None:
                next_ids = broadcast(next_ids)
            next_list = next_ids.tolist()  # the one host read of the step
        else:
            next_list = []
        now = time.perf_counter()
        # bookkeeping
        prefill_tokens = sum(n for (r, n) in chosen if not (n == 1 and r.num_computed == r.num_tokens - 1
                                                                and r.output_ids))
        for r, n in chosen:
            r.num_computed += n
        for r, tok in zip(samplers, next_list):
            self._append_token(r, int(tok), now)
            if r.finish_reason is not None:
                finished.append(r.rid)
        for rid in finished:
            r = next(x for x in self._running if x.rid == rid)
            self._running.remove(r)
            self.blocks.free(rid)
            r.timings.finished = now
            self._finished[rid] = r
        dt = now - t0
        self.stats.steps += 1
        if prefill_tokens:
            self.stats.prompt_tokens += prefill_tokens
            self.stats.prompt_seconds += dt
        else:
            self.stats.decode_tokens += len(next_list)
            self.stats.decode_seconds += dt
            w = self.config.sliding_window
            kv_tokens = sum(min(c + n, w) if w else c + n for c, n in zip(cached, new))
            self.stats.decode_bytes += self._weight_bytes + kv_tokens * self._kv_bytes_per_token
        return finished

    def _append_token(self, r: _Request, tok: int, now: float) -> None:
        if r.timings.first_token is None:
            r.timings.first_token = now
        r.output_ids.append(tok)
        p = r.params
        if r.decoder is not None:
            before = len(r.text)
            r.text += r.decoder.push([tok])
            if p.stop:
                # Search only where a new match can be: the tail that includes the new text.
                start = max(0, before - max(len(s) for s in p.stop) + 1)
                hits = [(r.text.find(s, start), s) for s in p.stop]
                hits = [(i, s) for i, s in hits if i >= 0]
                if hits:
                    pos, s = min(hits)
                    r.text = r.text[:pos]
                    r.emitted = min(r.emitted, pos)
                    r.finish_reason, r.stop_reason = "stop", s
                    return
        if tok in p.stop_token_ids:
            r.finish_reason, r.stop_reason = "stop", tok
        elif tok in self.eos_ids and not p.ignore_eos:
            r.finish_reason, r.stop_reason = "stop", tok
        elif len(r.output_ids) >= p.max_new_tokens:
            r.finish_reason = "length"
        if r.finish_reason is not None and r.decoder is not None:
            r.text += r.decoder.flush()

    def run(self, rids: Sequence[int] | None = None) -> list[Completion]:
        """Step until the given requests (default: all) finish; return their completions in id order."""
        wanted = list(rids) if rids is not None else [r.rid for r in self._waiting + self._running] + list(
            self._finished)
        while any(not self.is_finished(rid) for rid in wanted):
            self.step()
        return [self.pop_completion(rid) for rid in sorted(wanted)]


def _weight_bytes(model: Any) -> int:
    """Bytes of the weights one decode step reads (every matrix once; the embedding only by rows)."""
    seen: set[int] = set()
    total = 0

    def add(t: Any) -> None:
        nonlocal total
        if isinstance(t, torch.Tensor) and t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()

    layers = getattr(model, "layers", [])
    for layer in layers:
        for v in vars(layer).values():
            add(v)
    add(getattr(model, "norm", None))
    add(getattr(model, "lm_head", None))
    return total


def default_num_blocks(config: Any, block_size: int, max_batch: int, max_tokens_per_step: int) -> int:
    """A KV pool for ``max_batch`` sequences of up to 1024 tokens (W + one chunk with a sliding window),
    and at least one sequence of min(max_position, 8192) tokens (O(W) with a window)."""
    w = config.sliding_window
    per_seq = min(config.max_position, 1024)
    longest = min(config.max_position, 8192)
    if w:
        per_seq = min(per_seq, w + max_tokens_per_step)
        longest = min(longest, w + max_tokens_per_step)
    return max(max_batch * (blocks_for(per_seq, block_size) + 1), blocks_for(longest, block_size) + 1)
