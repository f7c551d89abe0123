"""HF (transformers) checkpoints: a directory with ``config.json`` and ``*.safetensors`` shards.

Detection: a directory holding ``config.json`` and the safetensors files (those the
``model.safetensors.index.json`` names, else every ``*.safetensors`` not named ``consolidated*``). Config:
:func:`config_from_json` (model_type mistral / ministral / mixtral / llama). Tensors: HF names (below); q/k
rows in the neox RoPE layout, used as stored. Dtype: config.json's ``dtype`` / ``torch_dtype``. Tokenizer:
the directory (``tokenizer.json``, ``tekken.json`` or ``tokenizer.model*``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..config import ModelConfig
from ..errors import CheckpointError, UnsupportedCheckpointError
from ..rope_scaling import parse_rope_scaling
from .fields import Fields, as_tuple, build, token_id
from .format import Contents, Format
from .naming import Rule
from .source import Probe, read_json, safetensors_source

__all__ = ["HF", "HF_MODEL_TYPES", "config_from_json"]

HF_MODEL_TYPES = ("mistral", "ministral", "mixtral", "llama")
_CONFIG_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                  "float64": torch.float64}


class HFFormat(Format):
    name = "hf"
    expects = "config.json + *.safetensors (HF)"
    is_file = False
    rules: list[Rule] = [
        (r"model\.embed_tokens\.weight", "embed", 1),
        (r"model\.norm\.weight", "norm", 1),
        (r"lm_head\.weight", "lm_head", 1),
        (r"model\.layers\.(\d+)\.input_layernorm\.weight", r"layers.\1.attn_norm", 1),
        (r"model\.layers\.(\d+)\.post_attention_layernorm\.weight", r"layers.\1.ffn_norm", 1),
        (r"model\.layers\.(\d+)\.self_attn\.([qkvo])_proj\.weight", r"layers.\1.w\2", 1),
        (r"model\.layers\.(\d+)\.mlp\.gate_proj\.weight", r"layers.\1.w1", 1),
        (r"model\.layers\.(\d+)\.mlp\.up_proj\.weight", r"layers.\1.w3", 1),
        (r"model\.layers\.(\d+)\.mlp\.down_proj\.weight", r"layers.\1.w2", 1),
        (r"model\.layers\.(\d+)\.(?:block_sparse_moe|mlp)\.gate\.weight", r"layers.\1.gate", 1),
        (r"model\.layers\.(\d+)\.block_sparse_moe\.experts\.(?P<expert>\d+)\.(w[123])\.weight",
         r"layers.\1.experts.\3", 1),
        (r"model\.layers\.(\d+)\.mlp\.experts\.gate_up_proj", r"layers.\1.experts.w1|layers.\1.experts.w3", 2),
        (r"model\.layers\.(\d+)\.mlp\.experts\.down_proj", r"layers.\1.experts.w2", 1),
    ]
    ignored = re.compile(r".*rotary_emb\.inv_freq")  # a buffer some old HF checkpoints saved

    def detect(self, probe: Probe) -> bool:
        return probe.is_dir and (probe.path / "config.json").is_file() and bool(_files(probe.path))

    def read(self, probe: Probe) -> Contents:
        p = probe.path
        raw = read_json(p / "config.json")
        config = config_from_json(raw, str(p / "config.json"))
        named = str(raw.get("dtype") or raw.get("torch_dtype") or "").removeprefix("torch.")
        return Contents(config, safetensors_source(_files(p)), tokenizer=p, stated_dtype=_CONFIG_DTYPES.get(named))


HF = HFFormat()


def _files(p: Path) -> list[Path]:
    """The safetensors files of an HF directory: those the index names (inside the directory), else all."""
    index = p / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            raise CheckpointError(f"{index}: 'weight_map' must be an object of tensor name → file name")
        files = []
        for name in sorted(set(weight_map.values())):
            parts = Path(os.path.normpath(name)).parts  # lexical: shards may be symlinks (the HF hub cache)
            if not parts or Path(name).is_absolute() or parts[0] == "..":
                raise CheckpointError(f"{index}: weight_map file {name!r} is outside the checkpoint directory {p}")
            files.append(p / name)
        return files
    return [f for f in sorted(p.glob("*.safetensors")) if not f.name.startswith("consolidated")]


def config_from_json(cfg: dict[str, Any], source: str = "config.json") -> ModelConfig:
    """From a transformers ``config.json`` (model_type mistral / ministral / mixtral / llama); HF q/k → neox RoPE.

    RoPE: transformers 4.x spells ``rope_theta`` + ``rope_scaling``, 5.x one ``rope_parameters`` dict; both
    are read. Windows: ``sliding_window`` (null = none; ``use_sliding_window: false`` disables it) applies
    to the layers that ``layer_types`` marks ``sliding_attention`` (all layers when absent). Sizes are
    range-checked (:mod:`.fields`); errors name ``source``.
    """
    f = Fields(cfg, source)
    model_type = cfg.get("model_type")
    if model_type not in HF_MODEL_TYPES:
        raise UnsupportedCheckpointError(
            f"{source}: model_type={model_type!r} is not supported ({', '.join(HF_MODEL_TYPES)})")
    for flag in ("attention_bias", "mlp_bias"):
        if cfg.get(flag):
            raise UnsupportedCheckpointError(f"{source}: {flag}=true is not supported (no biases in this model)")
    if cfg.get("hidden_act", "silu") != "silu":
        raise UnsupportedCheckpointError(f"{source}: hidden_act={cfg['hidden_act']!r}, only 'silu' is supported")
    rope = cfg.get("rope_parameters") or {}  # transformers 5.x; 4.x has rope_theta / rope_scaling at top level
    scaling_spec = cfg.get("rope_scaling") or rope
    if not isinstance(rope, Mapping) or not isinstance(scaling_spec, Mapping):
        raise CheckpointError(f"{source}: rope_parameters / rope_scaling must be objects")
    if any(isinstance(v, Mapping) for v in rope.values()):
        raise UnsupportedCheckpointError(f"{source}: per-layer-type rope_parameters {rope} are not supported "
                                         "(one RoPE for all layers)")
    theta = Fields(rope, f"{source} rope_parameters").float("rope_theta", "rope_theta", None) \
        if rope.get("rope_theta") is not None else f.float("rope_theta", "rope_theta", 10000.0)
    partial = rope.get("partial_rotary_factor") or cfg.get("partial_rotary_factor") or 1.0
    if partial != 1.0:
        raise UnsupportedCheckpointError(f"{source}: partial_rotary_factor={partial} is not supported (1.0)")
    max_position = f.int("max_position_embeddings", "max_position", 32768)
    try:
        scaling = parse_rope_scaling(scaling_spec, max_position, source)
    except (ValueError, KeyError, TypeError) as e:
        raise UnsupportedCheckpointError(f"{source}: RoPE scaling not usable: {e}") from e
    heads = f.int("num_attention_heads", "n_heads")
    dim = f.int("hidden_size", "dim")
    layers = f.int("num_hidden_layers", "n_layers")
    experts = f.int("num_local_experts", "num_experts", 0) if model_type == "mixtral" else 0
    window = f.int("sliding_window", "sliding_window", None) if model_type != "llama" else None
    if window is not None and cfg.get("use_sliding_window") is False:
        window = None
    windows = _layer_windows(cfg.get("layer_types"), window, layers, source)
    return build(source, lambda: ModelConfig(
        dim=dim,
        n_layers=layers,
        n_heads=heads,
        n_kv_heads=f.int("num_key_value_heads", "n_kv_heads", heads),
        head_dim=f.int("head_dim", "head_dim", dim // heads),
        hidden_dim=f.int("intermediate_size", "hidden_dim"),
        vocab_size=f.int("vocab_size", "vocab_size"),
        norm_eps=f.float("rms_norm_eps", "norm_eps", 1e-6),
        rope_theta=theta,
        rope_is_neox=True,
        rope_scaling=scaling,
        sliding_window=window,
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        num_experts=experts,
        top_k=f.int("num_experts_per_tok", "top_k", 0) if experts else 0,
        max_position=max_position,
        bos_token_id=token_id(cfg.get("bos_token_id"), source),
        eos_token_ids=as_tuple(cfg.get("eos_token_id"), source),
    ).with_layer_windows(windows))


def _layer_windows(layer_types: Any, window: int | None, n_layers: int,
                   source: str = "config.json") -> tuple[int | None, ...]:
    """Per-layer windows from HF ``layer_types`` ('sliding_attention' → ``window``, 'full_attention' → None)."""
    if layer_types is None:
        return (window,) * n_layers
    if not isinstance(layer_types, list) or len(layer_types) != n_layers:
        raise UnsupportedCheckpointError(f"{source}: layer_types must be a list of num_hidden_layers={n_layers} "
                                         f"entries, got {layer_types!r}")
    known = {"sliding_attention": window, "full_attention": None}
    unknown = sorted({repr(t) for t in layer_types if not (isinstance(t, str) and t in known)})
    if unknown:
        raise UnsupportedCheckpointError(f"{source}: layer_types {unknown} are not supported "
                                         "(sliding_attention, full_attention)")
    return tuple(known[t] for t in layer_types)


