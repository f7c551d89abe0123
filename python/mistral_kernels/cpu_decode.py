"""The fused CPU decode step: all dense-FFN decoder layers of a decode step in one native call.

Shape letters: T new tokens (one per sequence in a decode step), H hidden.

:class:`FusedCpuDecode` wraps :func:`mistral_kernels.ops.decode_layers` (csrc/cpu/decode_layers.cpp,
phases: csrc/cpu/decode_step.h): one OpenMP parallel region per step instead of ~10 op calls per layer from
Python, each with its own small parallel region. :class:`~mistral_kernels.model.Model` builds it when the
model qualifies (:meth:`FusedCpuDecode.build`) and sends decode-only steps of at most 16 tokens through it;
everything else (prefill, mixed steps, MoE, tensor-parallel layers, emulated kernels, weights that are
neither plain dense fp32 / bf16 tensors nor packed CPU matrices) runs the per-op layers. Packed matrices
(:class:`~mistral_kernels.quant_weight.QuantizedWeight` / ``FusedWeight``: GGUF blocks, int8 rows, row
groups of different formats) run the quantized GEMV of ``qlinear`` inside the same native call. The result
equals the per-op path (tests/test_cpu_decode.py, tests/test_cpu_decode_packed.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Protocol

import torch

from . import ops
from .batch import AttentionBatch
from .config import ModelConfig
from .ops.decode import LayerMatrices, PackedMatrix, decode_layers_prepared
from .ops.matmul import SKINNY_MAX_M

class DenseLayer(Protocol):
    """What the fused step reads of a :class:`mistral_kernels.model.DecoderLayer` (dense FFN)."""

    config: ModelConfig
    window: int | None
    attn_norm: torch.Tensor
    qkv: torch.Tensor | PackedMatrix
    wo: torch.Tensor | PackedMatrix
    ffn_norm: torch.Tensor
    w13: torch.Tensor | PackedMatrix
    w2: torch.Tensor | PackedMatrix


__all__ = ["FusedCpuDecode"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _plain(t: object, dtype: torch.dtype) -> bool:
    """A dense, contiguous CPU tensor of ``dtype`` (not a subclass such as a packed quantized weight)."""
    return (type(t) is torch.Tensor or type(t) is torch.nn.Parameter) and t.layout == torch.strided \
        and t.device.type == "cpu" and t.dtype == dtype and t.is_contiguous()


def _packed_cpu(w: object) -> bool:
    """A packed matrix [N, K] (not a tensor: its row groups) on the CPU with contiguous blocks (and scales):
    what the op's GEMV reads."""
    if isinstance(w, torch.Tensor) or not hasattr(w, "row_groups"):
        return False
    return all(len(g.shape) == 2 and g.qweight.device.type == "cpu" and g.qweight.is_contiguous()
               and (g.scales is None or g.scales.is_contiguous()) for g in w.row_groups())


class FusedCpuDecode:
    """The per-layer weight lists of a model, ready for :func:`~mistral_kernels.ops.decode_layers`."""

    def __init__(self, config: ModelConfig, layers: Sequence[DenseLayer]) -> None:
        self.config = config
        self.attn_norm = [ly.attn_norm for ly in layers]
        self.ffn_norm = [ly.ffn_norm for ly in layers]
        self.matrices = LayerMatrices.of([ly.qkv for ly in layers], [ly.wo for ly in layers],
                                         [ly.w13 for ly in layers], [ly.w2 for ly in layers])
        self.windows = [ly.window or 0 for ly in layers]
        self.scale = config.head_dim ** -0.5

    @classmethod
    def build(cls, config: ModelConfig, layers: Sequence[DenseLayer], kernels: ModuleType,
              device: torch.device, dtype: torch.dtype) -> FusedCpuDecode | None:
        """The fused path for these layers, or None when they need the per-op path: not the native CPU
        kernels, MoE, layers of another config (tensor-parallel shards; the model also passes only its own
        DecoderLayer class), a norm that is not a plain dense contiguous CPU tensor of the model's dtype (fp32 /
        bf16), or a matrix that is neither that nor packed on the CPU (:class:`~mistral_kernels.ops.decode.PackedMatrix`)."""
        if kernels is not ops or device.type != "cpu" or dtype not in _DTYPES or config.is_moe or not layers:
            return None
        if any(ly.config is not config for ly in layers):
            return None
        if not all(_plain(t, dtype) for ly in layers for t in (ly.attn_norm, ly.ffn_norm)):
            return None
        if not all(_plain(w, dtype) or _packed_cpu(w) for ly in layers for w in (ly.qkv, ly.wo, ly.w13, ly.w2)):
            return None
        return cls(config, layers)

    def accepts(self, x: torch.Tensor, batch: AttentionBatch) -> bool:
        """Whether this step can run fused: decode-only, at most 16 rows, CPU index tensors."""
        return batch.decode_only and x.shape[0] <= SKINNY_MAX_M and batch.positions.device.type == "cpu"

    def __call__(self, x: torch.Tensor, residual: torch.Tensor, batch: AttentionBatch, cos_sin: torch.Tensor,
                 k_cache: Sequence[torch.Tensor], v_cache: Sequence[torch.Tensor]) -> None:
        """All layers on x [T, H] (embeddings in, last FFN output out) and residual [T, H], in place."""
        c = self.config
        decode_layers_prepared(x, residual, self.attn_norm, self.matrices, self.ffn_norm, k_cache, v_cache,
                               self.windows, batch.positions, batch.slot_mapping, batch.block_tables, batch.seq_lens,
                               cos_sin, c.n_heads, c.norm_eps, self.scale, c.rope_is_neox)
