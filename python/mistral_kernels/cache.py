"""Block manager of the paged KV cache: which physical blocks each sequence holds, and the prefix cache.

The KV cache is ``num_blocks + 1`` blocks of ``block_size`` token slots (per layer: k/v tensors
[num_blocks + 1, block_size, Hkv, D], allocated by the model). Block 0 is the reserved *null block*
(:data:`NULL_BLOCK`): no sequence ever holds it; it is what padded or window-freed table entries point at.
Blocks 1 … num_blocks are handed out. A sequence's *block table* lists, for each logical block i (its
positions i*block_size … (i+1)*block_size-1), the physical block holding them. This module only does the
bookkeeping (host-side Python ints); the model runner turns tables into the int32 ``block_tables`` tensor
of :class:`mistral_kernels.batch.AttentionBatch`.

Sliding window W: a query at position p reads keys j with p-W < j ≤ p only, so once the *next* query to
run sits at position q, every logical block whose last position is ≤ q-W is never read again and is
released. Its table entry keeps its place (positions stay logical) but points at :data:`FREED` (= the
null block; the attention kernels never read a block entirely outside the window). A Mistral sequence
therefore holds at most ceil(W/block_size)+1 blocks (+ those of the current prefill chunk): O(W) memory.

Worked example: block_size 4, W 6, a sequence of 13 tokens whose next query is at position 13::

    first visible key = 13-6+1 = 8          -> logical blocks 0 (pos 0-3) and 1 (pos 4-7) are released
    table before  [9, 3, 7, 1]               -> after [0, 0, 7, 1]   (7 holds pos 8-11, 1 holds pos 12-15)
    position 13 -> slot 1*4 + 13%4 = 5

Prefix caching (``prefix_caching=True``; docs/design.md §9)
-----------------------------------------------------------
Once a *full* block's k/v are computed it gets a content address: ``hash_block(parent, tokens)`` =
sha256(parent's address ‖ its block_size token ids), the chain starting at :func:`root_hash` of a salt
naming the model and dtype. A block's k/v depend on every earlier token, which the chain covers, so two
blocks with one address hold the same k/v. Every block has a reference count (the tables holding it);
released blocks with an address stay *cached*: evictable, least recently released first, reused only
when no never-cached block is free. A new (or preempted) sequence starts with :meth:`match_prefix`: the
longest run of its full blocks whose addresses are cached is taken by reference and not recomputed.

What is never shared: a partial block (the last one of a sequence: only full blocks get an address), the
block holding the last known token (at least one token is always computed, so the step has logits), and
any block a sequence writes to — writes go only to blocks a sequence allocated itself (reference count
1), because positions only grow and shared blocks are full. Blocks computed in one step are registered
when that step is committed; the scheduler makes a request whose next block another request computes in
the current step wait one step for it, rather than compute it again.

Worked example (block_size 4, no window). A ran the prompt [1 2 3 4 | 5 6 7 8 | 9 10] and finished:
its blocks of [1 2 3 4] and [5 6 7 8] are cached (evictable) under h1 = hash(root, 1 2 3 4) and
h2 = hash(h1, 5 6 7 8); the partial block [9 10] went back to the free list. B = [1 2 3 4 | 5 6 7 8 | 11]
matches h1, h2: it takes both by reference and computes only token 11 (position 8) in a fresh block.
C = [1 2 3 4 | 5 6 7 8] matches only h1: its last token must be computed, so block 1 is recomputed into
a fresh block (h2 then already has a block: C's copy stays unregistered).

With a sliding window a match needs only the blocks the first computed query still reads: k blocks match
when blocks first_needed_block(k*block_size) … k-1 are cached (earlier ones may have been evicted: the
chain proves their content without them); the earlier entries are :data:`FREED`.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

__all__ = ["FREED", "NULL_BLOCK", "BlockManager", "OutOfBlocksError", "blocks_for", "cache_salt",
           "default_num_blocks", "hash_block", "root_hash"]

NULL_BLOCK = 0  # reserved physical block: held by no sequence, the target of padded / freed entries
FREED = NULL_BLOCK  # table entry of a logical block released by the sliding window (never read by the kernels)


class OutOfBlocksError(RuntimeError):
    """No free block for a request right now (the engine then waits or preempts)."""


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Number of blocks covering positions 0 … num_tokens-1 (ceil division)."""
    return (num_tokens + block_size - 1) // block_size


def root_hash(salt: str) -> bytes:
    """Parent address of a sequence's first block: the salt names everything else the k/v depend on."""
    return hashlib.sha256(b"mistral-kernels prefix cache\0" + salt.encode()).digest()


def hash_block(parent: bytes, token_ids: Sequence[int]) -> bytes:
    """Content address of a full block: sha256(parent address ‖ its token ids as int64)."""
    return hashlib.sha256(parent + array("q", token_ids).tobytes()).digest()


def cache_salt(config: Any, dtype: Any) -> str:
    """The salt of a model's prefix cache: its whole configuration and the KV dtype. (Tensor-parallel ranks
    share the same tables, so nothing per rank.)"""
    return f"{config!r}|{dtype}"


class BlockManager:
    """Allocates, grows, shares and releases per-sequence block tables over a fixed pool of blocks.

    Parameters
    ----------
    num_blocks : int
        Blocks sequences can hold (ids 1 … num_blocks; the cache has one more, the null block 0).
    block_size : int
        Token slots per block.
    sliding_window : int or None
        W of the model, or None for full causal attention (nothing is released early).
    prefix_caching : bool
        Keep computed full blocks addressable by content and share them (module docstring).
    salt : str
        Everything besides the tokens that the k/v depend on (:func:`cache_salt`).
    """

    def __init__(self, num_blocks: int, block_size: int, sliding_window: int | None = None, *,
                 prefix_caching: bool = False, salt: str = "") -> None:
        if num_blocks < 1:
            raise ValueError(f"BlockManager: num_blocks must be ≥ 1, got {num_blocks}")
        if block_size < 1 or block_size & (block_size - 1):
            raise ValueError(f"BlockManager: block_size must be a power of two, got {block_size}")
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"BlockManager: sliding_window must be ≥ 1 or None, got {sliding_window}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.sliding_window = sliding_window
        self.prefix_caching = prefix_caching
        self._root = root_hash(salt)
        # LIFO free list of blocks without an address: recently freed (cache-warm) blocks are reused first.
        self._free: list[int] = list(range(num_blocks, NULL_BLOCK, -1))
        self._ref = [0] * (num_blocks + 1)  # tables holding each block
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, held by nobody; least recent first
        self._hash_of: dict[int, bytes] = {}  # cached block → its address
        self._block_of: dict[bytes, int] = {}  # address → cached block
        self._tables: dict[Hashable, list[int]] = {}
        self._first_live: dict[Hashable, int] = {}  # logical blocks below this were released by the window
        self._hashes: dict[Hashable, list[bytes]] = {}  # addresses of the sequence's computed full blocks

    # ---------------------------------------------------------------- queries
    @property
    def num_physical_blocks(self) -> int:
        """Blocks of the KV cache tensors: the pool plus the null block."""
        return self.num_blocks + 1

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take: never-cached free ones plus cached ones nobody holds."""
        return len(self._free) + len(self._evictable)

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by at least one sequence (a shared block counts once)."""
        return self.num_blocks - self.num_free_blocks

    @property
    def num_evictable_blocks(self) -> int:
        """Cached blocks nobody holds: counted as free, reused least recently released first."""
        return len(self._evictable)

    def has(self, seq: Hashable) -> bool:
        return seq in self._tables

    def block_table(self, seq: Hashable) -> list[int]:
        """The sequence's table (logical block i → physical id; :data:`FREED` where released by the window)."""
        return self._tables[seq]

    def owned_blocks(self, seq: Hashable) -> frozenset[int]:
        """Physical blocks the sequence holds, shared ones included (window-released entries excluded)."""
        return frozenset(self._tables[seq][self._first_live[seq]:]) if seq in self._tables else frozenset()

    def num_owned(self, seq: Hashable) -> int:
        """Physical blocks the sequence holds."""
        return len(self._tables[seq]) - self._first_live[seq] if seq in self._tables else 0

    def ref_count(self, block: int) -> int:
        """How many tables hold ``block``."""
        return self._ref[block]

    def free_block_ids(self) -> frozenset[int]:
        """Free blocks without an address."""
        return frozenset(self._free)

    def evictable_block_ids(self) -> list[int]:
        """Cached blocks nobody holds, least recently released first (the next to be reused)."""
        return list(self._evictable)

    def cached_blocks(self) -> dict[bytes, int]:
        """Address → block of every cached block (held or evictable)."""
        return dict(self._block_of)

    def first_needed_block(self, first_query_pos: int) -> int:
        """Lowest logical block still read by a query at ``first_query_pos`` (0 without a window)."""
        if self.sliding_window is None:
            return 0
        return max(0, first_query_pos - self.sliding_window + 1) // self.block_size

    def max_blocks_per_sequence(self, num_tokens: int, chunk: int = 1) -> int:
        """Most blocks a sequence of ``num_tokens`` positions ever holds at once when it advances at most
        ``chunk`` positions per step (used to reject a request that can never fit)."""
        full = blocks_for(num_tokens, self.block_size)
        if self.sliding_window is None:
            return full
        # Positions [q-W+1, q+chunk-1] touch at most this many blocks.
        return min(full, blocks_for(self.sliding_window + chunk - 1, self.block_size) + 1)

    # ---------------------------------------------------------------- updates
    def match_prefix(self, seq: Hashable, token_ids: Sequence[int]) -> int:
        """Start a new sequence from the longest cached prefix of ``token_ids`` (module docstring): take the
        matching blocks by reference and return the number of tokens they hold (a multiple of block_size,
        < len(token_ids); 0 without prefix caching or a match)."""
        if seq in self._tables:
            raise ValueError(f"BlockManager.match_prefix: sequence {seq!r} already has blocks")
        if not self.prefix_caching or not self._block_of:
            return 0
        bs = self.block_size
        hashes = self.addresses(token_ids, (len(token_ids) - 1) // bs)  # the last token's block is computed
        found = [self._block_of.get(h) for h in hashes]
        k = run = 0
        for i, block in enumerate(found):  # k blocks match when blocks first_needed(k*bs) … k-1 are cached
            run = run + 1 if block is not None else 0
            if run >= i + 1 - self.first_needed_block((i + 1) * bs):
                k = i + 1
        if k == 0:
            return 0
        first = self.first_needed_block(k * bs)
        table = [FREED] * first
        for block in found[first:k]:
            assert block is not None
            self._take(block)
            table.append(block)
        self._tables[seq] = table
        self._first_live[seq] = first
        self._hashes[seq] = hashes[:k]
        return k * bs

    def addresses(self, token_ids: Sequence[int], num_blocks: int) -> list[bytes]:
        """Content addresses of the first ``num_blocks`` full blocks of ``token_ids``."""
        bs, parent, out = self.block_size, self._root, []
        for i in range(num_blocks):
            parent = hash_block(parent, token_ids[i * bs:(i + 1) * bs])
            out.append(parent)
        return out

    def completing_addresses(self, seq: Hashable, num_computed: int,
                             token_ids: Callable[[int, int], Sequence[int]]) -> list[bytes]:
        """Addresses of the blocks that become full when the sequence's k/v reach ``num_computed`` positions
        (those :meth:`cache_computed` will register then)."""
        hashes = self._hashes.get(seq, [])
        bs, parent, out = self.block_size, hashes[-1] if hashes else self._root, []
        for i in range(len(hashes), num_computed // bs):
            parent = hash_block(parent, token_ids(i * bs, (i + 1) * bs))
            out.append(parent)
        return out

    def free_outside_window(self, seq: Hashable, first_query_pos: int) -> int:
        """Release the blocks no query at or after ``first_query_pos`` reads; return how many were released
        (a cached block released by its last holder stays cached, evictable)."""
        table = self._tables.get(seq)
        if table is None:
            return 0
        upto = min(self.first_needed_block(first_query_pos), len(table))
        start = self._first_live[seq]
        released = 0
        for i in range(start, upto):
            if table[i] != FREED:
                self._release(table[i])
                released += 1
            table[i] = FREED
        self._first_live[seq] = max(start, upto)
        return released

    def allocate(self, seq: Hashable, first_query_pos: int, num_tokens: int) -> None:
        """Grow the sequence's table so it covers positions 0 … num_tokens-1, with blocks it holds alone.

        First releases the blocks outside the window of ``first_query_pos`` (the first position written in
        this step); logical blocks that are already out of the window are never materialised. Free blocks
        are taken before evictable cached ones (least recently released first; their address is dropped).

        Raises
        ------
        OutOfBlocksError
            Not enough free blocks; nothing is changed then (apart from window releasing).
        """
        table = self._tables.setdefault(seq, [])
        self._first_live.setdefault(seq, 0)
        self.free_outside_window(seq, first_query_pos)
        first = self.first_needed_block(first_query_pos)
        total = blocks_for(num_tokens, self.block_size)
        need = max(0, total - max(len(table), first))
        if need > self.num_free_blocks:
            if not table:
                self._drop(seq)
            raise OutOfBlocksError(f"sequence {seq!r} needs {need} more KV blocks, {self.num_free_blocks} free")
        while len(table) < total:
            if len(table) < first:  # already outside the window: keep the position, hold no memory
                table.append(FREED)
                continue
            block = self._pop_free()
            self._ref[block] = 1
            table.append(block)
        self._first_live[seq] = max(self._first_live[seq], min(first, len(table)))

    def cache_computed(self, seq: Hashable, num_computed: int, token_ids: Callable[[int, int], Sequence[int]]) -> None:
        """After a step: the sequence's first ``num_computed`` positions hold k/v; give its newly full blocks
        their address (``token_ids(start, stop)`` → the tokens at positions start … stop-1). A block whose
        address is already cached elsewhere stays unregistered (freed, not cached, when released)."""
        if not self.prefix_caching:
            return
        hashes = self._hashes.setdefault(seq, [])
        bs = self.block_size
        table = self._tables[seq]
        parent = hashes[-1] if hashes else self._root
        for i in range(len(hashes), num_computed // bs):
            parent = hash_block(parent, token_ids(i * bs, (i + 1) * bs))
            hashes.append(parent)
            block = table[i]
            if block != FREED and parent not in self._block_of and block not in self._hash_of:
                self._hash_of[block] = parent
                self._block_of[parent] = block

    def free(self, seq: Hashable) -> None:
        """Release all the sequence's blocks (finished, aborted or preempted). Cached blocks stay cached;
        the last blocks of the sequence are released first so its prefix is evicted last."""
        table = self._tables.get(seq)
        if table is None:
            return
        for block in reversed(table[self._first_live[seq]:]):
            self._release(block)
        self._drop(seq)

    # ---------------------------------------------------------------- internals
    def _take(self, block: int) -> None:
        if self._ref[block] == 0:
            del self._evictable[block]
        self._ref[block] += 1

    def _release(self, block: int) -> None:
        self._ref[block] -= 1
        if self._ref[block] == 0:
            if block in self._hash_of:
                self._evictable[block] = None
            else:
                self._free.append(block)

    def _pop_free(self) -> int:
        if self._free:
            return self._free.pop()
        block, _ = self._evictable.popitem(last=False)
        del self._block_of[self._hash_of.pop(block)]
        return block

    def _drop(self, seq: Hashable) -> None:
        self._tables.pop(seq, None)
        self._first_live.pop(seq, None)
        self._hashes.pop(seq, None)


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
