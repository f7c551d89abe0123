"""What the weights of a checkpoint take once loaded: per format, parameters and bytes (headers only).

Follows :func:`mistral_kernels.weights.load_checkpoint`'s rules (:mod:`mistral_kernels.packed_load`): matrices
of a GGUF in a native format stay packed (their stored bytes), ``quantize="int8"`` makes every matrix int8 +
one fp32 scale per row, everything else (norms, router, embedding, other formats) is dense in ``dtype``; a
tied head on a packed embedding adds the packed head's bytes. Used by ``mistral-kernels info`` and the memory
warning of :class:`mistral_kernels.LLM`.

Example: SmolLM2-135M Q4_1 (Q8_0 embedding, tied), fp32: Q4_1 matrices 0.625 bytes/parameter, the embedding
dequantized to fp32 (4 bytes), the packed Q8_0 head 1.0625 bytes per embedding parameter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .packed_load import QUANTIZE_CHOICES, is_native
from .weights import stored_tensors

__all__ = ["WeightFootprint", "weight_footprint"]

_MATRICES = ("wq", "wk", "wv", "wo", "w1", "w2", "w3")


@dataclass
class WeightFootprint:
    """Per format as loaded (a dtype name, a GGUF format, INT8_ROWWISE): [parameters, bytes]; ``stored`` the
    same for the file's own types."""

    loaded: dict[str, list[int]] = field(default_factory=dict)
    stored: dict[str, list[int]] = field(default_factory=dict)
    parameters: int = 0

    @property
    def bytes(self) -> int:
        return sum(b for _, b in self.loaded.values())

    @staticmethod
    def _add(table: dict[str, list[int]], key: str, params: int, nbytes: int) -> None:
        row = table.setdefault(key, [0, 0])
        row[0] += params
        row[1] += nbytes


def weight_footprint(path: str | Path, dtype: torch.dtype, *, quantized: bool = True,
                     quantize: str | None = None) -> WeightFootprint:
    """The footprint of ``path`` loaded with these options (see the module docstring)."""
    if quantize is not None and quantize not in QUANTIZE_CHOICES:
        raise ValueError(f"quantize must be None or one of {QUANTIZE_CHOICES}, got {quantize!r}")
    config, fmt, tensors = stored_tensors(path)
    dense = str(dtype).removeprefix("torch.")
    out = WeightFootprint()
    for name, infos in tensors.items():
        matrix = name == "lm_head" or name.split(".")[-1] in _MATRICES
        for t in infos:
            n = math.prod(t.shape)
            out.parameters += n
            out._add(out.stored, t.type_name or str(t.dtype).removeprefix("torch."), n, t.nbytes)
            if matrix and quantize == "int8":
                out._add(out.loaded, "INT8_ROWWISE", n, n + 4 * (n // t.shape[-1]))
            elif matrix and quantized and fmt == "gguf" and is_native(t):
                out._add(out.loaded, t.type_name, n, t.nbytes)
            else:
                out._add(out.loaded, dense, n, n * dtype.itemsize)
    if config.tie_embeddings and quantize is None and quantized and fmt == "gguf":
        embed = tensors["embed"][0]
        if is_native(embed):
            out._add(out.loaded, f"{embed.type_name} (tied head)", 0, embed.nbytes)
    return out
