"""Decode steps through padded static input buffers, replayed as CUDA graphs (one per batch-size bucket).

Shape letters: B sequences of the step, Bp its bucket (padded batch), Bmax the largest bucket, M max
blocks per sequence, V vocab.

The design is vLLM's CUDA-graph runner, re-derived for this package. A decode step's inputs are five
small tensors — token ids, positions, slot mapping [Bp], block tables [Bp, M] and seq lens [Bp]. They
live in static buffers allocated once for the largest bucket. A step of B sequences runs in the
smallest bucket Bp ≥ B: its rows go to the first B rows of the buffers and rows B … Bp-1 are padding::

    token id 0, position 0, slot -1 (reshape_and_cache skips it), block-table row of 0s, seq_len 0
    (decode attention over no key returns zeros: csrc/kernels/paged_decode.cuh, csrc/cpu/)

so a padded row writes nothing to the cache and reads nothing from it; its logits are computed and
dropped (every op of the decoder is row-independent). Only the first ``w`` columns of the block tables
are refreshed, ``w`` the widest table of the step: the kernels read block j of sequence b only for
j < ceil(seq_lens[b] / S), so stale columns are never read.

On CUDA the forward of each bucket is captured once (largest first, one shared memory pool) into a CUDA
graph over these buffers and replayed each step: no per-layer launch overhead and no host work in the
forward. Elsewhere the same padded forward runs eagerly — that is how it is tested without a GPU
(tests/test_decode_graphs.py: logits equal the unpadded forward for every bucket). The forward runs with
the device index checks off: the step's indices were validated on the host by
:meth:`AttentionBatch.build <mistral_kernels.batch.AttentionBatch.build>` (and a stream that captures
skips them anyway).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .batch import AttentionBatch
from .ops import device_index_checks
from .transfer import copy_into

__all__ = ["DecodeGraphRunner", "decode_buckets"]


def decode_buckets(max_batch: int) -> list[int]:
    """Padded batch sizes: 1, 2, 4, then multiples of 8, and ``max_batch`` itself (e.g. 20 → [1, 2, 4, 8, 16, 20])."""
    if max_batch < 1:
        raise ValueError(f"decode_buckets: max_batch must be >= 1, got {max_batch}")
    sizes = [b for b in (1, 2, 4) if b < max_batch] + list(range(8, max_batch, 8))
    return sorted(set(sizes + [max_batch]))


class DecodeGraphRunner:
    """Runs decode steps (one new token per sequence) through padded static buffers.

    Parameters
    ----------
    model : a :class:`~mistral_kernels.runner.PagedModel` (``forward(token_ids, batch, cache)``)
    cache : its paged KV cache (the same object every step: graphs capture its tensors)
    num_blocks, block_size : the cache pool (block ids are validated against ``num_blocks``)
    max_batch : largest batch of a step; buckets from :func:`decode_buckets`
    capture : capture one CUDA graph per bucket now (needs a CUDA model); False runs the padded forward eagerly
    """

    def __init__(self, model: Any, cache: Any, num_blocks: int, block_size: int, max_batch: int, *,
                 capture: bool) -> None:
        self.model = model
        self.cache = cache
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.max_position = model.config.max_position
        self.buckets = decode_buckets(max_batch)
        device = torch.device(model.device)
        if capture and device.type != "cuda":
            raise ValueError(f"DecodeGraphRunner: CUDA graphs need a CUDA model, got device {device}")
        bmax, m = self.buckets[-1], -(-self.max_position // block_size)
        self.token_ids = torch.zeros(bmax, dtype=torch.int64, device=device)         # [Bmax]
        self.positions = torch.zeros(bmax, dtype=torch.int64, device=device)         # [Bmax]
        self.slot_mapping = torch.full((bmax,), -1, dtype=torch.int64, device=device)  # [Bmax]
        self.block_tables = torch.zeros(bmax, m, dtype=torch.int32, device=device)   # [Bmax, M]
        self.seq_lens = torch.zeros(bmax, dtype=torch.int32, device=device)          # [Bmax]
        self.cu_seqlens_q = torch.arange(bmax + 1, dtype=torch.int32, device=device)  # [Bmax+1] (unused by decode)
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        if capture:
            self._capture_all()

    @property
    def max_batch(self) -> int:
        return self.buckets[-1]

    @property
    def captured(self) -> list[int]:
        """The buckets that replay a CUDA graph (empty when running eagerly)."""
        return sorted(self._graphs)

    def bucket_for(self, b: int) -> int:
        """The smallest bucket that holds ``b`` sequences."""
        for bp in self.buckets:
            if bp >= b:
                return bp
        raise ValueError(f"DecodeGraphRunner: {b} sequences exceed the largest bucket {self.max_batch}")

    def _batch(self, bp: int) -> AttentionBatch:
        return AttentionBatch(positions=self.positions[:bp], slot_mapping=self.slot_mapping[:bp],
                              block_tables=self.block_tables[:bp], seq_lens=self.seq_lens[:bp],
                              cu_seqlens_q=self.cu_seqlens_q[:bp + 1], decode_only=True)

    def _forward(self, bp: int) -> torch.Tensor:
        with device_index_checks(False):
            return self.model.forward(self.token_ids[:bp], self._batch(bp), self.cache)  # [Bp, V]

    def _capture_all(self) -> None:
        pool = None
        for bp in sorted(self.buckets, reverse=True):  # largest first: the smaller graphs reuse its pool
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._forward(bp)  # warm-up (lazy inits, allocator) outside the capture; pads write nothing
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                logits = self._forward(bp)
            pool = graph.pool()
            self._graphs[bp] = (graph, logits)

    def forward(self, token_ids: Sequence[int], block_tables: Sequence[Sequence[int]],
                num_cached: Sequence[int]) -> torch.Tensor:
        """Logits [B, V] of one decode step: sequence b brings token ``token_ids[b]`` at position ``num_cached[b]``.

        Raises ValueError (from :meth:`AttentionBatch.build`) for a block id outside the pool, a table too
        short for its sequence or a position beyond the model's; and for more sequences than the largest bucket.
        """
        b = len(token_ids)
        bp = self.bucket_for(b)
        host = AttentionBatch.build(block_tables, num_cached, [1] * b, self.block_size, "cpu",
                                    num_blocks=self.num_blocks, max_position=self.max_position)
        pad = bp - b
        w = host.block_tables.shape[1]
        if w > self.block_tables.shape[1]:
            raise ValueError(f"DecodeGraphRunner: a block table of {w} blocks exceeds max_position "
                             f"{self.max_position} / block_size {self.block_size}")
        zeros64 = torch.zeros(pad, dtype=torch.int64)
        copy_into(self.token_ids[:bp], torch.cat([torch.tensor(token_ids, dtype=torch.int64), zeros64]))
        copy_into(self.positions[:bp], torch.cat([host.positions, zeros64]))
        copy_into(self.slot_mapping[:bp], torch.cat([host.slot_mapping, torch.full((pad,), -1, dtype=torch.int64)]))
        copy_into(self.block_tables[:bp, :w], torch.cat([host.block_tables, torch.zeros(pad, w, dtype=torch.int32)]))
        copy_into(self.seq_lens[:bp], torch.cat([host.seq_lens, torch.zeros(pad, dtype=torch.int32)]))
        if bp in self._graphs:
            graph, logits = self._graphs[bp]
            graph.replay()
        else:
            logits = self._forward(bp)
        return logits[:b]
