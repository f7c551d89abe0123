"""The index tensors of CPU decode steps, kept in buffers allocated once and updated in place.

Shape letters: B sequences of the step, Bmax the most sequences of a step, W the allocated block-table width.

On the CPU the kernels read a step's index tensors where they are built (host memory): no copy, no sync. A
decode step (one new token per sequence) changes them little: each sequence's position, slot and seq_len
advance by one, and its block table gains one block every ``block_size`` steps. :class:`CpuDecodeInputs`
holds token ids, positions, slot mapping, seq lens [Bmax] and block tables [Bmax, W] as tensors made once,
writes each step only what changed through NumPy views of them (no tensor made, no torch op dispatched),
and hands out one :class:`~mistral_kernels.batch.AttentionBatch` per B over their leading rows, the same
object every step while the buffers stay. It is the CPU side of the padded static-buffer runner of
:mod:`mistral_kernels.decode_graphs` without the padding: eager CPU steps gain nothing from fixed shapes.

Worked example (block_size 4). Request 7 decodes in row 0 with 5 cached tokens and table [3, 9]:
position 5, slot 9·4 + 1 = 37, seq_len 6, block-table row [3, 9, …] (both entries written: new row).
Next step: position 6, slot 38, seq_len 7 — the table is unchanged, so four scalars are written. At 8
cached tokens the table is [3, 9, 4]: only column 2 is written. Another request in row 0 (or the same one
after a preemption, with other blocks) rewrites the row. Columns beyond a row's table keep stale block ids:
the kernels read block j of row b only for j < ceil(seq_lens[b] / block_size).

Validation is :meth:`AttentionBatch.build`'s, on the host ints, for what the step writes: block ids in
[0, num_blocks) (the entries written; the others were checked when written), positions below
``max_position``, and tables long enough for their position.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from .batch import AttentionBatch

__all__ = ["CpuDecodeInputs"]


class CpuDecodeInputs:
    """Host buffers for decode steps of up to ``max_batch`` sequences (module docstring).

    Parameters
    ----------
    max_batch : most sequences of a step (Bmax)
    block_size : tokens per KV block
    num_blocks : physical blocks of the cache (block ids are checked against it)
    max_position : positions the model supports (a position must be below it)
    """

    INITIAL_WIDTH = 16  # block-table columns first allocated (doubled when a table outgrows them)

    def __init__(self, max_batch: int, block_size: int, num_blocks: int, max_position: int) -> None:
        if max_batch < 1 or block_size < 1 or num_blocks < 1:
            raise ValueError(f"CpuDecodeInputs: need max_batch, block_size and num_blocks >= 1, got {max_batch}, "
                             f"{block_size}, {num_blocks}")
        self.max_batch = max_batch
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.max_position = max_position
        # NumPy arrays (written per step) and the tensors sharing their memory (read by the kernels)
        self._ids, self._pos, self._slot = (np.zeros(max_batch, np.int64) for _ in range(3))
        self._lens = np.zeros(max_batch, np.int32)
        self.token_ids = torch.from_numpy(self._ids)                            # int64 [Bmax]
        self.positions = torch.from_numpy(self._pos)                            # int64 [Bmax]
        self.slot_mapping = torch.from_numpy(self._slot)                        # int64 [Bmax]
        self.seq_lens = torch.from_numpy(self._lens)                            # int32 [Bmax]
        self.cu_seqlens_q = torch.arange(max_batch + 1, dtype=torch.int32)      # int32 [Bmax+1]
        self._tables = np.zeros((max_batch, self.INITIAL_WIDTH), np.int32)
        self.block_tables = torch.from_numpy(self._tables)                      # int32 [Bmax, W]
        self._written: list[list[int]] = [[] for _ in range(max_batch)]  # row b's table as last written
        self._steps: dict[int, tuple[torch.Tensor, AttentionBatch]] = {}    # B → (token ids [B], batch)

    def _widen(self, width: int) -> None:
        """Reallocate the block tables with at least ``width`` columns (the written rows carried over)."""
        grown = np.zeros((self.max_batch, max(width, 2 * self._tables.shape[1])), np.int32)
        grown[:, :self._tables.shape[1]] = self._tables
        self._tables, self.block_tables = grown, torch.from_numpy(grown)
        self._steps.clear()  # their batches view the old tables

    def step(self, token_ids: Sequence[int], block_tables: Sequence[list[int]],
             num_cached: Sequence[int]) -> tuple[torch.Tensor, AttentionBatch]:
        """Write one decode step — sequence b brings ``token_ids[b]`` at position ``num_cached[b]`` with KV
        blocks ``block_tables[b]`` — and return (token ids int64 [B], its decode-only AttentionBatch).

        The tensors returned are views of the buffers: valid until the next call.

        Raises
        ------
        ValueError
            Lists of different lengths or more than ``max_batch`` rows; a position at or beyond
            ``max_position``; a table too short for its position; a block id outside [0, num_blocks).
        """
        b = len(token_ids)
        if not (len(block_tables) == len(num_cached) == b) or not 1 <= b <= self.max_batch:
            raise ValueError(f"CpuDecodeInputs.step: need 1 ≤ B ≤ {self.max_batch} equally long lists, got "
                             f"token_ids={b}, block_tables={len(block_tables)}, num_cached={len(num_cached)}")
        width = max(len(t) for t in block_tables)
        if width > self._tables.shape[1]:
            self._widen(width)
        bs, tables = self.block_size, self._tables
        for s in range(b):
            table, pos = block_tables[s], num_cached[s]
            if not 0 <= pos < self.max_position:
                raise ValueError(f"CpuDecodeInputs.step: sequence {s} is at position {pos}, outside the model's "
                                 f"positions [0, {self.max_position})")
            if pos // bs >= len(table):
                raise ValueError(f"CpuDecodeInputs.step: sequence {s} needs {pos + 1} tokens but its block table "
                                 f"holds {len(table)} blocks of {bs}")
            old = self._written[s]
            if table != old:
                start = len(old) if len(table) >= len(old) and table[:len(old)] == old else 0
                new = table[start:]
                for blk in new:
                    if not 0 <= blk < self.num_blocks:
                        self._written[s] = []  # the row is partly stale: rewrite it next time
                        raise ValueError(f"CpuDecodeInputs.step: sequence {s}'s block table holds block {blk}, "
                                         f"outside [0, {self.num_blocks}) (num_blocks of the cache)")
                tables[s, start:len(table)] = new
                self._written[s] = list(table)
            self._ids[s] = token_ids[s]
            self._pos[s] = pos
            self._slot[s] = table[pos // bs] * bs + pos % bs
            self._lens[s] = pos + 1
        cached = self._steps.get(b)
        if cached is None:
            batch = AttentionBatch(positions=self.positions[:b], slot_mapping=self.slot_mapping[:b],
                                   block_tables=self.block_tables[:b], seq_lens=self.seq_lens[:b],
                                   cu_seqlens_q=self.cu_seqlens_q[:b + 1], decode_only=True)
            cached = self._steps[b] = (self.token_ids[:b], batch)
        return cached
