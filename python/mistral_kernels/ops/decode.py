"""``decode_layers``: the dense decoder layers of one decode step in one native call (CPU only).

Kernel: csrc/cpu/decode_layers.cpp (phases and rounding: csrc/cpu/decode_step.h). The model calls it
through :mod:`mistral_kernels.cpu_decode`; ``reference.decode_layers`` is the same computation op by op.

Shape letters: M decode rows (one new token per sequence, M ≤ 16), H hidden, I intermediate, Hq / Hkv
heads, D head_dim, R rot_dim, P cos/sin rows, N cache blocks, S block size, MB max blocks per sequence,
L layers.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["decode_layers"]

_decode_layers = torch.ops.mistral_kernels.decode_layers.default


def decode_layers(x: torch.Tensor, residual: torch.Tensor, attn_norm: Sequence[torch.Tensor],
                  qkv: Sequence[torch.Tensor], wo: Sequence[torch.Tensor], ffn_norm: Sequence[torch.Tensor],
                  w13: Sequence[torch.Tensor], w2: Sequence[torch.Tensor], k_cache: Sequence[torch.Tensor],
                  v_cache: Sequence[torch.Tensor], windows: Sequence[int], positions: torch.Tensor,
                  slot_mapping: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                  cos_sin: torch.Tensor, n_heads: int, eps: float, scale: float, is_neox: bool) -> None:
    """Runs L dense decoder layers on one decode step, in place.

    Parameters
    ----------
    x : [M, H] in: the embeddings (or the previous layer's output); out: the last layer's FFN output
    residual : [M, H] the residual stream (zeros before the first layer), updated in place
    attn_norm, ffn_norm : L × [H]
    qkv : L × [(Hq + 2·Hkv)·D, H];  wo : L × [H, Hq·D];  w13 : L × [2I, H] (gate rows, then up rows);
        w2 : L × [H, I] — all of x's dtype (fp32 / bf16), contiguous
    k_cache, v_cache : L × [N, S, Hkv, D]; row m's k / v go to slot ``slot_mapping[m]`` (-1: not written)
    windows : L sliding windows (0: none)
    positions, slot_mapping : int64 [M];  block_tables : int32 [M, MB];  seq_lens : int32 [M] (keys after
        the write; position = seq_lens - 1; 0 = a padding row, whose attention output is 0)
    cos_sin : fp32 [P, R] (:func:`mistral_kernels.ops.rope_cos_sin_cache`)
    n_heads : Hq;  eps : RMSNorm epsilon;  scale : softmax scale;  is_neox : RoPE pairing (halves vs pairs)

    The state afterwards equals the per-op decoder's before its final norm (csrc/cpu/decode_step.h).
    """
    _decode_layers(x, residual, list(attn_norm), list(qkv), list(wo), list(ffn_norm), list(w13), list(w2),
                   list(k_cache), list(v_cache), [int(w) for w in windows], positions, slot_mapping, block_tables,
                   seq_lens, cos_sin, int(n_heads), float(eps), float(scale), bool(is_neox))
