"""Engine counters: prompt / decode tokens and seconds, the bytes decode steps read, preemptions, prefix-cache
hits.

A step with any prefill token counts as prefill time (tokens: the prompt tokens computed, recomputation
included); a decode-only step counts as decode time and as the memory traffic of
:class:`DecodeTraffic` (the decode roofline: weights + KV bytes per step / bandwidth).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .quant_weight import weight_bytes as _weight_bytes
from .scheduler import SchedulerOutput

__all__ = ["DecodeTraffic", "EngineStats", "weight_bytes"]


@dataclass
class EngineStats:
    """Counters for the stats line. Steps with any prefill token count as prefill time (tokens: the prompt
    tokens computed, recomputation included); decode-only steps count as decode time. Prefix cache: each
    admission (first or after a preemption) queries its tokens; the hits are those not computed."""

    prompt_tokens: int = 0
    prompt_seconds: float = 0.0
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    decode_bytes: float = 0.0  # weights + KV bytes read by decode-only steps
    steps: int = 0
    preemptions: int = 0
    prefix_query_tokens: int = 0
    prefix_hit_tokens: int = 0
    spec_proposed_tokens: int = 0  # speculative decoding: tokens proposed and verified
    spec_accepted_tokens: int = 0  # of which accepted
    spec_verify_steps: int = 0  # sequence-steps that verified a proposal

    @property
    def spec_acceptance_rate(self) -> float:
        """Accepted / proposed tokens (0 before any proposal)."""
        return self.spec_accepted_tokens / self.spec_proposed_tokens if self.spec_proposed_tokens else 0.0

    def record_speculation(self, proposed: int, accepted: int, verified: int) -> None:
        """Count one step's verification (:mod:`mistral_kernels.speculative`)."""
        self.spec_proposed_tokens += proposed
        self.spec_accepted_tokens += accepted
        self.spec_verify_steps += verified

    @property
    def prefix_hit_rate(self) -> float:
        """Cached / queried tokens of the admitted requests (0 before any admission)."""
        return self.prefix_hit_tokens / self.prefix_query_tokens if self.prefix_query_tokens else 0.0

    @property
    def prompt_tok_per_s(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds else 0.0

    @property
    def decode_tok_per_s(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds else 0.0

    @property
    def decode_gb_per_s(self) -> float:
        return self.decode_bytes / self.decode_seconds / 1e9 if self.decode_seconds else 0.0

    def record_step(self, output: SchedulerOutput, num_sampled: int, seconds: float, traffic: DecodeTraffic) -> None:
        """Count one executed step (preemptions are counted by the caller, also for steps that run nothing)."""
        self.steps += 1
        self.prefix_query_tokens += output.prefix_query_tokens
        self.prefix_hit_tokens += output.prefix_hit_tokens
        prefill = output.num_prefill_tokens
        if prefill:
            self.prompt_tokens += prefill
            self.prompt_seconds += seconds
        else:
            self.decode_tokens += num_sampled
            self.decode_seconds += seconds
            self.decode_bytes += traffic.step_bytes(c.num_cached + c.num_new for c in output.chunks)


@dataclass(frozen=True)
class DecodeTraffic:
    """Bytes one decode step reads: every weight once, plus the k/v of the keys each sequence attends to
    (min(seq_len, W) tokens with a sliding window W).

    Example: 1 GB of weights, 131,072 KV bytes per token (Mistral-7B bf16), W = 4096, two sequences of
    100 and 5000 tokens → 1e9 + (100 + 4096) · 131072 bytes.
    """

    weight_bytes: int
    kv_bytes_per_token: int
    sliding_window: int | None

    @classmethod
    def of(cls, model: Any) -> DecodeTraffic:
        c = model.config
        return cls(weight_bytes(model), c.kv_bytes_per_token(model.dtype), c.sliding_window)

    def step_bytes(self, seq_lens: Iterable[int]) -> int:
        """Bytes read by a decode step over sequences of these lengths (cached + new tokens)."""
        w = self.sliding_window
        kv_tokens = sum(min(n, w) if w else n for n in seq_lens)
        return self.weight_bytes + kv_tokens * self.kv_bytes_per_token


def weight_bytes(model: Any) -> int:
    """Bytes of the weights one decode step reads: ``model.step_weights()`` (every matrix once; the embedding
    only by rows), counted by :func:`mistral_kernels.quant_weight.weight_bytes` (packed matrices: their packed
    bytes, blocks or int8 values + scales). A model object that lists no weights (a wrapper or test double
    around a model, as the engine accepts) counts 0."""
    step_weights = getattr(model, "step_weights", None)
    return 0 if step_weights is None else _weight_bytes(w for _, w in step_weights())
