"""The model runner: a :class:`~mistral_kernels.scheduler.SchedulerOutput` → input tensors and an
:class:`~mistral_kernels.batch.AttentionBatch` → one ``model.forward`` → sampled token ids (and their
log-probabilities for the requests that ask).

Shape letters: T packed new tokens of one step, N sequences that sample, V vocab.

It owns the paged KV cache and the shared random generator. Only the chunks that reach the end of their
request's known tokens sample (``logits_indices``, computed by :meth:`AttentionBatch.build`); the sampled
ids [N] are read back once per step — the runner's only device → host transfer.

No host sync in a step (tests/test_sync_free.py): the step's index tensors are validated once, on the host lists, by
:meth:`AttentionBatch.build` (block ids against the pool, positions against the model), then copied
without a sync (:mod:`.transfer`), and ``model.forward`` runs with the device index checks off
(:func:`mistral_kernels.ops.device_index_checks`). Decode steps (every chunk one new token that samples)
go through :class:`~mistral_kernels.decode_graphs.DecodeGraphRunner` unless ``enforce_eager``: padded
static buffers, replayed as CUDA graphs on CUDA. tests/test_sync_free.py proves it. On the CPU (no
graphs), decode steps take their index tensors from :class:`~mistral_kernels.decode_inputs.CpuDecodeInputs`:
buffers allocated once and updated in place, no tensor built per step.

Mixed steps (prefill chunks and decodes): the runner puts every single-token chunk first, so all decode
rows take the decode kernel (split-K) and only the prefill rows the prefill kernel
(:meth:`ModelRunner._forward_mixed`; :class:`AttentionBatch` routes its leading single-token rows).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from .batch import AttentionBatch
from .config import ModelConfig
from .decode_graphs import DecodeGraphRunner
from .decode_inputs import CpuDecodeInputs
from .logprobs import TokenLogprob, token_logprobs
from .ops import device_index_checks
from .sampling import SamplingParams, sample
from .scheduler import ScheduledChunk, SchedulerOutput
from .structured.bitmask import MaskWorkspace, constrain_logits
from .transfer import to_device

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
    max_batch : most sequences in a step (the largest decode bucket)
    enforce_eager : decode steps run the plain forward. None (default): padded static-buffer decode with
        CUDA graphs on a CUDA model, plain forward elsewhere (and for tensor-parallel models, whose
        collectives are not captured yet). False: the padded runner on every device (eager off CUDA).
        A CPU model without the padded runner takes its decode steps' index tensors from
        :class:`~mistral_kernels.decode_inputs.CpuDecodeInputs` (in-place buffers, no padding).
    """

    def __init__(self, model: PagedModel, num_blocks: int, block_size: int, *, max_batch: int = 8,
                 enforce_eager: bool | None = None) -> None:
        self.model = model
        self.device = torch.device(model.device)
        self.num_blocks = num_blocks
        self.cache = model.new_cache(num_blocks, block_size)
        self._default_generator = torch.Generator(device=self.device)
        self._default_generator.seed()
        self._broadcast = getattr(model, "broadcast_tokens", None)
        self.eos_ids: frozenset[int] = frozenset()  # what min_tokens masks (set by the engine)
        self._mask_workspace = MaskWorkspace()  # structured outputs: the masked logits' host buffers
        if enforce_eager is None:
            enforce_eager = self.device.type != "cuda" or self._broadcast is not None
        self.decode_graphs = None if enforce_eager else DecodeGraphRunner(
            model, self.cache, num_blocks, block_size, max_batch, capture=self.device.type == "cuda")
        self.cpu_decode_inputs = CpuDecodeInputs(max_batch, block_size, num_blocks, model.config.max_position) \
            if self.decode_graphs is None and self.device.type == "cpu" else None

    def generator_for(self, params: SamplingParams) -> torch.Generator | None:
        """A request's own generator: seeded when it samples with a seed, else None (the shared one)."""
        if params.seed is None or params.greedy:
            return None
        gen = torch.Generator(device=self.device)
        gen.manual_seed(params.seed)
        return gen

    def _forward_mixed(self, chunks: list[ScheduledChunk], block_size: int) -> torch.Tensor:
        """The plain forward over ``chunks`` → logits [N, V] of the sampling chunks, in batch order.

        Decodes first (row-kind split): the forward runs the chunks reordered — every single-token chunk
        first, in batch order, then the others — so that :class:`AttentionBatch` sends ALL decode rows of a
        mixed step to the decode kernel (split-K), whatever order the scheduler chose (a request still in
        chunked prefill may precede decoding ones). ``logits_sequences`` lists the sampling chunks' places in
        that order in batch order, so the logits rows come out in batch order (no extra gather or sync).
        """
        order = sorted(range(len(chunks)), key=lambda i: chunks[i].num_new != 1)  # stable: decodes first
        run = [chunks[i] for i in order]
        place = {i: k for k, i in enumerate(order)}  # chunk → its sequence in the reordered batch
        batch = AttentionBatch.build([c.block_table for c in run], [c.num_cached for c in run],
                                     [c.num_new for c in run], block_size, self.device,
                                     logits_sequences=[place[i] for i, c in enumerate(chunks) if c.samples],
                                     num_blocks=self.num_blocks, max_position=self.model.config.max_position)
        ids = to_device([t for c in run for t in c.token_ids], torch.int64, self.device)  # [T]
        with device_index_checks(False):  # validated on the host by AttentionBatch.build
            return self.model.forward(ids, batch, self.cache)  # [N, V]

    def execute(self, output: SchedulerOutput) -> tuple[list[int], list[TokenLogprob | None] | None]:
        """One forward over ``output.chunks``; returns the sampled ids of ``output.sampling_requests`` (in order)
        and, when one of them asks for ``logprobs``, one entry per request: its token's :class:`TokenLogprob`,
        or None for a request that does not ask (None instead of the list when none asks: no cost)."""
        chunks = output.chunks
        decode = bool(chunks) and all(c.num_new == 1 and c.samples for c in chunks)
        if decode and self.decode_graphs is not None and len(chunks) <= self.decode_graphs.max_batch:
            logits = self.decode_graphs.forward([c.token_ids[0] for c in chunks], [c.block_table for c in chunks],
                                                [c.num_cached for c in chunks])  # [N, V]
        elif decode and self.cpu_decode_inputs is not None and len(chunks) <= self.cpu_decode_inputs.max_batch:
            ids, batch = self.cpu_decode_inputs.step([c.token_ids[0] for c in chunks],
                                                     [c.block_table for c in chunks], [c.num_cached for c in chunks])
            with device_index_checks(False):  # validated on the host by CpuDecodeInputs.step
                logits = self.model.forward(ids, batch, self.cache)  # [N, V]
        else:
            logits = self._forward_mixed(chunks, output.block_size)  # [N, V]
        samplers = output.sampling_requests
        if not samplers:
            return [], None
        penalized = any(r.params.needs_history for r in samplers)
        counted = penalized or any(r.params.min_tokens for r in samplers)
        # structured outputs: grammar masks filled now, while a GPU still runs the forward; `logits` stay raw
        # (logprobs); `masked` is `logits` itself when no request is constrained
        masked = constrain_logits(logits, samplers, self._mask_workspace)  # [N, V]
        next_ids = sample(masked, [r.params for r in samplers],
                          [r.generator or self._default_generator for r in samplers],
                          [r.all_ids for r in samplers] if penalized else None,
                          [r.output_ids for r in samplers] if counted else None, eos_ids=self.eos_ids)  # [N]
        if self._broadcast is not None:  # tensor parallel: rank 0's tokens everywhere
            next_ids = self._broadcast(next_ids)
        logprobs = token_logprobs(logits, next_ids, [r.params.logprobs for r in samplers]) \
            if any(r.params.logprobs is not None for r in samplers) else None
        return next_ids.tolist(), logprobs  # the one host read of the step (a second one only with logprobs)
