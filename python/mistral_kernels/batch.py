"""Attention metadata of one forward step over a batch of sequences in a paged KV cache.

Shape letters: T new tokens (packed over the batch), B sequences, M max blocks per sequence.

A forward step feeds T new tokens of B sequences (packed: sequence 0's new tokens, then sequence 1's,
...). Sequence b already has ``num_cached[b]`` tokens in the cache and brings ``num_new[b]`` new ones;
its tokens live in the cache blocks ``block_tables[b]`` (token at position p → block
``block_tables[b][p // block_size]``, offset ``p % block_size``). The same structure serves a prefill
(long ``num_new``, possibly after a cached prefix: chunked prefill) and a decode step (``num_new`` all
1, routed to the decode attention kernel).

Worked example: block_size 4, two sequences —
sequence 0 has 5 cached tokens, 2 new, blocks [7, 2]; sequence 1 is new with 3 tokens, blocks [5]::

    positions     = [5, 6, 0, 1, 2]                      int64 [T]
    slot_mapping  = [2*4+1, 2*4+2, 5*4+0, 5*4+1, 5*4+2]  int64 [T]  (block*block_size + offset)
                  = [9, 10, 20, 21, 22]
    block_tables  = [[7, 2], [5, 0]]                     int32 [B, M] (rows padded with 0)
    seq_lens      = [7, 3]                               int32 [B]   cached + new
    cu_seqlens_q  = [0, 2, 5]                            int32 [B+1] prefix sums of num_new
    decode_only   = False
    num_decode    = 0      (leading sequences with exactly one new token: none here)

A mixed step whose first sequences decode sends those rows to the decode kernel (split-K over long
contexts) and the rest to the prefill kernel. :class:`~mistral_kernels.runner.ModelRunner` builds every
mixed step with all its single-token chunks first, so all decode rows take the decode kernel. With sequences
[decode, decode, prefill chunk of 3], ``num_decode = 2`` and ``prefill_cu_seqlens_q = [0, 3]`` (the
cu_seqlens_q of the sequences after them, from 0).

With ``logits_sequences=[1]`` (only sequence 1 samples, e.g. sequence 0 is mid-prefill)::

    logits_indices = [cu_seqlens_q[2] - 1] = [4]         int64 [N]   last new row of each listed sequence

With ``logits_rows=[3]`` as well (speculative decoding verifies 2 proposed tokens of sequence 1: its last 3
rows each need logits)::

    logits_indices = [2, 3, 4]                           int64 [N]   last logits_rows[i] rows of each listed one
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .transfer import to_device

__all__ = ["AttentionBatch"]


@dataclass(frozen=True)
class AttentionBatch:
    """Where the T new tokens of B sequences sit in the paged KV cache (module docstring has an example).

    Attributes
    ----------
    positions : int64 [T], position of each new token in its sequence (RoPE and causal mask)
    slot_mapping : int64 [T], cache slot (block·block_size + offset) each new token's k/v is written to;
        -1 skips the write
    block_tables : int32 [B, M], cache blocks of each sequence in order (unused entries arbitrary)
    seq_lens : int32 [B], tokens of each sequence in the cache after this step (cached + new)
    cu_seqlens_q : int32 [B+1], new tokens of sequence b are rows cu_seqlens_q[b]:cu_seqlens_q[b+1]
    decode_only : every sequence has exactly one new token (T == B): use the decode attention kernel
    logits_indices : int64 [N] rows of the T tokens whose logits are wanted (e.g. the last token of each
        sequence); None computes logits for all T rows
    num_decode : when not decode_only, how many leading sequences have exactly one new token (their rows
        go to the decode kernel, the others' to the prefill kernel with ``prefill_cu_seqlens_q``)
    prefill_cu_seqlens_q : int32 [B - num_decode + 1], cu_seqlens_q of the sequences after the leading
        decodes, from 0 (None when num_decode is 0)
    """

    positions: torch.Tensor
    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    cu_seqlens_q: torch.Tensor
    decode_only: bool
    logits_indices: torch.Tensor | None = None
    num_decode: int = 0
    prefill_cu_seqlens_q: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return self.positions.shape[0]

    @classmethod
    def build(
        cls,
        block_tables: Sequence[Sequence[int]],
        num_cached: Sequence[int],
        num_new: Sequence[int],
        block_size: int,
        device: torch.device | str = "cpu",
        logits_sequences: Sequence[int] | None = None,
        *,
        num_blocks: int | None = None,
        max_position: int | None = None,
        logits_rows: Sequence[int] | None = None,
    ) -> AttentionBatch:
        """Build the metadata on the host from per-sequence lists (see the module docstring).

        This is the step's one validation of the index tensors: with ``num_blocks`` and ``max_position``
        given, every index a kernel of the forward reads is checked here, on the host lists (block ids in
        [0, num_blocks), positions below max_position; slots, seq_lens and cu_seqlens_q are in range by
        construction), so the forward can run with the device index checks off
        (:func:`mistral_kernels.ops.device_index_checks`, docs/design.md §3) and without a host sync. The
        tensors reach ``device`` through :func:`~mistral_kernels.transfer.to_device` (no sync either).

        Parameters
        ----------
        block_tables : B lists of block ids; sequence b needs ceil((num_cached[b]+num_new[b]) / block_size)
        num_cached : tokens of each sequence already in the cache
        num_new : new tokens of each sequence in this step (≥ 1)
        block_size : tokens per cache block
        logits_sequences : distinct sequences b whose last new token gets logits, in the order of the logits
            rows: ``logits_indices`` = their rows ``cu_seqlens_q[b+1] - 1``; ``range(B)`` = every sequence's
            last token, ``[]`` = none; None leaves ``logits_indices`` None (logits for all T rows)
        num_blocks : physical blocks of the cache; when given, every block id of the tables must lie in
            [0, num_blocks) (ValueError otherwise)
        max_position : rows of the RoPE table; when given, every position must be below it
        logits_rows : per listed sequence, how many of its last new rows get logits (1 ≤ n ≤ its num_new;
            default 1 each): the verify rows of speculative decoding
        """
        b = len(block_tables)
        if not (len(num_cached) == len(num_new) == b) or b == 0:
            raise ValueError(f"AttentionBatch.build: need B ≥ 1 equally long lists, got block_tables={b}, "
                             f"num_cached={len(num_cached)}, num_new={len(num_new)}")
        positions: list[int] = []
        slots: list[int] = []
        for s, (table, cached, new) in enumerate(zip(block_tables, num_cached, num_new)):
            if new < 1 or cached < 0:
                raise ValueError(f"AttentionBatch.build: sequence {s} has num_cached={cached}, num_new={new}")
            if (cached + new + block_size - 1) // block_size > len(table):
                raise ValueError(f"AttentionBatch.build: sequence {s} needs {cached + new} tokens but its block "
                                 f"table holds {len(table)} blocks of {block_size}")
            if num_blocks is not None and any(not 0 <= blk < num_blocks for blk in table):
                bad = next(blk for blk in table if not 0 <= blk < num_blocks)
                raise ValueError(f"AttentionBatch.build: sequence {s}'s block table holds block {bad}, outside "
                                 f"[0, {num_blocks}) (num_blocks of the cache)")
            if max_position is not None and cached + new > max_position:
                raise ValueError(f"AttentionBatch.build: sequence {s} reaches position {cached + new - 1}, "
                                 f"beyond the model's max_position {max_position}")
            for p in range(cached, cached + new):
                positions.append(p)
                slots.append(table[p // block_size] * block_size + p % block_size)
        width = max(len(t) for t in block_tables)
        tables = [list(t) + [0] * (width - len(t)) for t in block_tables]
        cu = [0]
        for new in num_new:
            cu.append(cu[-1] + new)
        logits_indices = None
        if logits_sequences is not None:
            rows = list(logits_sequences)
            if any(not 0 <= r < b for r in rows) or len(set(rows)) != len(rows):
                raise ValueError(f"AttentionBatch.build: logits_sequences must be distinct ids in [0, {b}), "
                                 f"got {rows}")
            counts = [1] * len(rows) if logits_rows is None else list(logits_rows)
            if len(counts) != len(rows) or any(not 1 <= n <= num_new[r] for r, n in zip(rows, counts)):
                raise ValueError(f"AttentionBatch.build: logits_rows must give 1 … num_new rows for each of the "
                                 f"{len(rows)} logits_sequences, got {counts}")
            logits_indices = to_device([i for r, n in zip(rows, counts) for i in range(cu[r + 1] - n, cu[r + 1])],
                                       torch.int64, device)
        decode_only = all(n == 1 for n in num_new)
        num_decode = 0
        while not decode_only and num_new[num_decode] == 1:
            num_decode += 1
        prefill_cu = to_device([c - cu[num_decode] for c in cu[num_decode:]], torch.int32, device) if num_decode else None
        return cls(
            positions=to_device(positions, torch.int64, device),
            slot_mapping=to_device(slots, torch.int64, device),
            block_tables=to_device(tables, torch.int32, device),
            seq_lens=to_device([c + n for c, n in zip(num_cached, num_new)], torch.int32, device),
            cu_seqlens_q=to_device(cu, torch.int32, device),
            decode_only=decode_only,
            logits_indices=logits_indices,
            num_decode=num_decode,
            prefill_cu_seqlens_q=prefill_cu,
        )
