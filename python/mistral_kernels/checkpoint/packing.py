"""Which weights stay packed: one :func:`packing_plan` that loading and the footprint both follow.

Only the fused *matrices* (qkv, wo, w13, w2, MoE w1 / w3 / w2, lm_head) can be packed; norms, the router and
the embedding table stay dense in the activation dtype (the embedding is a gather of T rows per step, not a
matmul: packing it would save memory, not time, so a quantized ``token_embd`` is dequantized at load; a
*tied* LM head still runs on the packed blocks of the embedding).

==============================  ==============================================================================
mode                            when
==============================  ==============================================================================
``"int8"``                      ``quantize="int8"``: every matrix, any format (INT8_ROWWISE, per output row)
``"packed"``                    ``quantized`` (default), no ``shard``, and every stored part of the matrix is
                                in a block format with a native kernel (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K;
                                a GGUF's quantized tensors) — the parts of an expert stack in one format
``"dense"``                     everything else (dequantized / converted to the activation dtype at load)
==============================  ==============================================================================

A matrix whose parts are in block formats without a kernel (Q5_0, Q2_K, IQ*, …) is dense and counted in
:attr:`PackingPlan.fallback` (one notice at load). The packed blocks themselves are read by the format
(:meth:`mistral_kernels.checkpoint.format.Format.read_packed`; GGUF's in :mod:`.gguf`).

int8 (:func:`quantize_fused`): the dense fused matrix is read (a map, or one temporary copy) and quantized
per output row (:func:`mistral_kernels.quant_weight.quantize_int8`) on the target device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

from ..config import ModelConfig
from ..quant_formats import QFORMAT_BY_CODE
from ..quant_weight import QuantizedWeight, quantize_int8
from .fusion import fusion_plan
from .naming import Entry
from .tensor_io import TensorInfo

__all__ = ["QUANTIZE_CHOICES", "Mode", "PackingPlan", "check_quantize", "is_matrix", "is_native", "packing_plan",
           "quantize_fused", "stored_dtype"]

QUANTIZE_CHOICES = ("int8",)
Mode = Literal["dense", "packed", "int8"]
_MATRIX_SUFFIXES = (".qkv", ".wo", ".w13", ".w2", ".w1", ".w3")


def is_matrix(fused: str) -> bool:
    """A fused weight that the decoder multiplies by (``ops.linear`` / the MoE experts): packable."""
    return fused == "lm_head" or fused.endswith(_MATRIX_SUFFIXES)


def is_native(info: TensorInfo) -> bool:
    """A stored tensor in a block format with native qlinear kernels."""
    return info.ggml_type is not None and info.ggml_type in QFORMAT_BY_CODE


def _packable(stored: Sequence[TensorInfo], ndim: int) -> bool:
    """Every part native; parts in different formats only for a 2-D matrix (then one group per format)."""
    if not stored or not all(is_native(t) for t in stored):
        return False
    return ndim == 2 or len({t.ggml_type for t in stored}) == 1


@dataclass(frozen=True)
class PackingPlan:
    """How each fused weight is held once loaded.

    modes : fused name → mode (module docstring)
    parts : fused name → the stored tensors it is made of, in row order
    tied_head : the LM head is tied and runs on the embedding's packed blocks (returned as ``lm_head``)
    fallback : block format without a kernel → tensors dequantized for that reason
    """

    modes: dict[str, Mode]
    parts: dict[str, tuple[TensorInfo, ...]]
    tied_head: bool = False
    fallback: dict[str, int] = field(default_factory=dict)


def check_quantize(quantize: str | None, sharded: bool) -> None:
    """ValueError unless ``quantize`` is None or a known choice (and not asked with tensor parallelism)."""
    if quantize is not None and quantize not in QUANTIZE_CHOICES:
        raise ValueError(f"quantize must be None or one of {QUANTIZE_CHOICES}, got {quantize!r}")
    if quantize is not None and sharded:
        raise ValueError("quantize is not supported with tensor parallelism (shard)")


def packing_plan(config: ModelConfig, entries: dict[str, Entry], *, quantized: bool = True,
                 quantize: str | None = None, sharded: bool = False) -> PackingPlan:
    """The plan for a checkpoint whose canonical tensors are ``entries`` (checked against ``config``)."""
    check_quantize(quantize, sharded)
    native = quantized and quantize is None and not sharded
    modes: dict[str, Mode] = {}
    parts: dict[str, tuple[TensorInfo, ...]] = {}
    fallback: dict[str, int] = {}
    for fused, names in fusion_plan(config):
        stored = parts[fused] = tuple(t for n in names for t in entries[n].stored)
        mode: Mode = "dense"
        if is_matrix(fused) and quantize is not None:
            mode = "int8"
        elif is_matrix(fused) and native:
            if _packable(stored, len(entries[names[0]].shape)):
                mode = "packed"
            else:
                for t in stored:
                    if t.ggml_type is not None and not is_native(t):
                        fallback[t.type_name] = fallback.get(t.type_name, 0) + 1
        modes[fused] = mode
    embed = entries["embed"]
    tied_head = native and config.tie_embeddings and _packable(embed.stored, len(embed.shape))
    return PackingPlan(modes, parts, tied_head, fallback)


def stored_dtype(stored: Sequence[TensorInfo]) -> torch.dtype:
    """The dtype to read parts in before int8 quantization: their stored one if they share it, else fp32."""
    kinds = {t.dtype for t in stored if t.ggml_type is None}
    return kinds.pop() if len(kinds) == 1 and all(t.ggml_type is None for t in stored) else torch.float32


def quantize_fused(dense: torch.Tensor, device: torch.device | str) -> QuantizedWeight:
    """INT8_ROWWISE of a dense fused matrix (any float dtype, [N, K] or [E, N, K]) on ``device``."""
    return quantize_int8(dense.to(device))
