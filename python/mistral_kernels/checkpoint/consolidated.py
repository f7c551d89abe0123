"""Mistral consolidated checkpoints: a directory with ``params.json`` and ``consolidated*.safetensors``.

Detection: a directory holding ``params.json`` and at least one ``consolidated*.safetensors`` (a directory
that is also an HF checkpoint loads as HF: :data:`~mistral_kernels.checkpoint.base.FORMATS` tries HF first).
Config: :func:`config_from_params`. Tensors: mistral-inference names (below); q/k rows in the interleaved RoPE
layout. Dtype: the stored one (bf16 as Mistral publishes them). Tokenizer: the directory (``tekken.json`` or
``tokenizer.model.v*``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..config import ModelConfig
from ..errors import CheckpointError, UnsupportedCheckpointError
from .fields import Fields, build
from .format import Contents, Format
from .naming import Rule
from .source import Probe, read_json, safetensors_source

__all__ = ["CONSOLIDATED", "config_from_params"]


class ConsolidatedFormat(Format):
    name = "consolidated"
    expects = "params.json + consolidated*.safetensors (Mistral)"
    is_file = False
    rules: list[Rule] = [
        (r"tok_embeddings\.weight", "embed", 1),
        (r"norm\.weight", "norm", 1),
        (r"output\.weight", "lm_head", 1),
        (r"layers\.(\d+)\.attention_norm\.weight", r"layers.\1.attn_norm", 1),
        (r"layers\.(\d+)\.ffn_norm\.weight", r"layers.\1.ffn_norm", 1),
        (r"layers\.(\d+)\.attention\.w([qkvo])\.weight", r"layers.\1.w\2", 1),
        (r"layers\.(\d+)\.feed_forward\.(w[123])\.weight", r"layers.\1.\2", 1),
        (r"layers\.(\d+)\.feed_forward\.gate\.weight", r"layers.\1.gate", 1),
        (r"layers\.(\d+)\.feed_forward\.experts\.(?P<expert>\d+)\.(w[123])\.weight", r"layers.\1.experts.\3", 1),
    ]
    # the vision encoder of Pixtral / Mistral Small 3.x checkpoints (the text decoder is loaded alone)
    ignored = re.compile(r"(vision_encoder|vision_language_adapter|patch_merger|pre_mm_projector_norm)\..*")

    def detect(self, probe: Probe) -> bool:
        return probe.is_dir and (probe.path / "params.json").is_file() and bool(_files(probe.path))

    def read(self, probe: Probe) -> Contents:
        p = probe.path
        config = config_from_params(read_json(p / "params.json"), str(p / "params.json"))
        return Contents(config, safetensors_source(_files(p)), tokenizer=p)


CONSOLIDATED = ConsolidatedFormat()


def _files(p: Path) -> list[Path]:
    return sorted(p.glob("consolidated*.safetensors"))


def config_from_params(params: dict[str, Any], source: str = "params.json") -> ModelConfig:
    """From a Mistral consolidated ``params.json``; consolidated q/k → interleaved RoPE.

    params.json does not state a maximum length; ``max_seq_len`` is used when present, else 32768.
    A missing ``rope_theta`` means 1e6, as in mistral-inference (the format's reference implementation).
    ``sliding_window`` may be a number, null, or a list of per-layer windows repeated over the layers
    (layer n uses entry n mod len; interleaved windows as in Ministral-8B).
    """
    f = Fields(params, source)
    if params.get("rope_scaling") or params.get("yarn"):
        raise UnsupportedCheckpointError(f"{source}: RoPE scaling (rope_scaling / yarn) is not supported in "
                                         "the consolidated format; use the model's HF config.json checkpoint")
    moe = params.get("moe") or {}
    if not isinstance(moe, Mapping):
        raise CheckpointError(f"{source}: moe must be an object, got {moe!r}")
    m = Fields(moe, f"{source} moe")
    heads = f.int("n_heads", "n_heads")
    dim = f.int("dim", "dim")
    layers = f.int("n_layers", "n_layers")
    pattern = params.get("sliding_window")
    if isinstance(pattern, list):
        if not pattern:
            raise UnsupportedCheckpointError(f"{source}: sliding_window is an empty list")
        pattern = [Fields({"sliding_window": w}, source).int("sliding_window", "sliding_window", None)
                   for w in pattern[:layers]]
        windows = tuple(pattern[n % len(pattern)] for n in range(layers))
    else:
        windows = (f.int("sliding_window", "sliding_window", None),) * layers
    return build(source, lambda: ModelConfig(
        dim=dim,
        n_layers=layers,
        n_heads=heads,
        n_kv_heads=f.int("n_kv_heads", "n_kv_heads", heads),
        head_dim=f.int("head_dim", "head_dim", dim // heads),
        hidden_dim=f.int("hidden_dim", "hidden_dim"),
        vocab_size=f.int("vocab_size", "vocab_size"),
        norm_eps=f.float("norm_eps", "norm_eps", 1e-5),
        rope_theta=f.float("rope_theta", "rope_theta", 1e6),  # mistral-inference's default when absent
        rope_is_neox=False,
        tie_embeddings=bool(params.get("tied_embeddings", False)),
        num_experts=m.int("num_experts", "num_experts", 0),
        top_k=m.int("num_experts_per_tok", "top_k", 0),
        max_position=f.int("max_seq_len", "max_position", 32768),
    ).with_layer_windows(windows))  # no special tokens in params.json: the tokenizer file states them
