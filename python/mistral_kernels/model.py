"""Mistral / Mixtral / Llama-family decoders on this package's ops, with a paged KV cache.

Shape letters: T new tokens (packed over the batch), B sequences, H hidden, I intermediate,
Hq / Hkv heads, D head_dim, V vocab, E experts, N cache blocks, S block size.

One forward step::

    residual = 0;  x = embed[token_ids]                                       # [T, H]
    per layer:  residual += x;  x = rms_norm(residual)        (fused_add_rms_norm)
                qkv = x·Wqkvᵀ → RoPE(q, k) → k, v into the paged cache → paged attention → ·Woᵀ
                residual += x;  x = rms_norm(residual)        (fused_add_rms_norm)
                x = SwiGLU(x)  or  fused_moe(x)
    residual += x;  x = rms_norm(residual);  logits = x·W_lmᵀ (fp32)          # [T or N, V]

Usage by an engine: allocate a :class:`KVCache` (``model.new_cache(num_blocks, block_size)``), hand out
its blocks to sequences (block manager), and call :meth:`Model.forward` with the new tokens and an
:class:`~mistral_kernels.batch.AttentionBatch` describing where they go — prefill (any number of new
tokens per sequence, after an optional cached prefix) and decode (one new token per sequence) alike.
:meth:`Model.logits` is the one-call helper: one fresh prefill of one sequence.

Checkpoints are turned into models by :func:`mistral_kernels.loading.load_model`; tensor / expert
parallelism builds its layers from outside this module (:mod:`mistral_kernels.parallel`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

import torch
import torch.nn.functional as F

from . import ops
from .batch import AttentionBatch
from .config import ModelConfig
from .cpu_decode import FusedCpuDecode
from .packed_moe import packed_moe
from .quant_weight import PackedWeight, QuantizedWeight
from .rope_scaling import RopeTable

__all__ = ["DecoderLayer", "KVCache", "Model", "fp32_logits"]

# ATen runs an elementwise op over fewer elements than this on the calling thread (at::internal::GRAIN_SIZE,
# ATen/TensorIterator.h), over more in a parallel region.
_ATEN_GRAIN = 32768
_SERIAL_LOGITS = 8 * _ATEN_GRAIN  # fp32 casts of at most this many logits run serially (a decode step's)


def fp32_logits(y: torch.Tensor) -> torch.Tensor:
    """``y.float()`` for the LM head's output y [N, V]; on the CPU, a decode step's without a parallel region.

    A cast of more than 32768 elements opens an OpenMP region, whose wake-up and join cost more than the
    cast of one decode step's logits (SmolLM2: V = 49152): microseconds on an idle machine, a time slice
    (milliseconds) on a loaded one, where the pool's threads are not running (benchmarks/results/
    cpu_engine_overhead.md). Up to ``_SERIAL_LOGITS`` elements the cast runs in pieces below ATen's grain, on
    this thread; larger outputs (prefill logits of many rows) keep the parallel cast.
    """
    n = y.numel()
    if y.dtype == torch.float32 or y.device.type != "cpu" or n > _SERIAL_LOGITS or not y.is_contiguous():
        return y.float()
    out = torch.empty(y.shape, dtype=torch.float32)
    flat_out, flat_y = out.view(-1), y.view(-1)
    piece = _ATEN_GRAIN // 2
    for start in range(0, n, piece):
        flat_out[start:start + piece].copy_(flat_y[start:start + piece])
    return out


@dataclass
class KVCache:
    """Paged K/V storage of one model: per layer, k and v tensors [N, S, Hkv, D].

    Which blocks belong to which sequence is the caller's business (block tables in the AttentionBatch).
    """

    k: list[torch.Tensor]
    v: list[torch.Tensor]

    @classmethod
    def allocate(cls, config: ModelConfig, num_blocks: int, block_size: int, *,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> KVCache:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"KVCache.allocate: need num_blocks >= 1 and block_size >= 1, got {num_blocks}, "
                             f"{block_size}")
        shape = (num_blocks, block_size, config.n_kv_heads, config.head_dim)
        # Uninitialised on purpose: the attention kernels read only slots that were written (tests fill
        # unused slots with NaN), and untouched pages of a large pool then cost no resident memory.
        return cls(k=[torch.empty(shape, device=device, dtype=dtype) for _ in range(config.n_layers)],
                   v=[torch.empty(shape, device=device, dtype=dtype) for _ in range(config.n_layers)])

    @property
    def num_blocks(self) -> int:
        return self.k[0].shape[0]

    @property
    def block_size(self) -> int:
        return self.k[0].shape[1]


class DecoderLayer:
    """RMSNorm → attention → fused add + RMSNorm → SwiGLU / MoE FFN, weights from the fused checkpoint."""

    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor | PackedWeight], index: int,
                 kernels: ModuleType) -> None:
        p = f"layers.{index}."
        self.config = config
        self.kernels = kernels
        self.window = config.window_of(index)     # W of this layer (None = full causal)
        self.attn_norm = weights[p + "attn_norm"]  # [H]
        self.qkv = weights[p + "qkv"]              # [(Hq + 2·Hkv)·D, H]
        self.wo = weights[p + "wo"]                # [H, Hq·D]
        self.ffn_norm = weights[p + "ffn_norm"]    # [H]
        if config.is_moe:
            self.gate = weights[p + "gate"]        # [E, H]
            self.w1 = weights[p + "w1"]            # [E, I, H]
            self.w3 = weights[p + "w3"]            # [E, I, H]
            self.w2 = weights[p + "w2"]            # [E, H, I]
        else:
            self.w13 = weights[p + "w13"]          # [2I, H]: gate rows then up rows
            self.w2 = weights[p + "w2"]            # [H, I]

    def attention(self, x: torch.Tensor, batch: AttentionBatch, cos_sin: torch.Tensor,
                  k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """x [T, H] (normed) → attention output projected back to [T, H]; writes k, v into the cache."""
        c = self.config
        t = x.shape[0]
        qkv = ops.linear(x, self.qkv)                                            # [T, (Hq+2Hkv)·D]
        q, k, v = qkv.split([c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.n_kv_heads * c.head_dim], -1)
        q = q.view(t, c.n_heads, c.head_dim)                                   # [T, Hq, D] (token-strided views)
        k = k.view(t, c.n_kv_heads, c.head_dim)                                # [T, Hkv, D]
        v = v.view(t, c.n_kv_heads, c.head_dim)
        self.kernels.rotary_embedding(batch.positions, q, k, cos_sin, c.rope_is_neox)
        self.kernels.reshape_and_cache(k, v, k_cache, v_cache, batch.slot_mapping)
        scale = c.head_dim ** -0.5
        if batch.decode_only:
            out = self.kernels.paged_decode_attention(q, k_cache, v_cache, batch.block_tables, batch.seq_lens,
                                                      scale, self.window)
        elif batch.num_decode:  # mixed step: leading decode rows → decode kernel (split-K), the rest → prefill
            n = batch.num_decode
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)          # [T, Hq, D]
            self.kernels.paged_decode_attention(q[:n], k_cache, v_cache, batch.block_tables[:n], batch.seq_lens[:n],
                                                scale, self.window, out=out[:n])
            self.kernels.paged_prefill_attention(q[n:], k_cache, v_cache, batch.block_tables[n:],
                                                 batch.prefill_cu_seqlens_q, batch.seq_lens[n:], scale, self.window,
                                                 out=out[n:])
        else:
            out = self.kernels.paged_prefill_attention(q, k_cache, v_cache, batch.block_tables,
                                                       batch.cu_seqlens_q, batch.seq_lens, scale, self.window)
        return ops.linear(out.view(t, c.n_heads * c.head_dim), self.wo)          # [T, H]

    def ffn(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, H] (normed) → [T, H]: SwiGLU, or Mixtral's sparse MoE block."""
        if self.config.is_moe:
            if isinstance(self.w1, QuantizedWeight):  # packed experts: grouped quantized GEMMs (moe_qgemm)
                return packed_moe(self.kernels, x, self.gate, self.w1, self.w2, self.w3, self.config.top_k, True)
            return self.kernels.fused_moe(x, self.gate, self.w1, self.w2, self.w3, self.config.top_k, True)
        gate_up = ops.linear(x, self.w13)                                       # [T, 2I]
        return ops.linear(self.kernels.silu_and_mul(gate_up), self.w2)          # [T, I] → [T, H]


class Model:
    """A decoder with fused weights (see :mod:`mistral_kernels.checkpoint.naming` for the names and shapes).

    Parameters
    ----------
    config : the architecture
    weights : fused weights, all of one dtype and device (from
        :func:`~mistral_kernels.checkpoint.base.load_checkpoint`);
        the matrices may be packed (:mod:`mistral_kernels.quant_weight`: GGUF blocks or int8 rows, on the same
        device), which ``ops.linear`` and the MoE block dispatch on; a tied model with a packed embedding
        passes its packed head as ``lm_head`` (the embedding itself is dense)
    kernels : the op namespace the decoder calls — :mod:`mistral_kernels.ops` (default), or
        :mod:`mistral_kernels.emulated` to run the CUDA kernels under the SIMT emulator (tests). Matmuls
        always use :func:`mistral_kernels.ops.linear`.
    layers : prebuilt decoder layers, one per ``config.n_layers`` (e.g. one tensor-parallel rank's,
        :class:`mistral_kernels.parallel.ShardedModel`); None builds :class:`DecoderLayer` from ``weights``.
        The KV cache is shaped by the config the layers compute with (:attr:`layer_config`).
    fused_cpu_decode : decode steps on the CPU run all dense layers in one native call
        (:mod:`mistral_kernels.cpu_decode`) when the model qualifies; False always runs the per-op layers.

    Attributes
    ----------
    cpu_decode : the fused CPU decode path, or None (per-op layers for every step)
    """

    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor | PackedWeight],
                 kernels: ModuleType = ops, *,
                 layers: Sequence[DecoderLayer] | None = None, fused_cpu_decode: bool = True) -> None:
        self.config = config
        self.kernels = kernels
        self.embed = weights["embed"]                                          # [V, H]
        self.norm = weights["norm"]                                            # [H]
        tied = config.tie_embeddings and "lm_head" not in weights
        self.lm_head = self.embed if tied else weights["lm_head"]                # [V, H]
        if layers is None:
            layers = [DecoderLayer(config, weights, n, kernels) for n in range(config.n_layers)]
        if len(layers) != config.n_layers:
            raise ValueError(f"Model: got {len(layers)} layers for a config with n_layers={config.n_layers}")
        self.layers = list(layers)
        self.layer_config = self.layers[0].config  # local heads of a tensor-parallel rank, else config
        self.dtype = self.embed.dtype
        self.device = self.embed.device
        # fp32 cos/sin rows, built on demand up to the positions a forward step can reach (not max_position)
        self.rope = RopeTable(config.max_position, config.rot_dim, config.rope_theta, config.rope_scaling,
                              self.device)
        plain = all(type(ly) is DecoderLayer for ly in self.layers)  # not a subclass (tensor-parallel shards)
        self.cpu_decode = FusedCpuDecode.build(config, self.layers, kernels, self.device, self.dtype) \
            if fused_cpu_decode and plain else None

    @property
    def cos_sin(self) -> torch.Tensor:
        """The cos/sin table built so far (fp32 [P, R], P ≥ :attr:`RopeTable.MIN_ROWS` or max_position)."""
        return self.rope.covering(RopeTable.MIN_ROWS)

    def new_cache(self, num_blocks: int, block_size: int) -> KVCache:
        """An (uninitialised) paged KV cache of ``num_blocks`` blocks of ``block_size`` tokens, in the model's dtype."""
        return KVCache.allocate(self.layer_config, num_blocks, block_size, device=self.device, dtype=self.dtype)

    @torch.no_grad()
    def forward(self, token_ids: torch.Tensor, batch: AttentionBatch, cache: KVCache) -> torch.Tensor:
        """One step over the packed new tokens of a batch of sequences.

        Parameters
        ----------
        token_ids : int64 [T], the new tokens packed by sequence (``batch.cu_seqlens_q``)
        batch : where the tokens sit (positions, cache slots, block tables; see :class:`AttentionBatch`)
        cache : the paged KV cache; the new tokens' k/v are written to ``batch.slot_mapping``

        Returns
        -------
        fp32 logits [N, V] for the rows ``batch.logits_indices`` (N = T when None).
        """
        if token_ids.dim() != 1 or token_ids.shape[0] != batch.num_tokens:
            raise ValueError(f"Model.forward: token_ids must be [T] with T = {batch.num_tokens} (batch.positions), "
                             f"got {tuple(token_ids.shape)}")
        eps = self.config.norm_eps
        x = F.embedding(token_ids, self.embed)                                 # [T, H]
        residual = torch.zeros_like(x)                                         # first fused add copies x
        # positions < (block table width · block size): a host-side bound, no device sync
        cos_sin = self.rope.covering(batch.block_tables.shape[1] * cache.block_size)
        if self.cpu_decode is not None and self.cpu_decode.accepts(x, batch):
            self.cpu_decode(x, residual, batch, cos_sin, cache.k, cache.v)   # all layers, one native call
        else:
            x = self._layers(x, residual, batch, cos_sin, cache)
        self.kernels.fused_add_rms_norm(x, residual, self.norm, eps)
        if batch.logits_indices is not None:
            x = x[batch.logits_indices]                                        # [N, H]
        return fp32_logits(ops.linear(x, self.lm_head))                           # [N, V]

    def _layers(self, x: torch.Tensor, residual: torch.Tensor, batch: AttentionBatch, cos_sin: torch.Tensor,
                cache: KVCache) -> torch.Tensor:
        """The decoder layers op by op on x [T, H] (the embeddings) and residual [T, H] (updated in place);
        returns the last layer's FFN output [T, H]."""
        eps = self.config.norm_eps
        for layer, k_cache, v_cache in zip(self.layers, cache.k, cache.v):
            self.kernels.fused_add_rms_norm(x, residual, layer.attn_norm, eps)  # residual += x; x = norm(residual)
            x = layer.attention(x, batch, cos_sin, k_cache, v_cache)
            self.kernels.fused_add_rms_norm(x, residual, layer.ffn_norm, eps)
            x = layer.ffn(x)
        return x

    def logits(self, token_ids: torch.Tensor) -> torch.Tensor:
        """fp32 logits [T, V] of one sequence: a single prefill into a fresh cache."""
        if token_ids.dim() != 1 or token_ids.shape[0] == 0:
            raise ValueError(f"Model.logits: token_ids must be a non-empty 1-D tensor, got {tuple(token_ids.shape)}")
        t, block_size = token_ids.shape[0], 16
        num_blocks = (t + block_size - 1) // block_size
        cache = self.new_cache(num_blocks, block_size)
        batch = AttentionBatch.build([list(range(num_blocks))], [0], [t], block_size, self.device)
        return self.forward(token_ids.to(self.device), batch, cache)

    def num_parameters(self, active_only: bool = False) -> int:
        """Parameter count (see :meth:`ModelConfig.num_parameters`; ``active_only``: k of E experts)."""
        return self.config.num_parameters(active_only)

    def flops_per_token(self, seq_len: int) -> int:
        """Forward FLOPs of one token at context ``seq_len`` (table in :meth:`ModelConfig.flops_per_token`)."""
        return self.config.flops_per_token(seq_len)
