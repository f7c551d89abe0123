"""The model runner: a :class:`~mistral_kernels.scheduler.SchedulerOutput` → input tensors and an
:class:`~mistral_kernels.batch.AttentionBatch` → one ``model.forward`` → sampled token ids.

Shape letters: T packed new tokens of one step, N sequences that sample, V vocab.

It owns the paged KV cache and the shared random generator. Only the chunks that reach the end of their
request's known tokens sample (``logits_indices``, computed by :meth:`AttentionBatch.build`); the sampled
ids [N] are read back once per step — the runner's only device → host transfer.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from .batch import AttentionBatch
from .config import ModelConfig
from .logprobs import TokenLogprob, token_logprobs
from .sampling import SamplingParams, sample
from .scheduler import SchedulerOutput

__all__ = ["ModelRunner", "PagedModel"]


class PagedModel(Protocol):
    """What the engine needs from a model (:class:`mistral_kernels.model.Model` provides it).

    Optional: ``broadcast_tokens(ids [N]) -> ids`` makes the sampled ids identical on all tensor-parallel
    ranks (called once per step when present; :class:`mistral_kernels.parallel.ShardedModel` has it).
    """

    config: ModelConfig
    device: torch.device
    dtype: torch.dtype

    def new_cache(self, num_blocks: int, block_size: int) -> Any: ...

    def forward(self, token_ids: torch.Tensor, batch: AttentionBatch, cache: Any) -> torch.Tensor: ...


class ModelRunner:
    """Runs the scheduled chunks through the model and samples.

    Parameters
    ----------
    model : PagedModel
    num_blocks, block_size : the KV cache pool (allocated here, uninitialised)

    Attributes
    ----------
    logprobs : after :meth:`execute`, per sampling request: its token's :class:`TokenLogprob` when its
        params ask for ``logprobs``, else None (all None costs nothing)
    """

    def __init__(self, model: PagedModel, num_blocks: int, block_size: int) -> None:
        self.model = model
        self.device = torch.device(model.device)
        self.cache = model.new_cache(num_blocks, block_size)
        self._default_generator = torch.Generator(device=self.device)
        self._default_generator.seed()
        self._broadcast = getattr(model, "broadcast_tokens", None)
        self.logprobs: list[TokenLogprob | None] = []

    def generator_for(self, params: SamplingParams) -> torch.Generator | None:
        """A request's own generator: seeded when it samples with a seed, else None (the shared one)."""
        if params.seed is None or params.greedy:
            return None
        gen = torch.Generator(device=self.device)
        gen.manual_seed(params.seed)
        return gen

    def execute(self, output: SchedulerOutput) -> list[int]:
        """One forward over ``output.chunks``; returns the sampled ids of ``output.sampling_requests`` (in order)."""
        chunks = output.chunks
        batch = AttentionBatch.build([c.block_table for c in chunks], [c.num_cached for c in chunks],
                                     [c.num_new for c in chunks], output.block_size, self.device,
                                     logits_sequences=[b for b, c in enumerate(chunks) if c.samples])
        ids = torch.tensor([t for c in chunks for t in c.token_ids], dtype=torch.int64, device=self.device)  # [T]
        logits = self.model.forward(ids, batch, self.cache)  # [N, V]
        samplers = output.sampling_requests
        self.logprobs = [None] * len(samplers)
        if not samplers:
            return []
        penalized = any(r.params.needs_history for r in samplers)
        next_ids = sample(logits, [r.params for r in samplers],
                          [r.generator or self._default_generator for r in samplers],
                          [r.all_ids for r in samplers] if penalized else None,
                          [r.output_ids for r in samplers] if penalized else None)  # [N]
        if self._broadcast is not None:  # tensor parallel: rank 0's tokens everywhere
            next_ids = self._broadcast(next_ids)
        if any(r.params.logprobs is not None for r in samplers):
            self.logprobs = token_logprobs(logits, next_ids, [r.params.logprobs for r in samplers])
        return next_ids.tolist()  # the one host read of the step (a second one only with logprobs)
