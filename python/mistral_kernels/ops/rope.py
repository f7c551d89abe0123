"""Rotary position embedding. Kernel: csrc/kernels/rope.cuh, csrc/cpu/rope.cpp.

Shape letters: T tokens, Hq / Hkv heads, D head_dim, R rot_dim (≤ D), P max positions.
"""

from __future__ import annotations

import torch

from ._base import OpFamily, check_index_range, require_tensor


MAX_POSITIONS = 1 << 24  # rows of a cos/sin table (16M; checkpoint configs are bounded by the same figure)
MAX_ROT_DIM = 1024       # rotated dims per head
_CHUNK_ROWS = 1 << 16    # fp64 angles are computed this many rows at a time: temporaries stay ~64 MB


def rope_cos_sin_cache(
    max_pos: int, rot_dim: int, theta: float, device: torch.device | str | None = None
) -> torch.Tensor:
    """Cos/sin table for RoPE: fp32 [max_pos, rot_dim], cos in ``[:, :R/2]``, sin in ``[:, R/2:]``.

    Row p, column i < R/2 holds cos(p·θ_i) with θ_i = theta^(-2i/R) (computed in fp64, stored fp32).
    ``max_pos`` ≤ :data:`MAX_POSITIONS`, ``rot_dim`` ≤ :data:`MAX_ROT_DIM`; memory is the table itself
    (``max_pos·rot_dim·4`` bytes) plus a bounded fp64 scratch.
    """
    if not 0 <= max_pos <= MAX_POSITIONS:
        raise ValueError(f"rope_cos_sin_cache: max_pos must be in [0, {MAX_POSITIONS}] (2^24 positions), got "
                         f"{max_pos}")
    if not 0 <= rot_dim <= MAX_ROT_DIM or rot_dim % 2:
        raise ValueError(f"rope_cos_sin_cache: rot_dim must be even and in [0, {MAX_ROT_DIM}], got {rot_dim}")
    if not theta > 0:
        raise ValueError(f"rope_cos_sin_cache: theta must be > 0, got {theta}")
    inv_freq = 1.0 / (theta ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim))
    out = torch.empty(max_pos, rot_dim, dtype=torch.float32)
    half = rot_dim // 2
    for a in range(0, max_pos, _CHUNK_ROWS):
        angles = torch.arange(a, min(a + _CHUNK_ROWS, max_pos), dtype=torch.float64)[:, None] * inv_freq[None, :]
        out[a:a + angles.shape[0], :half] = angles.cos()
        out[a:a + angles.shape[0], half:] = angles.sin()
    return out.to(device)


class RopeOps(OpFamily):
    """Kernel wrappers of the rope family, bound to one ``torch.ops`` namespace (see ``ops/__init__.py``)."""

    def rotary_embedding(
        self,
        positions: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        cos_sin_cache: torch.Tensor,
        is_neox: bool,
    ) -> None:
        """Rotate q and k in place by their token positions.

        Parameters
        ----------
        positions : int64 [T], each in [0, P)
        q : [T, Hq, D] — heads and dim dense; the token stride is free (views of a fused QKV buffer work)
        k : [T, Hkv, D] — same dtype as q
        cos_sin_cache : fp32 [P, R] from :func:`rope_cos_sin_cache`; R ≤ D rotates only the first R dims
        is_neox : True pairs (x[i], x[i + R/2]) (HF layout); False pairs (x[2i], x[2i+1])
            (Mistral consolidated / GGUF layout)

        Example
        -------
        D = R = 4, neox: pairs (0, 2), (1, 3); interleaved: pairs (0, 1), (2, 3).
        """
        require_tensor("rotary_embedding", "positions", positions)
        require_tensor("rotary_embedding", "cos_sin_cache", cos_sin_cache)
        if cos_sin_cache.dim() == 2:  # other ranks: the op's own check names the argument
            check_index_range("rotary_embedding", "positions", positions, 0, cos_sin_cache.shape[0],
                              "rows of cos_sin_cache")
        self._lib.rotary_embedding(positions, q, k, cos_sin_cache, bool(is_neox))
