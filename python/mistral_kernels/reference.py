"""Plain-PyTorch references for every op: obviously correct, slow. Same signatures as ``ops``.

Shape letters: T tokens, B sequences, Hq / Hkv heads, D head_dim, R rot_dim, H hidden,
I intermediate, E experts, k top-k. Math in fp32, results cast to the input dtype.
"""

from __future__ import annotations

import torch

from ._ops_rope import rope_cos_sin_cache

__all__ = ["fused_add_rms_norm", "rms_norm", "rope_cos_sin_cache", "rotary_embedding", "silu_and_mul"]


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


# ---- top-k MoE (issue 5) -----------------------------------------------------------------------------
# T tokens, H hidden, I intermediate, E experts, k top-k. Index layout: see _ops_moe.py.

__all__ += ["fused_moe", "moe_permute", "moe_unpermute", "topk_softmax"]


def topk_softmax(gating_logits: torch.Tensor, k: int, renormalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """gating_logits [T, E] → (weights fp32 [T, k], ids int32 [T, k]); softmax in fp32, ties → lower id."""
    probs = torch.softmax(gating_logits.float(), dim=-1)
    # A stable descending sort keeps equal probabilities in increasing expert order.
    order = torch.sort(probs, dim=-1, descending=True, stable=True).indices[:, :k]
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
    w1: torch.Tensor,
    w2: torch.Tensor,
    w3: torch.Tensor,
    top_k: int = 2,
    renormalize: bool = True,
) -> torch.Tensor:
    """Mixtral sparse MoE block on x [..., H]: per token Σ_j w_j · w2[e_j] (silu(w1[e_j] x) * w3[e_j] x).

    Rounded to x's dtype at the same points as the kernels: router logits, gate, up, activation, expert output.
    """
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
