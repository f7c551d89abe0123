"""The quantized weight formats with native kernels: codes, block geometry and the bytes a weight takes.

The table is C++ ``MK_QTYPES`` (csrc/kernels/quant_blocks.h, the source) written in Python;
tests/test_quant_formats.py checks it entry by entry against that macro and the GGUF ones against the
``gguf`` package's ``GGML_QUANT_SIZES``. This module imports nothing of the package: the kernel wrappers
(:mod:`mistral_kernels.ops.quant`), the weight types (:mod:`mistral_kernels.quant_weight`) and the loader all
import it from here.

:func:`weight_nbytes` is the one rule for the bytes of a weight: a dense tensor's elements × element size,
a packed one's blocks (INT8_ROWWISE: int8 values + one fp32 scale per row).

Shape letters: N out features (rows), K in features, QK elements per block, R = K / QK · bytes per block.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["INT8_ROWWISE", "QFORMATS", "QFORMAT_BY_CODE", "QFormat", "dequantize", "weight_nbytes"]


@dataclass(frozen=True)
class QFormat:
    """One quantized format: its code (GGML's type number; INT8_ROWWISE is the project's own), QK, bytes."""

    name: str
    qtype: int
    block: int  # QK: elements per block
    bytes: int  # bytes per block

    def row_bytes(self, k: int) -> int:
        """Bytes of one packed row of K weights (K must be a multiple of QK)."""
        return k // self.block * self.bytes

    def nbytes(self, shape: Sequence[int]) -> int:
        """Bytes of a weight [.., N, K] in this format: the rows' blocks, plus INT8_ROWWISE's fp32 scale per row."""
        rows = math.prod(shape[:-1])
        scales = 4 * rows if self.qtype == INT8_ROWWISE_CODE else 0
        return rows * self.row_bytes(shape[-1]) + scales


INT8_ROWWISE_CODE = 1000  # kInt8Rowwise (the project's own format: not a GGML type)

# MK_QTYPES, entry by entry: X(code, name, QK, bytes per block).
QFORMATS: dict[str, QFormat] = {
    f.name: f
    for f in (
        QFormat("Q4_0", 2, 32, 18),
        QFormat("Q4_1", 3, 32, 20),
        QFormat("Q8_0", 8, 32, 34),
        QFormat("Q4_K", 12, 256, 144),
        QFormat("Q5_K", 13, 256, 176),
        QFormat("Q6_K", 14, 256, 210),
        QFormat("INT8_ROWWISE", INT8_ROWWISE_CODE, 1, 1),
    )
}
QFORMAT_BY_CODE: dict[int, QFormat] = {f.qtype: f for f in QFORMATS.values()}
INT8_ROWWISE = QFORMATS["INT8_ROWWISE"].qtype


def weight_nbytes(shape: Sequence[int], fmt: QFormat | torch.dtype) -> int:
    """Bytes of a weight of ``shape`` held in ``fmt``: a packed format's blocks (:meth:`QFormat.nbytes`) or a
    dense dtype's elements × element size. Example: [576, 576] in Q4_1 → 576 · 18 blocks · 20 B = 207,360;
    in bf16 → 663,552."""
    if isinstance(fmt, QFormat):
        return fmt.nbytes(shape)
    return math.prod(shape) * fmt.itemsize


def dequantize(qweight: torch.Tensor, qtype: int, scales: torch.Tensor | None = None) -> torch.Tensor:
    """The fp32 weight [N, K] of a quantized one (``ops.qlinear``'s formats), decoded by the ``gguf``
    package for the GGUF block formats (the project's kernels are tested against it); on the CPU."""
    if qtype == INT8_ROWWISE:
        if scales is None:
            raise ValueError("dequantize: INT8_ROWWISE needs scales (fp32 [N])")
        return qweight.float() * scales.float()[:, None]
    if qtype not in QFORMAT_BY_CODE:
        raise ValueError(f"dequantize: qtype {qtype} is none of {sorted(QFORMAT_BY_CODE)}")
    import gguf.quants

    rows = qweight.detach().cpu().contiguous().numpy()
    return torch.from_numpy(gguf.quants.dequantize(rows, gguf.GGMLQuantizationType(qtype)).copy()).float()
