"""The fused CPU decode step: all dense decoder layers of a decode step in one native call.

Shape letters: T new tokens (one per sequence in a decode step), H hidden.

:class:`FusedCpuDecode` wraps :func:`mistral_kernels.ops.decode_layers` (csrc/cpu/decode_layers.cpp,
phases: csrc/cpu/decode_step.h): one OpenMP parallel region per step instead of ~10 op calls per layer from
Python, each with its own small parallel region. :class:`~mistral_kernels.model.Model` builds it when the
model qualifies (:meth:`FusedCpuDecode.build`) and sends decode-only steps of at most 16 tokens through it;
everything else (prefill, mixed steps, MoE, tensor-parallel layers, emulated kernels, weights that are not
plain dense fp32 / bf16 tensors — e.g. quantized blocks) runs the per-op layers. The result equals the
per-op path (tests/test_cpu_decode.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Protocol

import torch

from . import ops
from .batch import AttentionBatch
from .config import ModelConfig
from .ops.matmul import SKINNY_MAX_M

class DenseLayer(Protocol):
    """What the fused step reads of a :class:`mistral_kernels.model.DecoderLayer` (dense FFN)."""

    config: ModelConfig
    window: int | None
    attn_norm: torch.Tensor
    qkv: torch.Tensor
    wo: torch.Tensor
    ffn_norm: torch.Tensor
    w13: torch.Tensor
    w2: torch.Tensor


__all__ = ["FusedCpuDecode"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _plain(t: object, dtype: torch.dtype) -> bool:
    """A dense, contiguous CPU tensor of ``dtype`` (not a subclass such as a packed quantized weight)."""
    return (type(t) is torch.Tensor or type(t) is torch.nn.Parameter) and t.layout == torch.strided \
        and t.device.type == "cpu" and t.dtype == dtype and t.is_contiguous()


class FusedCpuDecode:
    """The per-layer weight lists of a model, ready for :func:`~mistral_kernels.ops.decode_layers`."""

    def __init__(self, config: ModelConfig, layers: Sequence[DenseLayer]) -> None:
        self.config = config
        self.attn_norm = [ly.attn_norm for ly in layers]
        self.qkv = [ly.qkv for ly in layers]
        self.wo = [ly.wo for ly in layers]
        self.ffn_norm = [ly.ffn_norm for ly in layers]
        self.w13 = [ly.w13 for ly in layers]
        self.w2 = [ly.w2 for ly in layers]
        self.windows = [ly.window or 0 for ly in layers]
        self.scale = config.head_dim ** -0.5

    @classmethod
    def build(cls, config: ModelConfig, layers: Sequence[DenseLayer], kernels: ModuleType,
              device: torch.device, dtype: torch.dtype) -> FusedCpuDecode | None:
        """The fused path for these layers, or None when they need the per-op path: not the native CPU
        kernels, MoE, layers of another config (tensor-parallel shards; the model also passes only its own
        DecoderLayer class), or any weight that is not a plain dense contiguous fp32 / bf16 CPU tensor of the
        model's dtype."""
        if kernels is not ops or device.type != "cpu" or dtype not in _DTYPES or config.is_moe or not layers:
            return None
        if any(ly.config is not config for ly in layers):
            return None
        if not all(_plain(t, dtype) for ly in layers
                   for t in (ly.attn_norm, ly.qkv, ly.wo, ly.ffn_norm, ly.w13, ly.w2)):
            return None
        return cls(config, layers)

    def accepts(self, x: torch.Tensor, batch: AttentionBatch) -> bool:
        """Whether this step can run fused: decode-only, at most 16 rows, CPU index tensors."""
        return batch.decode_only and x.shape[0] <= SKINNY_MAX_M and batch.positions.device.type == "cpu"

    def __call__(self, x: torch.Tensor, residual: torch.Tensor, batch: AttentionBatch, cos_sin: torch.Tensor,
                 k_cache: Sequence[torch.Tensor], v_cache: Sequence[torch.Tensor]) -> None:
        """All layers on x [T, H] (embeddings in, last FFN output out) and residual [T, H], in place."""
        c = self.config
        ops.decode_layers(x, residual, self.attn_norm, self.qkv, self.wo, self.ffn_norm, self.w13, self.w2,
                          k_cache, v_cache, self.windows, batch.positions, batch.slot_mapping, batch.block_tables,
                          batch.seq_lens, cos_sin, c.n_heads, c.norm_eps, self.scale, c.rope_is_neox)
