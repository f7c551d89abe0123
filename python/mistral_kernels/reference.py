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
