"""Plain-PyTorch references for every op: obviously correct, slow. Same signatures as ``ops``.

Public import path: ``mistral_kernels.reference``. One function per schema of csrc/registration.cpp
(``linear`` stands for the CPU-only ``skinny_linear`` kernel it serves), plus ``rope_cos_sin_cache``.

Shape letters: T tokens, B sequences, Hq / Hkv heads, D head_dim, R rot_dim, H hidden,
I intermediate, E experts, k top-k. Math in fp32, results cast to the input dtype.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from ..quant_formats import dequantize
from .rope import rope_cos_sin_cache

__all__ = [
    # norm / activation / rope
    "fused_add_rms_norm",
    "rms_norm",
    "rope_cos_sin_cache",
    "rotary_embedding",
    "rotary_embedding_and_cache",
    "silu_and_mul",
    # top-k MoE
    "fused_moe",
    "moe_expert_ffn",
    "moe_permute",
    "moe_unpermute",
    "topk_softmax",
    # paged KV cache + attention
    "paged_decode_attention",
    "paged_prefill_attention",
    "reshape_and_cache",
    # projections (the CPU-only skinny_linear kernel serves ops.linear)
    "linear",
    # quantized weights (plus the helper dequantize, not an op)
    "qlinear",
    "moe_qgemm",


    # the CPU-only fused decode step
    "decode_layers",
]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., H], weight [H] → [..., H]."""
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)
    if out is not None:
        out.copy_(y)
        return out
    return y


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> None:
    """In place: residual += x (rounded once to the dtype); x = rms_norm(residual)."""
    residual.copy_((x.float() + residual.float()).to(residual.dtype))
    x.copy_(rms_norm(residual, weight, eps))


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., 2I] → silu(x[..., :I]) * x[..., I:]  [..., I]."""
    i = x.shape[-1] // 2
    y = (torch.nn.functional.silu(x[..., :i].float()) * x[..., i:].float()).to(x.dtype)
    if out is not None:
        out.copy_(y)
        return out
    return y


def rotary_embedding(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor, is_neox: bool
) -> None:
    """In place on q [T, Hq, D], k [T, Hkv, D]; positions [T]; cos_sin_cache [P, R].

    neox: rotate_half formulation on the first R dims; interleaved: complex multiplication of
    consecutive pairs (x[2i] + i·x[2i+1]) · e^{i·pos·θ_i}.
    """
    rot = cos_sin_cache.shape[1]
    cos, sin = cos_sin_cache[positions].float().chunk(2, dim=-1)  # [T, R/2] each
    for t in (q, k):
        x = t[..., :rot].float()
        if is_neox:
            x1, x2 = x[..., : rot // 2], x[..., rot // 2 :]
            c, s = cos[:, None, :], sin[:, None, :]
            y = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)
        else:
            xc = torch.view_as_complex(x.reshape(*x.shape[:-1], rot // 2, 2).contiguous())
            rotation = torch.polar(torch.ones_like(cos), torch.atan2(sin, cos))[:, None, :]
            y = torch.view_as_real(xc * rotation).flatten(-2)
        t[..., :rot] = y.to(t.dtype)


def rotary_embedding_and_cache(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """rotary_embedding(positions, q, k, ...) then reshape_and_cache(k, v, k_cache, v_cache, slot_mapping)."""
    rotary_embedding(positions, q, k, cos_sin_cache, is_neox)
    reshape_and_cache(k, v, k_cache, v_cache, slot_mapping)


# ---- top-k MoE ---------------------------------------------------------------------------------------
# T tokens, H hidden, I intermediate, E experts, k top-k. Index layout: see ops/moe.py.


def topk_softmax(gating_logits: torch.Tensor, k: int, renormalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """gating_logits [T, E] → (weights fp32 [T, k], ids int32 [T, k]); softmax in fp32, ties → lower id.

    A NaN probability (NaN / Inf logits) ranks below every number (router_rank, csrc/kernels/common.cuh),
    so the k ids are always distinct; a row with any NaN / +Inf logit is all NaN → ids 0 … k-1, NaN weights.
    """
    probs = torch.softmax(gating_logits.float(), dim=-1)
    # A stable descending sort keeps equal probabilities in increasing expert order.
    rank = torch.where(probs.isnan(), -0.5, probs)
    order = torch.sort(rank, dim=-1, descending=True, stable=True).indices[:, :k]
    weights = probs.gather(1, order)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, order.to(torch.int32)


def moe_permute(
    x: torch.Tensor, topk_ids: torch.Tensor, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [T, H], topk_ids [T, k] → (permuted_x [T*k, H], expert_offsets int64 [E+1], inv_perm int32 [T, k])."""
    t, k = topk_ids.shape
    flat = topk_ids.reshape(-1).long()
    order = torch.sort(flat, stable=True).indices  # row r of permuted_x holds flat entry order[r]
    offsets = torch.zeros(num_experts + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.bincount(flat.cpu(), minlength=num_experts), 0)
    inv = torch.empty_like(order)
    inv[order] = torch.arange(t * k, device=order.device)
    return x[order // k], offsets.to(x.device), inv.view(t, k).to(torch.int32)


def moe_unpermute(
    expert_out: torch.Tensor, topk_weights: torch.Tensor, inv_perm: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """out[t] = Σ_j w[t, j] · expert_out[inv_perm[t, j]], fp32 accumulation in j order."""
    acc = torch.zeros(topk_weights.shape[0], expert_out.shape[1], dtype=torch.float32, device=expert_out.device)
    for j in range(topk_weights.shape[1]):
        acc += topk_weights[:, j : j + 1].float() * expert_out[inv_perm[:, j].long()].float()
    y = acc.to(expert_out.dtype)
    if out is not None:
        out.copy_(y)
        return out
    return y


def fused_moe(
    x: torch.Tensor,
    gate_weight: torch.Tensor,
    w1: Any,
    w2: Any,
    w3: Any,
    top_k: int = 2,
    renormalize: bool = True,
) -> torch.Tensor:
    """Mixtral sparse MoE block on x [..., H]: per token Σ_j w_j · w2[e_j] (silu(w1[e_j] x) * w3[e_j] x).

    Rounded to x's dtype at the same points as the kernels: router logits, gate, up, activation, expert output.
    Packed expert stacks run their own block on these references (``w1.fused_moe(reference, ...)``).
    """
    if not isinstance(w1, torch.Tensor):
        return w1.fused_moe(sys.modules[__name__], x, gate_weight, w2, w3, top_k, renormalize)
    x2 = x.reshape(-1, x.shape[-1])
    weights, ids = topk_softmax(x2 @ gate_weight.T, top_k, renormalize)
    out = torch.zeros(x2.shape, dtype=torch.float32, device=x.device)
    for t in range(x2.shape[0]):
        for j in range(top_k):
            e = int(ids[t, j])
            xt = x2[t : t + 1]
            act = silu_and_mul(torch.cat([xt @ w1[e].T, xt @ w3[e].T], dim=-1))
            out[t] += weights[t, j] * (act @ w2[e].T).float()[0]
    return out.to(x.dtype).view(x.shape)


def moe_expert_ffn(
    permuted_x: torch.Tensor,
    expert_offsets: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    w3: torch.Tensor,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """permuted_x [M, H] → [M, H]: expert e < G = w1.shape[0] on rows [offsets[e], offsets[e+1]); others 0."""
    y = torch.zeros_like(permuted_x)
    for e in range(w1.shape[0]):
        r0, r1 = int(expert_offsets[e]), int(expert_offsets[e + 1])
        if r1 > r0:
            a = permuted_x[r0:r1]
            y[r0:r1] = silu_and_mul(torch.cat([a @ w1[e].T, a @ w3[e].T], dim=-1)) @ w2[e].T
    if out is not None:
        out.copy_(y)
        return out
    return y


# ---- paged KV cache + attention ----------------------------------------------------------------------
# T tokens, Tq packed queries, B sequences, Hq / Hkv heads, D head_dim, N num_blocks, S block_size,
# M max_blocks, W sliding window. Cache layout and index conventions: see ops/attention.py.
# Gather each sequence's keys into a dense [L, Hkv, D] tensor, then masked softmax in fp32.


def reshape_and_cache(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """k, v [T, Hkv, D] → k_cache, v_cache [N, S, Hkv, D] at slot_mapping[t] (int64; -1 skips)."""
    n, s, hkv, d = k_cache.shape
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache.view(n * s, hkv, d)[slots] = k[keep]
    v_cache.view(n * s, hkv, d)[slots] = v[keep]


def _gather(cache: torch.Tensor, table_row: torch.Tensor, length: int) -> torch.Tensor:
    """The first `length` tokens of one sequence: [length, Hkv, D]."""
    s = cache.shape[1]
    j = torch.arange(length, device=cache.device)
    return cache[table_row.long()[j // s], j % s]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor, scale: float,
            window: int | None) -> torch.Tensor:
    """q [n, Hq, D] at positions pos [n] over k, v [L, Hkv, D] (positions 0..L-1) → fp32 [n, Hq, D].

    NaN semantics (the kernels follow them, csrc/kernels/common.cuh): a NaN / Inf in q or in the K row of a
    visible key makes the row NaN (softmax of a NaN score); a NaN / Inf in the V row of a visible key
    reaches the output columns it is in (p·v); keys a query cannot see never matter, whatever they hold;
    a row that sees no key is 0.
    """
    g = q.shape[1] // k.shape[1]
    kf = k.float().repeat_interleave(g, dim=1)
    vf = v.float().repeat_interleave(g, dim=1)
    scores = torch.einsum("nhd,jhd->hnj", q.float(), kf) * scale
    j = torch.arange(k.shape[0], device=q.device)
    visible = j[None, :] <= pos[:, None]
    if window is not None:
        visible &= j[None, :] > pos[:, None] - window
    scores = scores.masked_fill(~visible[None], float("-inf"))  # a select: NaN scores of hidden keys vanish
    probs = torch.softmax(scores, dim=-1)
    probs = torch.where(visible.any(-1)[None, :, None], probs, 0.0)  # rows that see no key → 0 (NaN kept)
    # P·V without 0·NaN: non-finite V entries are added only to the rows that see their key.
    finite = vf.isfinite()
    out = torch.einsum("hnj,jhd->nhd", probs, torch.where(finite, vf, 0.0))
    jj, hh, dd = (~finite).nonzero(as_tuple=True)
    if jj.numel():
        contrib = probs[hh, :, jj] * vf[jj, hh, dd][:, None]  # [nbad, n]
        contrib = torch.where(visible[:, jj].T, contrib, 0.0)
        rows = torch.arange(q.shape[0], device=q.device)
        out.index_put_((rows[None, :], hh[:, None], dd[:, None]), contrib, accumulate=True)
    return out


def paged_prefill_attention(
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
    """q [Tq, Hq, D] packed by cu_seqlens_q [B+1]; the q_b new tokens are the last q_b of seq_lens[b]."""
    result = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    cu, lens = cu_seqlens_q.tolist(), seq_lens.tolist()
    for b, length in enumerate(lens):
        q0, q1 = cu[b], cu[b + 1]
        if q1 == q0:
            continue
        k = _gather(k_cache, block_tables[b], length)
        v = _gather(v_cache, block_tables[b], length)
        pos = torch.arange(length - (q1 - q0), length, device=q.device)
        result[q0:q1] = _attend(q[q0:q1], k, v, pos, scale, sliding_window)
    if out is not None:
        out.copy_(result)
        return out
    return result.to(q.dtype)


def paged_decode_attention(
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
    """q [B, Hq, D], one query per sequence at position seq_lens[b]-1. partition_size is ignored here
    (it only selects the kernels' split-K work division)."""
    del partition_size
    nonempty = seq_lens > 0  # an empty sequence has no position for its query: the output is 0
    cu = torch.cat([seq_lens.new_zeros(1), torch.cumsum(nonempty.int(), 0, dtype=torch.int32)])
    res = paged_prefill_attention(q[nonempty], k_cache, v_cache, block_tables, cu, seq_lens, scale, sliding_window)
    result = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    result[nonempty] = res
    if out is not None:
        out.copy_(result)
        return out
    return result


# ---- projections ---------------------------------------------------------------------------------------
# M rows, K in features, N out features.


def linear(x: torch.Tensor, weight: Any, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K], weight [N, K] → x @ weight.T [..., N], accumulated in fp32, rounded once to x's dtype. A packed
    weight runs its own matmul on these references (``weight.linear(x, reference)``: :func:`qlinear`)."""
    if not isinstance(weight, torch.Tensor):
        return weight.linear(x, sys.modules[__name__], out)
    y = (x.float() @ weight.float().T).to(x.dtype)
    if out is not None:
        out.copy_(y)
        return out
    return y


def qlinear(
    x: torch.Tensor, qweight: torch.Tensor, qtype: int, scales: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [..., K], W [N, K] quantized (see ``dequantize``) → [..., N] in x's dtype (fp32 math)."""
    w = dequantize(qweight, qtype, scales).to(x.device)
    y = (x.float() @ w.T).to(x.dtype)
    if out is not None:
        out.copy_(y)
        return out
    return y


def moe_qgemm(
    x: torch.Tensor, expert_offsets: torch.Tensor, qweight: torch.Tensor, qtype: int,
    scales: torch.Tensor | None = None, up_qweight: torch.Tensor | None = None,
    up_scales: torch.Tensor | None = None, out: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [M, K] grouped by expert → [M, N]: per segment g (rows [offsets[g], offsets[g+1])) ``qlinear`` with
    W[g] [N, K] (plain), or ``silu_and_mul`` of the gate (W) and up (W3 = up_qweight) projections, each rounded
    to x's dtype; rows outside every segment are 0."""
    y = torch.zeros((x.shape[0], qweight.shape[1]), dtype=x.dtype, device=x.device)
    for e in range(qweight.shape[0]):
        r0, r1 = int(expert_offsets[e]), int(expert_offsets[e + 1])
        if r1 == r0:
            continue
        a = x[r0:r1]
        h = qlinear(a, qweight[e], qtype, None if scales is None else scales[e])
        if up_qweight is not None:
            up = qlinear(a, up_qweight[e], qtype, None if up_scales is None else up_scales[e])
            h = silu_and_mul(torch.cat([h, up], dim=-1))
        y[r0:r1] = h
    if out is not None:
        out.copy_(y)
        return out
    return y


# ---- the fused decode step ---------------------------------------------------------------------------
# M decode rows, L layers; arguments as ops.decode_layers.


def decode_layers(x: torch.Tensor, residual: torch.Tensor, attn_norm: list[torch.Tensor], qkv: list[object],
                  wo: list[object], ffn_norm: list[torch.Tensor], w13: list[object],
                  w2: list[object], k_cache: list[torch.Tensor], v_cache: list[torch.Tensor],
                  windows: list[int], positions: torch.Tensor, slot_mapping: torch.Tensor,
                  block_tables: torch.Tensor, seq_lens: torch.Tensor, cos_sin: torch.Tensor, n_heads: int,
                  eps: float, scale: float, is_neox: bool) -> None:
    """The L decoder layers (dense FFN) of one decode step, op by op with the references above (in place on x,
    residual and the caches). qkv, wo, w13, w2: per layer a dense tensor or a packed matrix, multiplied by
    :func:`linear` (a packed one: :func:`qlinear`, the weight dequantized to fp32 by gguf's decoding)."""
    m = x.shape[0]
    hkv, d = k_cache[0].shape[2], k_cache[0].shape[3]

    for layer in range(len(attn_norm)):
        fused_add_rms_norm(x, residual, attn_norm[layer], eps)
        q, k, v = linear(x, qkv[layer]).split([n_heads * d, hkv * d, hkv * d], -1)
        q, k, v = q.reshape(m, n_heads, d), k.reshape(m, hkv, d), v.reshape(m, hkv, d)
        rotary_embedding(positions, q, k, cos_sin, is_neox)
        reshape_and_cache(k, v, k_cache[layer], v_cache[layer], slot_mapping)
        att = paged_decode_attention(q, k_cache[layer], v_cache[layer], block_tables, seq_lens, scale,
                                     windows[layer] if windows[layer] > 0 else None)
        x.copy_(linear(att.reshape(m, n_heads * d), wo[layer]))
        fused_add_rms_norm(x, residual, ffn_norm[layer], eps)
        x.copy_(linear(silu_and_mul(linear(x, w13[layer])), w2[layer]))
