"""Non-finite weights at load: one block-scale check for GGUF blocks, one value check for dense data.

- :func:`check_block_scales`: a GGUF quantized tensor decodes to inf / NaN exactly when a block's fp16 scale
  (``d``, and ``dmin`` / ``m`` where the format has one) is inf / NaN. The scale fields are scanned
  vectorized (the high byte of each fp16: exponent all ones), whatever happens to the blocks next — kept
  packed (:mod:`.gguf`), dequantized or requantized to int8 (:func:`mistral_kernels.checkpoint.tensor_io.read_into`).
  Formats whose scales are not a plain fp16 field (IQ1_M, MXFP4, ...) are caught by :func:`require_finite`
  on their decoded values.
- :func:`require_finite`: values the loader holds anyway (a conversion scratch, dequantized rows, a weight
  being quantized) are checked in 1M-element pieces with numpy on one thread (bf16 by its exponent bits),
  no temporary the size of the data.
- :func:`scan_weight`: the full scan ``check_tensors=True`` asks for (llama.cpp's ``--check-tensors``): every
  dense weight as loaded, memory-mapped ones included.

Each raises :class:`~mistral_kernels.errors.CheckpointError` naming the file and the tensor.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple, Protocol

import numpy as np
import torch

from ..errors import CheckpointError

__all__ = ["SCALE_BYTES", "Part", "check_block_scales", "check_quantized", "require_finite", "scan_weight"]


class TensorInfo(Protocol):
    """What the checks name (tensor_io.TensorInfo has it; this module imports nothing of the package)."""

    file: Path
    name: str
    type_name: str
    shape: tuple[int, ...]
    offset: int


class Part(NamedTuple):
    """One file tensor's rows of a loaded fused weight, for error messages: its name, its files, its rows."""

    origin: str
    files: tuple[str, ...]
    rows: int

# GGUF type name → byte range [a, b) of each block's fp16 scales (ggml's block layouts; a NaN / inf in any of
# them makes the gguf package decode the block to non-finite values: tests/test_load_checks.py).
SCALE_BYTES: dict[str, tuple[int, int]] = {
    "Q4_0": (0, 2), "Q4_1": (0, 4), "Q5_0": (0, 2), "Q5_1": (0, 4), "Q8_0": (0, 2),
    "Q2_K": (80, 84), "Q3_K": (108, 110), "Q4_K": (0, 4), "Q5_K": (0, 4), "Q6_K": (208, 210),
    "IQ2_XXS": (0, 2), "IQ2_XS": (0, 2), "IQ2_S": (0, 2), "IQ3_XXS": (0, 2), "IQ3_S": (0, 2), "IQ1_S": (0, 2),
    "IQ4_NL": (0, 2), "IQ4_XS": (0, 2), "TQ1_0": (52, 54), "TQ2_0": (64, 66),
}


def check_block_scales(info: TensorInfo, data: torch.Tensor, block_bytes: int, first_block: int = 0) -> None:
    """``data``: uint8 bytes of whole blocks of ``info`` (from block ``first_block`` on), ``block_bytes`` each.
    CheckpointError naming the tensor and the first block whose fp16 scale is inf / NaN."""
    span = SCALE_BYTES.get(info.type_name)
    if span is None or data.numel() == 0:
        return
    a, b = span
    blocks = data.view(-1, block_bytes)                      # [blocks, bytes]
    high = blocks[:, a + 1:b:2]                              # high byte of each little-endian fp16
    bad = (high & 0x7C) == 0x7C                              # exponent all ones: inf or NaN
    if not bool(bad.any()):
        return
    rows = bad.any(dim=1).nonzero()
    first = first_block + int(rows[0])
    raise CheckpointError(f"{info.file}: GGUF tensor {info.name!r} ({info.type_name} {list(info.shape)}): block "
                          f"{first} (byte {info.offset + first * block_bytes}) has a non-finite scale; "
                          f"{rows.numel()} corrupt block(s) in this part — the file is damaged")


_PIECE = 1 << 20  # elements scanned at a time: the boolean temporary stays 1 MB


def _all_finite(flat: torch.Tensor) -> bool:
    """Every value of a 1-D tensor finite. CPU: numpy on 1M-element pieces, one thread (torch's reductions
    hand each small piece to its thread pool, which costs more than the scan on a busy machine); bf16 by its
    exponent bits. Other devices: one ``aminmax`` (NaN propagates: both ends finite ⇔ all finite)."""
    if flat.device.type != "cpu":
        lo, hi = torch.aminmax(flat)
        return math.isfinite(float(lo)) and math.isfinite(float(hi))
    for a in range(0, flat.numel(), _PIECE):
        piece = flat[a:a + _PIECE]
        if piece.dtype == torch.bfloat16:
            bits = piece.view(torch.int16).numpy()
            if ((bits & 0x7F80) == 0x7F80).any():
                return False
        elif not np.isfinite(piece.numpy()).all():
            return False
    return True


def _first_bad(values: torch.Tensor) -> tuple[int, int, float] | None:
    """(flat index of the first non-finite value, how many, that value), or None when all are finite."""
    if values.numel() == 0 or not values.dtype.is_floating_point:
        return None
    flat = values.reshape(-1)  # a view for the contiguous tensors loading hands over
    if _all_finite(flat):
        return None
    bad = ~torch.isfinite(flat)
    first = int(bad.nonzero()[0])
    return first, int(bad.sum()), float(flat[first])


def _position(flat: int, shape: Sequence[int]) -> list[int]:
    """The index of element ``flat`` of a row-major tensor of ``shape``."""
    out = []
    for d in reversed(shape):
        out.append(flat % d if d else 0)
        flat //= max(d, 1)
    return out[::-1] or [0]


def require_finite(values: torch.Tensor, info: TensorInfo, first: int = 0) -> None:
    """``values``: elements ``first``.. of ``info``'s tensor (row-major, any shape); CheckpointError naming the
    file, the tensor and the first inf / NaN."""
    found = _first_bad(values)
    if found is None:
        return
    at, count, value = found
    raise CheckpointError(f"{info.file}: tensor {info.name!r} ({info.type_name} {list(info.shape)}) holds "
                          f"{value} at {_position(first + at, info.shape or (1,))} ({count} non-finite values in "
                          "this part) — the file is damaged")


def scan_weight(fused: str, weight: torch.Tensor, parts: Sequence[Part]) -> None:
    """Every value of a loaded dense fused weight (its ``parts`` joined along dim 0) finite, or CheckpointError
    naming the part's file tensor(s) and the first inf / NaN."""
    if _first_bad(weight) is None:
        return
    row = 0
    for part in parts:
        found = _first_bad(weight[row:row + part.rows])
        if found is not None:
            at, count, value = found
            raise CheckpointError(f"{', '.join(part.files)}: tensor {part.origin!r} (loaded as {fused}) holds "
                                  f"{value} at {_position(at, weight[row:row + part.rows].shape)} ({count} "
                                  "non-finite values) — the file is damaged")
        row += part.rows


def check_quantized(fused: str, scales: torch.Tensor, dense: torch.Tensor, parts: Sequence[Part]) -> None:
    """After int8 quantization of ``dense``: a row's scale (max |w| / 127) is inf / NaN exactly when the row
    holds one, so the N scales tell; then ``dense`` is scanned to name the tensor (:func:`scan_weight`)."""
    if _first_bad(scales) is not None:
        scan_weight(fused, dense, parts)
