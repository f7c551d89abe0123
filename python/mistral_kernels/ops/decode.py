"""``decode_layers``: the decoder layers of one decode step in one native call (CPU only), on dense or packed
(quantized) weights.

Kernel: csrc/cpu/decode_layers.cpp (phases and rounding: csrc/cpu/decode_step.h). The model calls it
through :mod:`mistral_kernels.cpu_decode`; ``reference.decode_layers`` is the same computation op by op.

Shape letters: M decode rows (one new token per sequence, M ≤ 16), H hidden, I intermediate, Hq / Hkv
heads, D head_dim, R rot_dim, P cos/sin rows, N cache blocks, S block size, MB max blocks per sequence,
L layers, N_g rows of a part.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, Union

import torch

__all__ = ["LayerMatrices", "PackedMatrix", "decode_layers", "decode_layers_prepared"]

_decode_layers = torch.ops.mistral_kernels.decode_layers.default
DENSE = -1  # qtypes entry of a dense part


class RowGroup(Protocol):
    """Rows [N_g, K] of one packed format (:class:`~mistral_kernels.quant_weight.QuantizedWeight`)."""

    qweight: torch.Tensor
    qtype: int
    scales: torch.Tensor | None
    shape: tuple[int, ...]
    quantize_x: bool


class PackedMatrix(Protocol):
    """A packed matrix as the op reads it: its row groups of one format each, in row order."""

    def row_groups(self) -> Sequence[RowGroup]: ...


Matrix = Union[torch.Tensor, PackedMatrix]


@dataclass(frozen=True)
class LayerMatrices:
    """qkv, wo, w13, w2 of L layers in the op's form: per kind a flat list of *parts*, layer after layer (a
    dense matrix is one part; a packed one its row groups, one per format run), and per part (qkv parts, then
    wo, w13, w2) its qlinear format code (-1: dense) and INT8_ROWWISE scales. ``qtypes`` / ``scales`` are empty
    when every matrix is dense. ``quantize_x``: the packed parts' common ``quantize_x`` (fp32 x through their
    int8-activation paths). Build once with :meth:`of` (the fused decode step keeps one)."""

    qkv: list[torch.Tensor]
    wo: list[torch.Tensor]
    w13: list[torch.Tensor]
    w2: list[torch.Tensor]
    qtypes: list[int]
    scales: list[torch.Tensor | None]
    quantize_x: bool = False

    @classmethod
    def of(cls, qkv: Sequence[Matrix], wo: Sequence[Matrix], w13: Sequence[Matrix],
           w2: Sequence[Matrix]) -> LayerMatrices:
        """From per-layer matrices: dense tensors or packed matrices (:class:`PackedMatrix`:
        :class:`~mistral_kernels.quant_weight.QuantizedWeight`, ``FusedWeight``); TypeError naming the argument
        otherwise."""
        lists: list[list[torch.Tensor]] = []
        qtypes: list[int] = []
        scales: list[torch.Tensor | None] = []
        flags: set[bool] = set()
        for name, mats in (("qkv", qkv), ("wo", wo), ("w13", w13), ("w2", w2)):
            parts: list[torch.Tensor] = []
            for layer, w in enumerate(mats):
                if isinstance(w, torch.Tensor):
                    parts.append(w)
                    qtypes.append(DENSE)
                    scales.append(None)
                    continue
                if not hasattr(w, "row_groups"):
                    raise TypeError(f"decode_layers: {name}[{layer}] must be a torch.Tensor or a packed matrix "
                                    f"(QuantizedWeight / FusedWeight), got {type(w).__name__}")
                for g in w.row_groups():
                    if len(g.shape) != 2:
                        raise ValueError(f"decode_layers: {name}[{layer}] must be a matrix [N, K], got an "
                                         f"expert stack {list(g.shape)}")
                    parts.append(g.qweight)
                    qtypes.append(g.qtype)
                    scales.append(g.scales)
                    flags.add(bool(g.quantize_x))
            lists.append(parts)
        if len(flags) > 1:
            raise ValueError("decode_layers: the packed matrices mix quantize_x True and False; one step "
                             "multiplies fp32 x one way (mistral_kernels.quant_weight.with_quantized_activations)")
        if all(q == DENSE for q in qtypes):
            qtypes, scales = [], []
        return cls(*lists, qtypes=qtypes, scales=scales, quantize_x=flags == {True})


def decode_layers(x: torch.Tensor, residual: torch.Tensor, attn_norm: Sequence[torch.Tensor],
                  qkv: Sequence[Matrix], wo: Sequence[Matrix], ffn_norm: Sequence[torch.Tensor],
                  w13: Sequence[Matrix], w2: Sequence[Matrix], k_cache: Sequence[torch.Tensor],
                  v_cache: Sequence[torch.Tensor], windows: Sequence[int], positions: torch.Tensor,
                  slot_mapping: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor,
                  cos_sin: torch.Tensor, n_heads: int, eps: float, scale: float, is_neox: bool) -> None:
    """Runs L decoder layers (dense FFN) on one decode step, in place.

    Parameters
    ----------
    x : [M, H] fp32 / bf16 / fp16; in: the embeddings (or the previous layer's output); out: the last layer's
        FFN output
    residual : [M, H] the residual stream (zeros before the first layer), updated in place
    attn_norm, ffn_norm : L × [H]
    qkv : L × [(Hq + 2·Hkv)·D, H];  wo : L × [H, Hq·D];  w13 : L × [2I, H] (gate rows, then up rows);
        w2 : L × [H, I] — each a dense contiguous tensor of x's dtype, or packed on the CPU
        (:class:`~mistral_kernels.quant_weight.QuantizedWeight` / ``FusedWeight``: the GEMV of ``qlinear``)
    k_cache, v_cache : L × [N, S, Hkv, D]; row m's k / v go to slot ``slot_mapping[m]`` (-1: not written)
    windows : L sliding windows (0: none)
    positions, slot_mapping : int64 [M];  block_tables : int32 [M, MB];  seq_lens : int32 [M] (keys after
        the write; position = seq_lens - 1; 0 = a padding row, whose attention output is 0)
    cos_sin : fp32 [P, R] (:func:`mistral_kernels.ops.rope_cos_sin_cache`)
    n_heads : Hq;  eps : RMSNorm epsilon;  scale : softmax scale;  is_neox : RoPE pairing (halves vs pairs)

    The state afterwards equals the per-op decoder's before its final norm (``ops.linear`` / ``qlinear``
    per matrix; csrc/cpu/decode_step.h states the two fp32-rounding-level exceptions).
    """
    decode_layers_prepared(x, residual, attn_norm, LayerMatrices.of(qkv, wo, w13, w2), ffn_norm, k_cache, v_cache,
                           windows, positions, slot_mapping, block_tables, seq_lens, cos_sin, n_heads, eps, scale,
                           is_neox)


def decode_layers_prepared(x: torch.Tensor, residual: torch.Tensor, attn_norm: Sequence[torch.Tensor],
                           matrices: LayerMatrices, ffn_norm: Sequence[torch.Tensor],
                           k_cache: Sequence[torch.Tensor], v_cache: Sequence[torch.Tensor],
                           windows: Sequence[int], positions: torch.Tensor, slot_mapping: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, cos_sin: torch.Tensor,
                           n_heads: int, eps: float, scale: float, is_neox: bool) -> None:
    """:func:`decode_layers` with the matrices already in the op's form (:meth:`LayerMatrices.of`): no
    per-call conversion (the decode hot path)."""
    m = matrices
    _decode_layers(x, residual, list(attn_norm), m.qkv, m.wo, list(ffn_norm), m.w13, m.w2, list(k_cache),
                   list(v_cache), [int(w) for w in windows], positions, slot_mapping, block_tables, seq_lens,
                   cos_sin, int(n_heads), float(eps), float(scale), bool(is_neox), m.qtypes, m.scales,
                   m.quantize_x)
