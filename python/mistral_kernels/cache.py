"""Block manager of the paged KV cache: which physical blocks each sequence owns.

The KV cache is ``num_blocks`` blocks of ``block_size`` token slots (per layer: k/v tensors
[num_blocks, block_size, Hkv, D], allocated by the model). A sequence's *block table* lists, for each
logical block i (its positions i*block_size … (i+1)*block_size-1), the physical block holding them.
This module only does the bookkeeping (host-side Python ints); the model runner turns tables into the int32
``block_tables`` tensor of :class:`mistral_kernels.batch.AttentionBatch`.

Sliding window W: a query at position p reads keys j with p-W < j ≤ p only, so once the *next* query to
run sits at position q, every logical block whose last position is ≤ q-W is never read again and is
freed. Its table entry keeps its place (positions stay logical) but points at :data:`FREED` (= block 0,
any valid id works: the attention kernels never read a block entirely outside the window). A Mistral
sequence therefore holds at most ceil(W/block_size)+1 blocks (+ those of the current prefill chunk):
O(W) memory, not O(length).

Worked example: block_size 4, W 6, a sequence of 13 tokens whose next query is at position 13::

    first visible key = 13-6+1 = 8          -> logical blocks 0 (pos 0-3) and 1 (pos 4-7) are freed
    table before  [9, 3, 7, 1]               -> after [0, 0, 7, 1]   (7 holds pos 8-11, 1 holds pos 12-15)
    position 13 -> slot 1*4 + 13%4 = 5
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

__all__ = ["FREED", "BlockManager", "OutOfBlocksError", "blocks_for", "default_num_blocks"]

FREED = 0  # table entry of a logical block freed by the sliding window (never read by the kernels)


class OutOfBlocksError(RuntimeError):
    """No free block for a request right now (the engine then waits or preempts)."""


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Number of blocks covering positions 0 … num_tokens-1 (ceil division)."""
    return (num_tokens + block_size - 1) // block_size


class BlockManager:
    """Allocates, grows and frees per-sequence block tables over a fixed pool of blocks.

    Parameters
    ----------
    num_blocks : int
        Physical blocks in the pool (ids 0 … num_blocks-1).
    block_size : int
        Token slots per block.
    sliding_window : int or None
        W of the model, or None for full causal attention (nothing is freed early).
    """

    def __init__(self, num_blocks: int, block_size: int, sliding_window: int | None = None) -> None:
        if num_blocks < 1:
            raise ValueError(f"BlockManager: num_blocks must be ≥ 1, got {num_blocks}")
        if block_size < 1 or block_size & (block_size - 1):
            raise ValueError(f"BlockManager: block_size must be a power of two, got {block_size}")
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"BlockManager: sliding_window must be ≥ 1 or None, got {sliding_window}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.sliding_window = sliding_window
        # LIFO free list: recently freed (cache-warm) blocks are reused first.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._tables: dict[Hashable, list[int]] = {}
        self._owned: dict[Hashable, set[int]] = {}  # physical blocks a sequence really holds (not FREED slots)
        self._first_live: dict[Hashable, int] = {}  # logical blocks below this were freed by the window

    # ---------------------------------------------------------------- queries
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def has(self, seq: Hashable) -> bool:
        return seq in self._tables

    def block_table(self, seq: Hashable) -> list[int]:
        """The sequence's table (logical block i → physical id; :data:`FREED` where freed by the window)."""
        return self._tables[seq]

    def owned_blocks(self, seq: Hashable) -> frozenset[int]:
        """Physical blocks the sequence holds (window-freed entries excluded)."""
        return frozenset(self._owned.get(seq, ()))

    def num_owned(self, seq: Hashable) -> int:
        """Physical blocks the sequence holds."""
        return len(self._owned.get(seq, ()))

    def first_needed_block(self, first_query_pos: int) -> int:
        """Lowest logical block still read by a query at ``first_query_pos`` (0 without a window)."""
        if self.sliding_window is None:
            return 0
        return max(0, first_query_pos - self.sliding_window + 1) // self.block_size

    def blocks_needed(self, seq: Hashable, first_query_pos: int, num_tokens: int) -> int:
        """New physical blocks that :meth:`allocate` would take for the sequence to hold ``num_tokens``
        positions when its next query starts at ``first_query_pos`` (window-freed blocks not counted)."""
        table = self._tables.get(seq, [])
        first = self.first_needed_block(first_query_pos)
        total = blocks_for(num_tokens, self.block_size)
        return max(0, total - max(len(table), first))

    def max_blocks_per_sequence(self, num_tokens: int, chunk: int = 1) -> int:
        """Most blocks a sequence of ``num_tokens`` positions ever holds at once when it advances at most
        ``chunk`` positions per step (used to reject a request that can never fit)."""
        full = blocks_for(num_tokens, self.block_size)
        if self.sliding_window is None:
            return full
        # Positions [q-W+1, q+chunk-1] touch at most this many blocks.
        return min(full, blocks_for(self.sliding_window + chunk - 1, self.block_size) + 1)

    # ---------------------------------------------------------------- updates
    def free_outside_window(self, seq: Hashable, first_query_pos: int) -> int:
        """Free the blocks no query at or after ``first_query_pos`` reads; return how many were freed."""
        table = self._tables.get(seq)
        if table is None:
            return 0
        upto = min(self.first_needed_block(first_query_pos), len(table))
        start = self._first_live.get(seq, 0)
        freed = 0
        owned = self._owned[seq]
        for i in range(start, upto):
            block = table[i]
            if block in owned:
                owned.discard(block)
                self._free.append(block)
                freed += 1
            table[i] = FREED
        self._first_live[seq] = max(start, upto)
        return freed

    def allocate(self, seq: Hashable, first_query_pos: int, num_tokens: int) -> None:
        """Grow the sequence's table so it covers positions 0 … num_tokens-1.

        First frees the blocks outside the window of ``first_query_pos`` (the first position written in
        this step); logical blocks that are already out of the window are never materialised.

        Raises
        ------
        OutOfBlocksError
            Not enough free blocks; nothing is changed then (apart from window freeing).
        """
        table = self._tables.setdefault(seq, [])
        self._owned.setdefault(seq, set())
        self._first_live.setdefault(seq, 0)
        self.free_outside_window(seq, first_query_pos)
        first = self.first_needed_block(first_query_pos)
        total = blocks_for(num_tokens, self.block_size)
        need = max(0, total - max(len(table), first))
        if need > len(self._free):
            if not table:
                self._drop(seq)
            raise OutOfBlocksError(f"sequence {seq!r} needs {need} more KV blocks, {len(self._free)} free")
        owned = self._owned[seq]
        while len(table) < total:
            if len(table) < first:  # already outside the window: keep the position, hold no memory
                table.append(FREED)
                continue
            block = self._free.pop()
            owned.add(block)
            table.append(block)
        self._first_live[seq] = max(self._first_live[seq], min(first, len(table)))

    def free(self, seq: Hashable) -> None:
        """Return all the sequence's blocks to the pool (finished or preempted)."""
        owned = self._owned.get(seq)
        if owned is None:
            return
        self._free.extend(sorted(owned, reverse=True))
        self._drop(seq)

    def _drop(self, seq: Hashable) -> None:
        self._tables.pop(seq, None)
        self._owned.pop(seq, None)
        self._first_live.pop(seq, None)


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
