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

Speculative decoding (:meth:`ModelRunner.execute_verify`): a chunk that verifies K proposed tokens is the
request's last token + the K proposals at positions c … c+K, with logits for each of its K+1 rows; one
target token per row (:mod:`.speculative.verify`) is the step's one host read. When every chunk of the step
is a decode or a verify chunk, the rows run as a decode step of single-token rows (row j of a chunk: position
c+j, seq_len c+j+1, the request's block table), through the decode path of plain steps (CUDA graph buckets,
the CPU's in-place inputs and fused decode step) — every row's k/v is written before any row attends, so row j
sees the rows before it (causal) and the model's windows as any decode row. Other steps take the
chunked-prefill path (causal among the new rows, windows respected).

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
from .speculative.verify import VerifyRow, accept, target_tokens
from .structured.bitmask import MaskWorkspace, constrain_logits, constrain_verify_logits
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
    verify_rows : most rows of a decode step that verifies proposed tokens (speculative decoding: the
        decoding sequences × (k+1)); the decode buffers / graph buckets cover max(max_batch, verify_rows) rows
    enforce_eager : decode steps run the plain forward. None (default): padded static-buffer decode with
        CUDA graphs on a CUDA model, plain forward elsewhere (and for tensor-parallel models, whose
        collectives are not captured yet). False: the padded runner on every device (eager off CUDA).
        A CPU model without the padded runner takes its decode steps' index tensors from
        :class:`~mistral_kernels.decode_inputs.CpuDecodeInputs` (in-place buffers, no padding).
    """

    def __init__(self, model: PagedModel, num_blocks: int, block_size: int, *, max_batch: int = 8,
                 enforce_eager: bool | None = None, verify_rows: int = 0) -> None:
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
        rows = max(max_batch, verify_rows)
        self.decode_graphs = None if enforce_eager else DecodeGraphRunner(
            model, self.cache, num_blocks, block_size, rows, capture=self.device.type == "cuda")
        self.cpu_decode_inputs = CpuDecodeInputs(rows, block_size, num_blocks, model.config.max_position) \
            if self.decode_graphs is None and self.device.type == "cpu" else None

    def generator_for(self, params: SamplingParams) -> torch.Generator | None:
        """A request's own generator: seeded when it samples with a seed, else None (the shared one)."""
        if params.seed is None or params.greedy:
            return None
        gen = torch.Generator(device=self.device)
        gen.manual_seed(params.seed)
        return gen

    def _forward_mixed(self, chunks: list[ScheduledChunk], block_size: int) -> torch.Tensor:
        """The plain forward over ``chunks`` → logits [N, V] of the sampling chunks, in batch order (a chunk
        that verifies proposed tokens has one row per proposal + 1, its last rows: N counts them all).

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
                                     num_blocks=self.num_blocks, max_position=self.model.config.max_position,
                                     logits_rows=[1 + len(c.draft) for c in chunks if c.samples])
        ids = to_device([t for c in run for t in c.token_ids], torch.int64, self.device)  # [T]
        with device_index_checks(False):  # validated on the host by AttentionBatch.build
            return self.model.forward(ids, batch, self.cache)  # [N, V]

    def _logits(self, output: SchedulerOutput) -> torch.Tensor:
        """The step's forward → logits [R, V]: one row per sampling chunk, 1 + len(draft) for a verify chunk
        (batch order). Steps whose every row wants logits (decodes, verify chunks) take the decode path as
        single-token rows (module docstring), others the mixed path."""
        chunks = output.chunks
        if chunks and all(c.samples and c.num_new == 1 + len(c.draft) for c in chunks):
            ids = [t for c in chunks for t in c.token_ids]
            tables = [c.block_table for c in chunks for _ in c.token_ids]
            cached = [c.num_cached + j for c in chunks for j in range(c.num_new)]
            if self.decode_graphs is not None and len(ids) <= self.decode_graphs.max_batch:
                return self.decode_graphs.forward(ids, tables, cached)  # [R, V]
            if self.cpu_decode_inputs is not None and len(ids) <= self.cpu_decode_inputs.max_batch:
                tokens, batch = self.cpu_decode_inputs.step(ids, tables, cached)
                with device_index_checks(False):  # validated on the host by CpuDecodeInputs.step
                    return self.model.forward(tokens, batch, self.cache)  # [R, V]
        return self._forward_mixed(chunks, output.block_size)  # [R, V]

    def execute(self, output: SchedulerOutput) -> tuple[list[int], list[TokenLogprob | None] | None]:
        """One forward over ``output.chunks``; returns the sampled ids of ``output.sampling_requests`` (in order)
        and, when one of them asks for ``logprobs``, one entry per request: its token's :class:`TokenLogprob`,
        or None for a request that does not ask (None instead of the list when none asks: no cost)."""
        logits = self._logits(output)  # [N, V]
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

    def execute_verify(self, output: SchedulerOutput) -> tuple[list[list[int]], list[list[TokenLogprob]] | None]:
        """One forward over ``output.chunks`` where some verify proposed tokens (``ScheduledChunk.draft``);
        returns, per request of ``output.sampling_requests``, its new tokens — the accepted proposals and one
        token more (:func:`~.speculative.verify.accept`) — and, when one of them asks for ``logprobs``, their
        :class:`TokenLogprob` lists (empty for a request that does not ask; None when none asks)."""
        logits = self._logits(output)  # [R, V]
        rows: list[VerifyRow] = []
        proposed: list[list[int]] = []
        for c in output.chunks:
            if not c.samples:
                continue
            r, d = c.request, c.draft
            history = r.params.needs_history
            seen, generated = (r.all_ids, list(r.output_ids)) if history else ([], [])
            for j in range(len(d) + 1):
                q = r.draft_probs[j] if r.draft_probs is not None and j < len(d) else None
                rows.append(VerifyRow(r.params, r.generator, seen + d[:j] if history else seen,
                                      generated + d[:j] if history else generated,
                                      d[j] if j < len(d) else None, q))
            proposed.append(d)
        # structured outputs: row j of a constrained request masked by its grammar after d_1 … d_j (raw `logits`
        # stay for logprobs, as in execute)
        masked = constrain_verify_logits(logits, [(c.request.grammar, c.draft) for c in output.chunks if c.samples],
                                         self._mask_workspace)  # [R, V]
        targets = target_tokens(masked, rows, self._default_generator, eos_ids=self.eos_ids)  # [R]
        if self._broadcast is not None:  # tensor parallel: rank 0's tokens everywhere
            targets = self._broadcast(targets)
        asks = [row.params.logprobs for row in rows]
        logprobs = token_logprobs(logits, targets, asks) if any(a is not None for a in asks) else None
        new = accept(targets.tolist(), proposed)  # the one host read of the step (a second one with logprobs)
        if logprobs is None:
            return new, None
        out, row = [], 0
        for d, toks in zip(proposed, new):
            out.append([lp for lp in logprobs[row:row + len(toks)] if lp is not None])
            row += len(d) + 1
        return new, out
