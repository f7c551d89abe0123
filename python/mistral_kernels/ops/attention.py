"""Paged KV cache and attention. Kernels: csrc/kernels/{kv_cache,paged_decode,paged_prefill}.cuh,
csrc/cpu/{kv_cache,paged_attention}.cpp; checks: csrc/checks/attention.h.

Shape letters: T tokens, Tq packed query tokens, B sequences, Hq / Hkv heads (Hq % Hkv == 0),
D head_dim, N num_blocks, S block_size, M max_blocks per sequence, W sliding window.

The cache
---------
K and V each live in a tensor ``[N, S, Hkv, D]``: N physical blocks of S token slots. Slot
``s = block * S + offset`` is row ``cache.view(N * S, Hkv, D)[s]``. A sequence owns a list of physical
blocks, its *block table* row: logical block ``j // S`` of the sequence holds its tokens
``j`` with ``j % S`` as offset.

Worked example (S = 4, N = 8): sequence 0 has 6 tokens in physical blocks 5 then 2; sequence 1 has 3
tokens in block 7::

    block_tables = [[5, 2],      # token j of seq 0 → slot block_tables[0][j // 4] * 4 + j % 4
                    [7, 0]]      # entries past a sequence's length are never read (any value)
    seq_lens     = [6, 3]
    # seq 0: tokens 0..3 → slots 20..23, tokens 4, 5 → slots 8, 9;  seq 1: tokens 0..2 → slots 28..30

Writing the K/V of new tokens: ``slot_mapping`` gives each token's slot, -1 skips a padding token.
Appending token 6 of seq 0 (slot 2*4 + 2 = 10) and token 3 of seq 1 (slot 7*4 + 3 = 31) plus one pad::

    slot_mapping = [10, 31, -1]

Positions and masks
-------------------
The query at position p sees keys j with ``p - W < j <= p`` (``sliding_window=W``; all ``j <= p`` when
None) — the semantics of transformers' Mistral. Decode queries sit at ``seq_lens[b] - 1``; in prefill
the ``q_b`` new tokens of sequence b are its *last* q_b positions, ``seq_lens[b] - q_b … seq_lens[b] - 1``,
so one call covers a first prefill (q_b = seq_lens[b]), chunked prefill and a cached prefix. A query
that sees no key (seq_lens[b] = 0) returns zeros. Softmax is in fp32 (online max / sum).
"""

from __future__ import annotations

import torch

from ._base import OpFamily, check_index_range, device_checks_apply, require_tensor


def _window_arg(op: str, sliding_window: int | None) -> int:
    if sliding_window is None:
        return 0
    w = int(sliding_window)
    if w <= 0:
        raise ValueError(f"{op}: sliding_window must be a positive number of tokens or None, got {sliding_window}")
    return w


def _check_paged_indices_device(
    op: str,
    k_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    first_query_pos: torch.Tensor,
    window: int,
) -> None:
    """CUDA index tensors: seq_lens within capacity, block ids actually read in [0, N). Costs a sync.

    (CPU index tensors are checked in C++: csrc/checks/attention.h.)
    """
    if not (block_tables.dim() == 2 and seq_lens.dim() == 1 and k_cache.dim() == 4
            and block_tables.shape[0] == seq_lens.shape[0]):
        return  # the C++ op reports the shape error
    n_blocks, bs, max_blocks = k_cache.shape[0], k_cache.shape[1], block_tables.shape[1]
    cap = max_blocks * bs
    sl = seq_lens.long()
    bad = (sl < 0) | (sl > cap)
    if bool(bad.any()):
        b = int(bad.nonzero()[0, 0])
        raise ValueError(f"{op}: seq_lens[{b}]={int(sl[b])} exceeds block_tables capacity {cap} "
                         "(max_blocks*block_size) or is negative")
    first_key = (first_query_pos.long() - window + 1).clamp(min=0) if window > 0 else torch.zeros_like(sl)
    j = torch.arange(max_blocks, device=block_tables.device)[None, :]
    used = (j * bs < sl[:, None]) & ((j + 1) * bs > first_key[:, None])
    bad = used & ((block_tables < 0) | (block_tables >= n_blocks))
    if bool(bad.any()):
        b, jj = (int(x) for x in bad.nonzero()[0])
        raise ValueError(f"{op}: block_tables[{b}, {jj}]={int(block_tables[b, jj])} is out of range "
                         f"[0, {n_blocks}) (num_blocks = k_cache.shape[0])")


def _check_cu_seqlens_device(op: str, cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor, tq: int) -> None:
    if cu_seqlens_q.dim() != 1 or seq_lens.dim() != 1 or cu_seqlens_q.shape[0] != seq_lens.shape[0] + 1:
        return  # the C++ op reports the shape error
    cu = cu_seqlens_q.long()
    if int(cu[0]) != 0 or int(cu[-1]) != tq:
        raise ValueError(f"{op}: cu_seqlens_q must start at 0 and end at q.shape[0]={tq}, "
                         f"got {int(cu[0])} … {int(cu[-1])}")
    qlen = cu[1:] - cu[:-1]
    bad = (qlen < 0) | (qlen > seq_lens.long())
    if bool(bad.any()):
        b = int(bad.nonzero()[0, 0])
        raise ValueError(f"{op}: sequence {b} has {int(qlen[b])} query tokens (cu_seqlens_q) but "
                         f"seq_lens[{b}]={int(seq_lens[b])}; need 0 <= q_b <= seq_lens[b]")


class AttentionOps(OpFamily):
    """Kernel wrappers of the attention family, bound to one ``torch.ops`` namespace (see ``ops/__init__.py``)."""

    def reshape_and_cache(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """Write the K/V rows of T tokens into the paged caches (in place, bit-exact copy).

        Parameters
        ----------
        k, v : [T, Hkv, D] — heads and dim dense, token stride free (views of a fused QKV buffer work)
        k_cache, v_cache : [N, S, Hkv, D] contiguous, same dtype as k
        slot_mapping : int64 [T]; token t goes to slot ``slot_mapping[t] = block * S + offset``, i.e.
            ``k_cache[block, offset] = k[t]``; -1 skips the token

        Example
        -------
        S = 4, a sequence whose block table is [5, 2] appends its tokens 3 and 4: slots
        5*4 + 3 = 23 and 2*4 + 0 = 8, so ``slot_mapping = [23, 8]``.
        """
        op = "reshape_and_cache"
        for name, t in (("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache),
                        ("slot_mapping", slot_mapping)):
            require_tensor(op, name, t)
        if k_cache.dim() == 4:
            check_index_range(op, "slot_mapping", slot_mapping, -1, k_cache.shape[0] * k_cache.shape[1],
                              "num_blocks*block_size; -1 skips the token")
        self._lib.reshape_and_cache(k, v, k_cache, v_cache, slot_mapping)

    def paged_decode_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
        sliding_window: int | None = None,
        out: torch.Tensor | None = None,
        *,
        partition_size: int = 0,
    ) -> torch.Tensor:
        """Attention of one new query per sequence over its paged K/V (GQA, optional sliding window).

        Parameters
        ----------
        q : [B, Hq, D] — heads and dim dense (token stride free); q head h uses kv head h // (Hq / Hkv)
        k_cache, v_cache : [N, S, Hkv, D]
        block_tables : int32 [B, M]; row b lists sequence b's physical blocks (see the module docstring)
        seq_lens : int32 [B] — tokens in the cache *including* the current one; the query sits at
            position seq_lens[b] - 1 and sees keys max(0, seq_lens[b] - W) … seq_lens[b] - 1
        scale : softmax scale (usually D ** -0.5)
        sliding_window : W, or None for full attention
        out : optional [B, Hq, D] contiguous output
        partition_size : keys per split-K partition (0 = automatic: enough partitions of the block
            table's capacity for ≥ 2 blocks per SM, csrc/kernels/attention_plan.h). Long contexts are split
            into partitions whose partial softmax states are merged in a second pass, in a fixed order:
            the result is bit-identical run to run and equal across partition sizes within rounding. A
            value beyond the visible range means one partition; more than 65535 partitions are not made.

        Returns
        -------
        [B, Hq, D] in q's dtype.

        Example
        -------
        block_tables = [[5, 2]], seq_lens = [6], S = 4, W = 3: the query (position 5) attends to keys
        3, 4, 5, stored in slots 5*4 + 3 = 23, 2*4 + 0 = 8 and 2*4 + 1 = 9.
        """
        op = "paged_decode_attention"
        for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("block_tables", block_tables),
                        ("seq_lens", seq_lens)):
            require_tensor(op, name, t)
        window = _window_arg(op, sliding_window)
        if device_checks_apply(seq_lens.device):
            _check_paged_indices_device(op, k_cache, block_tables, seq_lens, seq_lens.long() - 1, window)
        if out is None:
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        self._lib.paged_decode_attention(out, q, k_cache, v_cache, block_tables, seq_lens, float(scale), window,
                                         int(partition_size))
        return out

    def paged_prefill_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_tables: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
        sliding_window: int | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Causal attention of packed variable-length query chunks over their paged K/V.

        The K/V of the new tokens must already be in the cache (``reshape_and_cache`` first).

        Parameters
        ----------
        q : [Tq, Hq, D] — the new tokens of all sequences, packed; heads and dim dense
        k_cache, v_cache : [N, S, Hkv, D]
        block_tables : int32 [B, M]
        cu_seqlens_q : int32 [B+1]; sequence b's new tokens are ``q[cu_seqlens_q[b]:cu_seqlens_q[b+1]]``
        seq_lens : int32 [B] — total tokens of sequence b in the cache (cached prefix + new); the
            q_b = cu_seqlens_q[b+1] - cu_seqlens_q[b] new tokens are its last q_b positions
        scale : softmax scale
        sliding_window : W, or None
        out : optional [Tq, Hq, D] contiguous output

        Returns
        -------
        [Tq, Hq, D] in q's dtype.

        Example
        -------
        Two sequences: a first prefill of 5 tokens and a chunk of 3 tokens after a cached prefix of 4::

            cu_seqlens_q = [0, 5, 8]
            seq_lens     = [5, 7]     # q rows 5..7 are positions 4, 5, 6 of sequence 1
        """
        op = "paged_prefill_attention"
        for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("block_tables", block_tables),
                        ("cu_seqlens_q", cu_seqlens_q), ("seq_lens", seq_lens)):
            require_tensor(op, name, t)
        window = _window_arg(op, sliding_window)
        if device_checks_apply(seq_lens.device):
            _check_cu_seqlens_device(op, cu_seqlens_q, seq_lens, q.shape[0])
            if cu_seqlens_q.dim() == 1 and cu_seqlens_q.shape[0] == seq_lens.shape[0] + 1:
                qlen = cu_seqlens_q[1:].long() - cu_seqlens_q[:-1].long()
                _check_paged_indices_device(op, k_cache, block_tables, seq_lens, seq_lens.long() - qlen, window)
        if out is None:
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        self._lib.paged_prefill_attention(out, q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens,
                                          float(scale), window)
        return out
