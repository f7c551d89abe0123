"""One model configuration for Mistral / Mixtral / Llama-family decoders.

A :class:`ModelConfig` is built from what a checkpoint *contains* — an HF ``config.json``, a Mistral
``params.json`` or GGUF metadata — never guessed from file or directory names.

Shape letters: H hidden (``dim``), I intermediate (``hidden_dim``), Hq / Hkv heads, D head_dim,
V vocab, E experts, k top-k, L layers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = ["ModelConfig", "UnsupportedCheckpointError"]


class UnsupportedCheckpointError(ValueError):
    """The checkpoint describes a model this package does not implement (bias, rope scaling, ...)."""


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
    sliding_window : W, a token at position p sees keys j with p-W < j ≤ p; None = full causal
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
    sliding_window: int | None = None
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

    # ------------------------------------------------------------------ size and cost
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
        attention               L · 4·Hq·D·C, C = min(seq_len, W) keys (q·k and p·v)
        LM head                 2·V·H
        ======================  ==========================================================

        = 2 · (active matmul parameters) + 4·L·C·Hq·D; embedding lookup and norms are not counted.
        """
        if seq_len < 1:
            raise ValueError(f"flops_per_token: seq_len must be >= 1, got {seq_len}")
        context = min(seq_len, self.sliding_window or seq_len)
        attention = 4 * self.n_layers * context * self.n_heads * self.head_dim
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

    # ------------------------------------------------------------------ builders from checkpoints
    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> ModelConfig:
        """From a transformers ``config.json`` (model_type mistral / mixtral / llama); HF q/k → neox RoPE."""
        model_type = cfg.get("model_type")
        if model_type not in ("mistral", "mixtral", "llama"):
            raise UnsupportedCheckpointError(
                f"config.json: model_type={model_type!r} is not supported (mistral, mixtral, llama)")
        for flag in ("attention_bias", "mlp_bias"):
            if cfg.get(flag):
                raise UnsupportedCheckpointError(f"config.json: {flag}=true is not supported (no biases in this model)")
        if cfg.get("hidden_act", "silu") != "silu":
            raise UnsupportedCheckpointError(f"config.json: hidden_act={cfg['hidden_act']!r}, only 'silu' is supported")
        rope = cfg.get("rope_parameters") or {}  # transformers 5.x; 4.x has rope_theta / rope_scaling at top level
        theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
        scaling = cfg.get("rope_scaling") or rope
        if scaling.get("rope_type", scaling.get("type", "default")) != "default":
            raise UnsupportedCheckpointError(f"config.json: RoPE scaling {scaling} is not supported")
        heads = cfg["num_attention_heads"]
        eos = cfg.get("eos_token_id")
        experts = cfg.get("num_local_experts", 0) if model_type == "mixtral" else 0
        window = cfg.get("sliding_window") if model_type != "llama" else None
        if window is not None and cfg.get("use_sliding_window") is False:
            window = None
        return cls(
            dim=cfg["hidden_size"],
            n_layers=cfg["num_hidden_layers"],
            n_heads=heads,
            n_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            hidden_dim=cfg["intermediate_size"],
            vocab_size=cfg["vocab_size"],
            norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            rope_is_neox=True,
            sliding_window=window,
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            num_experts=experts,
            top_k=cfg.get("num_experts_per_tok", 0) if experts else 0,
            max_position=cfg.get("max_position_embeddings", 32768),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=_as_tuple(eos),
        )

    @classmethod
    def from_params_json(cls, params: dict[str, Any]) -> ModelConfig:
        """From a Mistral consolidated ``params.json``; consolidated q/k → interleaved RoPE.

        params.json does not state a maximum length; ``max_seq_len`` is used when present, else 32768.
        A missing ``rope_theta`` means 1e6, as in mistral-inference (the format's reference implementation).
        """
        if params.get("rope_scaling") or params.get("yarn"):
            raise UnsupportedCheckpointError("params.json: RoPE scaling is not supported")
        moe = params.get("moe") or {}
        heads = params["n_heads"]
        return cls(
            dim=params["dim"],
            n_layers=params["n_layers"],
            n_heads=heads,
            n_kv_heads=params.get("n_kv_heads", heads),
            head_dim=params.get("head_dim") or params["dim"] // heads,
            hidden_dim=params["hidden_dim"],
            vocab_size=params["vocab_size"],
            norm_eps=params.get("norm_eps", 1e-5),
            rope_theta=float(params.get("rope_theta") or 1e6),  # mistral-inference's default when absent
            rope_is_neox=False,
            sliding_window=params.get("sliding_window"),
            tie_embeddings=bool(params.get("tied_embeddings", False)),
            num_experts=moe.get("num_experts", 0),
            top_k=moe.get("num_experts_per_tok", 0),
            max_position=params.get("max_seq_len", 32768),
        )  # params.json states no special tokens: they come from the tokenizer (tokenizer.model / tekken.json)

    @classmethod
    def from_gguf_metadata(cls, reader: Any) -> ModelConfig:
        """From the metadata of a ``gguf.GGUFReader`` (llama-architecture GGUF: Llama, Mistral, Mixtral).

        GGUF q/k weights are stored in the interleaved layout by llama.cpp → interleaved RoPE.
        Tied embeddings ⇔ the file has no ``output.weight`` tensor.
        """
        fields = reader.fields

        def get(key: str, default: Any = ...) -> Any:
            if key in fields:
                return fields[key].contents()
            if default is ...:
                raise UnsupportedCheckpointError(f"GGUF metadata: required key {key!r} is missing")
            return default

        arch = get("general.architecture")
        if arch != "llama":
            raise UnsupportedCheckpointError(f"GGUF: general.architecture={arch!r} is not supported (llama)")
        scaling = get(f"{arch}.rope.scaling.type", "none")
        if scaling != "none":
            raise UnsupportedCheckpointError(f"GGUF: RoPE scaling {scaling!r} is not supported")
        dim = int(get(f"{arch}.embedding_length"))
        heads = int(get(f"{arch}.attention.head_count"))
        head_dim = int(get(f"{arch}.attention.key_length", dim // heads))
        rot = int(get(f"{arch}.rope.dimension_count", head_dim))
        vocab = get(f"{arch}.vocab_size", None)
        if vocab is None:
            vocab = len(fields["tokenizer.ggml.tokens"].data)
        experts = int(get(f"{arch}.expert_count", 0))
        eos = get("tokenizer.ggml.eos_token_id", None)
        names = {t.name for t in reader.tensors}
        return cls(
            dim=dim,
            n_layers=int(get(f"{arch}.block_count")),
            n_heads=heads,
            n_kv_heads=int(get(f"{arch}.attention.head_count_kv", heads)),
            head_dim=head_dim,
            hidden_dim=int(get(f"{arch}.feed_forward_length")),
            vocab_size=int(vocab),
            norm_eps=float(get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
            rope_theta=float(get(f"{arch}.rope.freq_base", 10000.0)),
            rope_is_neox=False,
            rotary_dim=rot if rot != head_dim else None,
            tie_embeddings="output.weight" not in names,
            num_experts=experts,
            top_k=int(get(f"{arch}.expert_used_count", 0)) if experts else 0,
            max_position=int(get(f"{arch}.context_length", 32768)),
            bos_token_id=get("tokenizer.ggml.bos_token_id", None),
            eos_token_ids=_as_tuple(eos),
        )

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
    def tiny_mistral(cls) -> ModelConfig:
        """A tiny GQA model with a sliding window (W=16) for tests."""
        return cls(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=96, vocab_size=128,
                   sliding_window=16, max_position=256)

    @classmethod
    def tiny_mixtral(cls) -> ModelConfig:
        """A tiny MoE model (4 experts, top-2) for tests."""
        return cls(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, hidden_dim=96, vocab_size=128,
                   num_experts=4, top_k=2, max_position=256)


def _as_tuple(ids: Any) -> tuple[int, ...]:
    if ids is None:
        return ()
    if isinstance(ids, (list, tuple)):
        return tuple(int(i) for i in ids)
    return (int(ids),)
