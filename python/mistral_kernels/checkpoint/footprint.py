"""What the weights of a checkpoint take once loaded: per format, parameters and bytes (headers only).

Follows the same :class:`~mistral_kernels.checkpoint.packing.PackingPlan` as loading, bytes by the one rule
(:func:`mistral_kernels.quant_formats.weight_nbytes`): a matrix kept packed takes its blocks (as stored), an int8 matrix one byte per parameter + one fp32 scale per row, everything else
(norms, router, embedding, other formats) is dense in ``dtype``; a tied head on a packed embedding adds the
packed head's bytes. Used by ``mistral-kernels info`` and the memory warning of :class:`mistral_kernels.LLM`
(:meth:`mistral_kernels.checkpoint.Checkpoint.footprint`).

Example: SmolLM2-135M Q4_1 (Q8_0 embedding, tied), fp32: Q4_1 matrices 0.625 bytes/parameter, the embedding
dequantized to fp32 (4 bytes), the packed Q8_0 head 1.0625 bytes per embedding parameter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..quant_formats import QFORMAT_BY_CODE, QFORMATS, weight_nbytes
from .packing import PackingPlan
from .tensor_io import TensorInfo

__all__ = ["WeightFootprint", "weight_footprint"]


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


def weight_footprint(plan: PackingPlan, embed: tuple[TensorInfo, ...], dtype: torch.dtype) -> WeightFootprint:
    """The footprint of the weights ``plan`` holds, dense ones in ``dtype``; ``embed`` the stored embedding
    (its packed copy is the tied head when ``plan.tied_head``)."""
    dense = str(dtype).removeprefix("torch.")
    out = WeightFootprint()
    for fused, infos in plan.parts.items():
        mode = plan.modes[fused]
        for t in infos:
            n = math.prod(t.shape)
            out.parameters += n
            out._add(out.stored, t.type_name or str(t.dtype).removeprefix("torch."), n, t.nbytes)
            if mode == "int8":
                out._add(out.loaded, "INT8_ROWWISE", n, weight_nbytes(t.shape, QFORMATS["INT8_ROWWISE"]))
            elif mode == "packed":
                out._add(out.loaded, t.type_name, n, weight_nbytes(t.shape, QFORMAT_BY_CODE[t.ggml_type]))
            else:
                out._add(out.loaded, dense, n, weight_nbytes(t.shape, dtype))
    if plan.tied_head:
        head = sum(weight_nbytes(t.shape, QFORMAT_BY_CODE[t.ggml_type]) for t in embed)
        out._add(out.loaded, f"{embed[0].type_name} (tied head)", 0, head)
    return out
