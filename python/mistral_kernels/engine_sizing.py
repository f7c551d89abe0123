"""The engine sizes the machine decides when the caller leaves them out: the step token budget
(``max_tokens_per_step``) and the batch cap (``max_batch``), hence the default KV pool.

Shape letters: T tokens of the probe forward, V vocab.

**Step budget** — a step's latency bounds how long a running stream waits for its next token and how long a
newly arrived request waits to join (the scheduler's head-of-line bound is about two steps, see
:mod:`.scheduler`). The budget is the number of tokens this model computes in :data:`STEP_SECONDS` on this
device: B = rate × STEP_SECONDS, rounded down to a multiple of the block size and clamped to
[:data:`MIN_STEP_TOKENS`, :data:`MAX_STEP_TOKENS`] (and ≥ ``max_batch``, so a step of decodes always fits).
The rate is measured once after loading: a prefill of :data:`PROBE_TOKENS` tokens, warmed up once and timed
twice, the faster counting. (vLLM profiles a forward at startup for the same reason: the number depends on
the machine and the model, not on a guess.) A decode token costs about as much as a prompt token on the CPU (both are
compute-bound for a batch), so the budget bounds mixed steps too. Attention grows with the context, so a
chunk deep into a long prompt takes longer than the probe's: the bound is for short and medium contexts.

**Batch cap** — as many sequences as the KV cache for :data:`SEQUENCE_TOKENS` tokens each (the window plus a
step's chunk for a sliding-window model) fits in :data:`KV_MEMORY_SHARE` of the memory available once the
weights are loaded, at most :data:`MAX_BATCH` (past it a CPU decode step only grows longer, and the
concurrency a client sees is already that of llama-server's ``-np 32`` with room), at least 1. The default
KV pool (:func:`mistral_kernels.cache.default_num_blocks`) then holds ``max_batch`` such sequences.

Tensor-parallel ranks must schedule identically: rank 0's sizes are broadcast to the others
(``broadcast_tokens`` of the sharded model).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch

from .batch import AttentionBatch
from .config import ModelConfig
from .memory import available_memory
from .ops import device_index_checks

__all__ = ["EngineSizes", "KV_MEMORY_SHARE", "MAX_BATCH", "MAX_STEP_TOKENS", "MIN_STEP_TOKENS", "PROBE_TOKENS",
           "SEQUENCE_TOKENS", "STEP_SECONDS", "ScratchForward", "batch_cap", "engine_sizes", "fastest",
           "measure_prefill_rate", "scratch_forward", "step_budget"]

STEP_SECONDS = 0.5  # latency target of one engine step
MIN_STEP_TOKENS = 64  # below it a step is mostly per-step overhead
MAX_STEP_TOKENS = 2048  # a GPU computes far more in STEP_SECONDS; larger steps only delay the running streams
PROBE_TOKENS = 64
MAX_BATCH = 64
SEQUENCE_TOKENS = 1024
KV_MEMORY_SHARE = 0.5


@dataclass(frozen=True)
class EngineSizes:
    """The sizes an engine runs with, and where they came from (for the startup line).

    Attributes
    ----------
    max_batch, max_tokens_per_step : the sizes
    prefill_rate : the measured prefill tokens/s (None when the budget was given)
    """

    max_batch: int
    max_tokens_per_step: int
    prefill_rate: float | None = None

    def describe(self) -> str:
        rate = f" (prefill measured at {self.prefill_rate:.0f} tokens/s, target {STEP_SECONDS} s a step)" \
            if self.prefill_rate is not None else ""
        return f"max batch {self.max_batch}, step budget {self.max_tokens_per_step} tokens{rate}"


def step_budget(rate: float, block_size: int, max_batch: int) -> int:
    """The budget of a step for a prefill ``rate`` (tokens/s): see the module docstring."""
    if not rate > 0:
        raise ValueError(f"step_budget: rate must be > 0 tokens/s, got {rate}")
    b = int(min(rate * STEP_SECONDS, MAX_STEP_TOKENS)) // block_size * block_size
    return max(min(max(b, MIN_STEP_TOKENS), MAX_STEP_TOKENS), max_batch)


def batch_cap(config: ModelConfig, dtype: torch.dtype, available: int | None, block_size: int) -> int:
    """The default ``max_batch`` for ``available`` bytes of memory after the weights (None: unknown → the
    cap): see the module docstring."""
    if available is None:
        return MAX_BATCH
    per_seq = min(config.max_position, SEQUENCE_TOKENS)
    if config.sliding_window:
        per_seq = min(per_seq, config.sliding_window + MAX_STEP_TOKENS)
    per_seq = -(-per_seq // block_size) * block_size + block_size  # whole blocks, + the one being filled
    fit = int(KV_MEMORY_SHARE * available) // (per_seq * config.kv_bytes_per_token(dtype))
    return max(1, min(MAX_BATCH, fit))


ScratchForward = Callable[[Sequence[int], Sequence[int], Optional[Sequence[int]]], None]


def scratch_forward(model: Any, block_size: int, tokens: int) -> ScratchForward:
    """``forward(cached, new, logits_sequences=None)`` over one scratch sequence of ``tokens`` fixed ids [T] in a
    KV cache of its own: rows b = 0 … len(cached) - 1 all read that sequence's block table, row b after
    cached[b] tokens adding new[b] (ids cached[0] … cached[0] + Σ new - 1); synchronized, logits dropped. The
    start-up measurements time it (:func:`measure_prefill_rate`, speculative.cost.measure_row_cost)."""
    config = model.config
    device = torch.device(model.device)
    n_blocks = -(-tokens // block_size)
    cache = model.new_cache(n_blocks + 1, block_size)  # + the null block 0
    table = list(range(1, n_blocks + 1))
    ids = (torch.arange(tokens, device=device, dtype=torch.int64) * 7919 + 11) % config.vocab_size  # [T]

    @torch.no_grad()
    def forward(cached: Sequence[int], new: Sequence[int], logits_sequences: Sequence[int] | None = None) -> None:
        batch = AttentionBatch.build([table] * len(cached), cached, new, block_size, device, logits_sequences,
                                     num_blocks=n_blocks + 1, max_position=config.max_position)
        with device_index_checks(False):  # validated on the host by AttentionBatch.build
            logits = model.forward(ids[cached[0]:cached[0] + sum(new)], batch, cache)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        del logits

    return forward


def fastest(run: Callable[[], None]) -> float:
    """Seconds of ``run()``: once to warm up (the first call of a shape pays for one-time setup), then the faster
    of two timed calls — the machine's speed, less what other processes took."""
    run()
    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return max(best, 1e-9)


def measure_prefill_rate(model: Any, block_size: int, tokens: int = PROBE_TOKENS) -> float:
    """Prefill tokens/s of ``model`` on its device: a fresh sequence of ``tokens`` tokens into a scratch KV cache
    of its own (:func:`scratch_forward`), timed by :func:`fastest`."""
    tokens = min(tokens, model.config.max_position)
    forward = scratch_forward(model, block_size, tokens)
    return tokens / fastest(lambda: forward([0], [tokens], [0]))


def engine_sizes(model: Any, dtype: torch.dtype, block_size: int, max_batch: int | None,
                 max_tokens_per_step: int | None) -> EngineSizes:
    """The sizes of an engine over the loaded ``model``: the given ones, the others decided here (memory
    available now, measured prefill rate), rank 0's on every tensor-parallel rank."""
    if max_batch is None:
        max_batch = batch_cap(model.config, dtype, available_memory(model.device), block_size)
    rate = None
    if max_tokens_per_step is None:
        rate = measure_prefill_rate(model, block_size)
        max_tokens_per_step = step_budget(rate, block_size, max_batch)
    broadcast = getattr(model, "broadcast_tokens", None)
    if broadcast is not None:  # tensor parallel: every rank schedules with rank 0's sizes
        sizes = broadcast(torch.tensor([max_batch, max_tokens_per_step], dtype=torch.int64, device=model.device))
        max_batch, max_tokens_per_step = (int(v) for v in sizes.cpu())
    return EngineSizes(max_batch, max_tokens_per_step, rate)
