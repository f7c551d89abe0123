"""One model configuration for Mistral / Mixtral / Llama-family decoders.

The dataclass and the presets of published models. A :class:`ModelConfig` is built from what a checkpoint
*contains* — an HF ``config.json``, a Mistral ``params.json`` or GGUF metadata — never guessed from file or
directory names: each format's parser lives with its format (:mod:`mistral_kernels.checkpoint.hf`,
:mod:`~mistral_kernels.checkpoint.consolidated`, :mod:`~mistral_kernels.checkpoint.gguf`), and
:meth:`mistral_kernels.checkpoint.Checkpoint.open` picks it.

Shape letters: H hidden (``dim``), I intermediate (``hidden_dim``), Hq / Hkv heads, D head_dim,
V vocab, E experts, k top-k, L layers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import torch

from .rope_scaling import RopeScaling

__all__ = ["ModelConfig", "bounding_window"]


@dataclass(frozen=True)
class ModelConfig:
    """Architecture hyper-parameters of a decoder (all that the model code reads).

    Attributes
    ----------
    dim : H, residual stream width
    n_layers : L
    n_heads, n_kv_heads : Hq, Hkv (GQA when Hkv < Hq; Hq % Hkv == 0)
    head_dim : D
    hidden_dim : I, SwiGLU width (per expert for MoE)
    vocab_size : V
    norm_eps : RMSNorm epsilon
    rope_theta : RoPE base
    rope_is_neox : True for the HF q/k layout (pairs (i, i+D/2)); False for the interleaved layout of
        Mistral consolidated and GGUF checkpoints (pairs (2i, 2i+1)). Set by the checkpoint format.
    rotary_dim : R ≤ D dims rotated (partial rotary); None means D
    rope_scaling : frequency scaling of RoPE (llama3 / linear / dynamic / yarn; :mod:`.rope_scaling`); None = plain
    sliding_window : W, a token at position p sees keys j with p-W < j ≤ p; None = full causal. With
        ``layer_windows`` it is the window that bounds *every* layer's reads — the largest window, or None
        when any layer has full attention — which is what the KV cache manager may free by.
    layer_windows : per-layer windows (None entries = full attention) when layers differ (Ministral's
        interleaved windows); None means every layer uses ``sliding_window``. Read with :meth:`window_of`.
    tie_embeddings : LM head shares the embedding matrix
    num_experts, top_k : E, k for a sparse MoE FFN (Mixtral); 0 means a dense SwiGLU FFN
    max_position : rows of the RoPE table (longest supported sequence)
    bos_token_id, eos_token_ids : where the checkpoint states them
    """

    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_dim: int
    vocab_size: int
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_is_neox: bool = True
    rotary_dim: int | None = None
    rope_scaling: RopeScaling | None = None
    sliding_window: int | None = None
    layer_windows: tuple[int | None, ...] | None = None
    tie_embeddings: bool = False
    num_experts: int = 0
    top_k: int = 0
    max_position: int = 32768
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("dim", "n_layers", "n_heads", "n_kv_heads", "head_dim", "hidden_dim", "vocab_size",
                     "max_position"):
            if getattr(self, name) <= 0:
                raise ValueError(f"ModelConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"ModelConfig: n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        if self.rotary_dim is not None and not (0 < self.rotary_dim <= self.head_dim and self.rotary_dim % 2 == 0):
            raise ValueError(f"ModelConfig.rotary_dim={self.rotary_dim} must be even and in "
                             f"(0, head_dim={self.head_dim}]")
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise ValueError(f"ModelConfig.sliding_window must be > 0 or None, got {self.sliding_window}")
        if self.layer_windows is not None:
            if len(self.layer_windows) != self.n_layers:
                raise ValueError(f"ModelConfig.layer_windows has {len(self.layer_windows)} entries, expected "
                                 f"n_layers={self.n_layers}")
            if any(w is not None and w <= 0 for w in self.layer_windows):
                raise ValueError(f"ModelConfig.layer_windows entries must be > 0 or None, got {self.layer_windows}")
            if self.sliding_window != bounding_window(self.layer_windows):
                raise ValueError(f"ModelConfig.sliding_window={self.sliding_window} must be "
                                 f"{bounding_window(self.layer_windows)} with layer_windows={self.layer_windows} "
                                 "(the largest window, None when a layer has full attention); build with "
                                 "ModelConfig.with_layer_windows")
        if self.num_experts and not 0 < self.top_k <= self.num_experts:
            raise ValueError(f"ModelConfig: top_k={self.top_k} must be in [1, num_experts={self.num_experts}]")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def rot_dim(self) -> int:
        """R, the number of rotated dims of each head."""
        return self.rotary_dim or self.head_dim

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def window_of(self, layer: int) -> int | None:
        """The sliding window of layer ``layer`` (None = full causal attention)."""
        if not 0 <= layer < self.n_layers:
            raise ValueError(f"ModelConfig.window_of: layer must be in [0, {self.n_layers}), got {layer}")
        return self.sliding_window if self.layer_windows is None else self.layer_windows[layer]

    def with_layer_windows(self, windows: tuple[int | None, ...] | list[int | None]) -> ModelConfig:
        """This config with per-layer ``windows`` (``sliding_window`` set to their bound; uniform → no tuple)."""
        windows = tuple(windows)
        if len(set(windows)) == 1:
            return self.replace(sliding_window=windows[0], layer_windows=None)
        return self.replace(sliding_window=bounding_window(windows), layer_windows=windows)

    # ------------------------------------------------------------------ size and cost
    def kv_bytes_per_token(self, dtype: torch.dtype) -> int:
        """Bytes the paged KV cache holds per token in ``dtype``: k and v of every layer, 2·L·Hkv·D·bytes.

        Mistral-7B in bf16: 2 · 32 · 8 · 128 · 2 = 131,072 bytes (128 KiB). A tensor-parallel rank holds
        its local config's share (``parallel.local_config(...).kv_bytes_per_token(dtype)``).
        """
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * dtype.itemsize

    def num_parameters(self, active_only: bool = False) -> int:
        """Parameter count from the config alone (no weights needed).

        ``active_only`` counts only the k of E experts a token goes through (Mixtral-8x7B: 46.7B total,
        12.9B active). The embedding table counts once when tied.
        """
        norms = (2 * self.n_layers + 1) * self.dim
        embed = 0 if self.tie_embeddings else self.vocab_size * self.dim  # tied: the LM head is the table
        return embed + norms + self._matmul_parameters(active_only)

    def flops_per_token(self, seq_len: int) -> int:
        """Forward FLOPs of one token attending to ``seq_len`` tokens (multiply-add = 2 FLOPs).

        ======================  ==========================================================
        part                    FLOPs per token
        ======================  ==========================================================
        QKV + O projections     L · 2·H·(Hq+2·Hkv)·D + L · 2·Hq·D·H
        FFN, dense              L · 2·3·H·I
        FFN, MoE                L · (2·E·H router + k · 2·3·H·I)
        attention               Σ layers 4·Hq·D·C, C = min(seq_len, W of the layer) keys
        LM head                 2·V·H
        ======================  ==========================================================

        = 2 · (active matmul parameters) + 4·ΣC·Hq·D; embedding lookup and norms are not counted.
        """
        if seq_len < 1:
            raise ValueError(f"flops_per_token: seq_len must be >= 1, got {seq_len}")
        contexts = sum(min(seq_len, self.window_of(n) or seq_len) for n in range(self.n_layers))
        attention = 4 * contexts * self.n_heads * self.head_dim
        return 2 * self._matmul_parameters(active_only=True) + attention

    def _matmul_parameters(self, active_only: bool) -> int:
        """Weights used in matmuls: projections, FFN / experts (k of E when active_only), router, LM head."""
        h, d, i = self.dim, self.head_dim, self.hidden_dim
        attention = h * (self.n_heads + 2 * self.n_kv_heads) * d + self.n_heads * d * h
        if self.is_moe:
            ffn = self.num_experts * h + (self.top_k if active_only else self.num_experts) * 3 * h * i
        else:
            ffn = 3 * h * i
        return self.n_layers * (attention + ffn) + self.vocab_size * h

    # ------------------------------------------------------------------ presets
    @classmethod
    def mistral_7b_v01(cls) -> ModelConfig:
        """Mistral-7B-v0.1 (sliding window 4096), consolidated layout."""
        return cls(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128, hidden_dim=14336,
                   vocab_size=32000, norm_eps=1e-5, rope_theta=10000.0, rope_is_neox=False, sliding_window=4096,
                   max_position=32768, bos_token_id=1, eos_token_ids=(2,))

    @classmethod
    def mixtral_8x7b(cls) -> ModelConfig:
        """Mixtral-8x7B-v0.1: 8 experts, top-2, θ = 1e6, consolidated layout (46.7B total / 12.9B active)."""
        return cls(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128, hidden_dim=14336,
                   vocab_size=32000, norm_eps=1e-5, rope_theta=1e6, rope_is_neox=False, num_experts=8, top_k=2,
                   max_position=32768, bos_token_id=1, eos_token_ids=(2,))

    @classmethod
    def mistral_7b_v02(cls) -> ModelConfig:
        """Mistral-7B-v0.2: no sliding window, θ = 1e6, vocab 32000 (7.24B)."""
        return cls.mistral_7b_v01().replace(rope_theta=1e6, sliding_window=None)

    @classmethod
    def mistral_7b_v03(cls) -> ModelConfig:
        """Mistral-7B-v0.3: as v0.2 with the v3 tokenizer's vocab 32768 (7.25B)."""
        return cls.mistral_7b_v02().replace(vocab_size=32768)

    @classmethod
    def mistral_nemo_12b(cls) -> ModelConfig:
        """Mistral-Nemo-12B (2407): head_dim 128 ≠ 5120/32, θ = 1e6, tekken vocab 131072 (12.2B).

        The HF config states max_position_embeddings 1,024,000; the preset's RoPE table covers the
        advertised 128k context.
        """
        return cls(dim=5120, n_layers=40, n_heads=32, n_kv_heads=8, head_dim=128, hidden_dim=14336,
                   vocab_size=131072, norm_eps=1e-5, rope_theta=1e6, rope_is_neox=False, max_position=131072,
                   bos_token_id=1, eos_token_ids=(2,))

    @classmethod
    def mistral_small_24b(cls) -> ModelConfig:
        """Mistral-Small-24B (3.x text decoder): head_dim 128 ≠ 5120/32, θ = 1e8, vocab 131072 (23.6B)."""
        return cls.mistral_nemo_12b().replace(hidden_dim=32768, rope_theta=1e8, max_position=32768)

    @classmethod
    def ministral_8b(cls) -> ModelConfig:
        """Ministral-8B (2410): 36 layers, θ = 1e8, vocab 131072, interleaved windows (8.0B).

        Every fourth layer has full attention, the others a 32768-token window (128k context).
        """
        base = cls(dim=4096, n_layers=36, n_heads=32, n_kv_heads=8, head_dim=128, hidden_dim=12288,
                   vocab_size=131072, norm_eps=1e-5, rope_theta=1e8, rope_is_neox=False, max_position=131072,
                   bos_token_id=1, eos_token_ids=(2,))
        return base.with_layer_windows([None if n % 4 == 3 else 32768 for n in range(36)])

    @classmethod
    def mixtral_8x22b(cls) -> ModelConfig:
        """Mixtral-8x22B-v0.1: 56 layers, 48 / 8 heads, 8 experts top-2, vocab 32768 (140.6B total / 39B active)."""
        return cls(dim=6144, n_layers=56, n_heads=48, n_kv_heads=8, head_dim=128, hidden_dim=16384,
                   vocab_size=32768, norm_eps=1e-5, rope_theta=1e6, rope_is_neox=False, num_experts=8, top_k=2,
                   max_position=65536, bos_token_id=1, eos_token_ids=(2,))

    @classmethod
    def llama_31_8b(cls) -> ModelConfig:
        """Llama-3.1-8B(-Instruct): llama3 RoPE (factor 8 over 8192), θ = 5e5, vocab 128256 (8.03B), HF layout."""
        return cls(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128, hidden_dim=14336,
                   vocab_size=128256, norm_eps=1e-5, rope_theta=5e5, rope_is_neox=True,
                   rope_scaling=RopeScaling("llama3", 8.0, 8192, low_freq_factor=1.0, high_freq_factor=4.0),
                   max_position=131072, bos_token_id=128000, eos_token_ids=(128001, 128008, 128009))

    @classmethod
    def tiny_mistral(cls) -> ModelConfig:
        """A tiny GQA model with a sliding window (W=16) for tests."""
        return cls(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=96, vocab_size=128,
                   sliding_window=16, max_position=256)

    @classmethod
    def tiny_mixtral(cls) -> ModelConfig:
        """A tiny MoE model (4 experts, top-2) for tests."""
        return cls(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=96, vocab_size=128,
                   num_experts=4, top_k=2, max_position=256)


def bounding_window(windows: Collection[int | None]) -> int | None:
    """The window that bounds every layer's reads: the largest, or None when any layer is full attention.

    Example: (4096, 4096, None) → None;  (32, 64) → 64.
    """
    if not windows or any(w is None for w in windows):
        return None
    return max(w for w in windows if w is not None)
