"""Fusion: which canonical tensors are joined into each weight the model takes, and reading them joined.

Fused names (:func:`fusion_plan`): ``embed, norm, lm_head?`` and per layer ``attn_norm, qkv [(Hq+2·Hkv)·D, H],
wo, ffn_norm`` plus ``w13 [2I, H], w2`` (dense) or ``gate, w1, w3, w2`` (MoE, stacked over experts as
:func:`mistral_kernels.ops.fused_moe` takes them).

:func:`read_fused` reads one fused weight without a second copy: a weight stored in the final dtype on the
CPU — a fused one too when its parts lie back to back, as HF's gate_proj | up_proj do — is a private memory
map of the file (:func:`mistral_kernels.checkpoint.tensor_io.map_tensors`: page-cache pages, no copy); any
other (``wq|wk|wv → qkv``, dense ``w1|w3 → w13``, MoE experts stacked) is allocated once in the final dtype
and its parts are read straight from the files into their rows
(:func:`mistral_kernels.checkpoint.tensor_io.read_into`: ``preadv``; conversions and GGUF dequantization
through a bounded scratch buffer). Peak memory is the weights plus a few tens of MB.

Shape letters: H hidden, I intermediate, Hq / Hkv heads, D head_dim.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..config import ModelConfig
from ..errors import CheckpointError
from .naming import Entry
from .source import TensorSource
from .tensor_io import Index, selected_shape

__all__ = ["Part", "bytes_to_read", "fusion_plan", "read_fused"]

Part = tuple[Entry, "Index | None"]  # a canonical tensor and the part of it to read (None = all)


def fusion_plan(config: ModelConfig) -> list[tuple[str, list[str]]]:
    """Fused name → the canonical tensors joined along dim 0 to make it, in reading (= file) order."""
    plan = [("embed", ["embed"])]
    for n in range(config.n_layers):
        p = f"layers.{n}."
        plan += [(p + "attn_norm", [p + "attn_norm"]), (p + "qkv", [p + "wq", p + "wk", p + "wv"]),
                 (p + "wo", [p + "wo"]), (p + "ffn_norm", [p + "ffn_norm"])]
        if config.is_moe:
            plan += [(p + "gate", [p + "gate"])] + [(p + w, [p + "experts." + w]) for w in ("w1", "w3", "w2")]
        else:
            plan += [(p + "w13", [p + "w1", p + "w3"]), (p + "w2", [p + "w2"])]
    plan.append(("norm", ["norm"]))
    if not config.tie_embeddings:
        plan.append(("lm_head", ["lm_head"]))
    return plan


def bytes_to_read(entry: Entry, index: Index | None) -> int:
    """File bytes behind ``entry[index]`` (the stored bytes per element × the elements selected)."""
    stored = sum(t.nbytes for t in entry.stored)
    elements = sum(math.prod(t.shape) for t in entry.stored)
    return stored * math.prod(selected_shape(entry.shape, index)) // max(1, elements)


def fused_shape(parts: list[Part]) -> tuple[int, ...]:
    """The shape of the parts joined along dim 0 (CheckpointError when they differ past dim 0)."""
    shapes = [selected_shape(e.shape, index) for e, index in parts]
    if len({s[1:] for s in shapes}) > 1:
        raise CheckpointError(f"cannot fuse {[e.origin for e, _ in parts]}: shapes {shapes} differ past dim 0")
    return (sum(s[0] for s in shapes), *shapes[0][1:])


def read_fused(parts: list[Part], device: torch.device | str, dtype: torch.dtype,
               advance: Callable[[int], object], source: TensorSource | None) -> torch.Tensor:
    """The fused tensor: a view of the file when ``source`` allows it (whole parts stored back to back in
    ``dtype``, CPU), else allocated once with each part read straight into its rows (no concatenation copy)."""
    shape = fused_shape(parts)
    whole = all(index is None and math.prod(e.shape) == sum(math.prod(t.shape) for t in e.stored)
                for e, index in parts)
    if source is not None and whole and torch.device(device).type == "cpu":
        mapped = source.map([t.name for e, _ in parts for t in e.stored], dtype)
        if mapped is not None:
            advance(sum(bytes_to_read(e, None) for e, _ in parts))
            return mapped.view(shape)
    out = torch.empty(shape, dtype=dtype, device=device)
    row = 0
    for entry, index in parts:
        rows = selected_shape(entry.shape, index)[0]
        entry.fill(out[row:row + rows], index)
        advance(bytes_to_read(entry, index))
        row += rows
    return out
