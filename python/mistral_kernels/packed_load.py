"""Quantized weights at load: a GGUF's blocks kept as stored, and int8 weight-only quantization.

Called by :func:`mistral_kernels.weights.load_checkpoint` for every fused *matrix* (qkv, wo, w13, w2, MoE
w1 / w3 / w2, lm_head); norms, the router and the embedding table stay dense in the activation dtype (the
embedding is a gather of T rows per step, not a matmul: packing it would save memory, not time, so a
quantized ``token_embd`` is dequantized at load; a *tied* LM head still runs on the packed blocks).

GGUF (:func:`read_gguf_packed`): the parts of a fused matrix whose stored formats have a native kernel
(Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K) become one :class:`~mistral_kernels.quant_weight.QuantizedWeight` per
run of consecutive parts of one format — a memory map of the file when the run's tensors lie back to back,
else one uint8 buffer read straight from the file — and a :class:`~mistral_kernels.quant_weight.FusedWeight`
when the runs differ in format (Q4_K_M: wq | wk in Q4_K, wv in Q6_K). Any other format (Q5_0, Q2_K, IQ*, …)
is dequantized at load (:func:`mistral_kernels.weights.load_checkpoint` prints one notice for them).
Every block's fp16 scales are checked finite at load: a corrupt block is a :class:`CheckpointError`, not
NaN logits.

int8 (:func:`quantize_fused`): the dense fused matrix is read (a map, or one temporary copy) and quantized
per output row (:func:`mistral_kernels.quant_weight.quantize_int8`) on the target device.

Shape letters: N out features (rows), K in features, R packed row bytes, E experts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .errors import CheckpointError
from .quant_formats import QFORMAT_BY_CODE, QFormat
from .quant_weight import FusedWeight, PackedWeight, QuantizedWeight, quantize_int8
from .tensor_io import TensorInfo

__all__ = ["QUANTIZE_CHOICES", "is_native", "read_gguf_packed", "quantize_fused"]

QUANTIZE_CHOICES = ("int8",)

# Byte ranges of each block's fp16 scales (d, and dmin / m where the format has one), from the layouts in
# csrc/kernels/quant_blocks.h.
_SCALE_BYTES: dict[str, tuple[int, int]] = {
    "Q4_0": (0, 2), "Q4_1": (0, 4), "Q8_0": (0, 2), "Q4_K": (0, 4), "Q5_K": (0, 4), "Q6_K": (208, 210),
}


def is_native(info: TensorInfo) -> bool:
    """A GGUF quantized tensor in a format with native qlinear kernels."""
    return info.ggml_type is not None and info.ggml_type in QFORMAT_BY_CODE


def read_gguf_packed(stored: Sequence[TensorInfo], shape: tuple[int, ...], source: object,
                     device: torch.device | str) -> PackedWeight | None:
    """The fused matrix ``shape`` (2-D [N, K], or an expert stack [E, N, K]) made of the GGUF tensors
    ``stored`` (in row order) kept packed, or None when some part has no native format (or the parts of an
    expert stack differ in format): the caller then dequantizes.

    ``source`` is the open :class:`~mistral_kernels.formats.TensorSource` (``map_packed`` / ``read_packed``).
    """
    if not stored or not all(is_native(t) for t in stored):
        return None
    runs: list[list[TensorInfo]] = []
    for t in stored:
        if runs and runs[-1][0].ggml_type == t.ggml_type:
            runs[-1].append(t)
        else:
            runs.append([t])
    if len(runs) > 1 and len(shape) != 2:
        return None
    k = shape[-1]
    parts = []
    for run in runs:
        f = QFORMAT_BY_CODE[run[0].ggml_type]
        rows = sum(math.prod(t.shape[:-1]) for t in run)
        run_shape = (rows, k) if len(shape) == 2 else shape
        data = _packed_bytes(run, source)
        _check_scales(run, f, data)
        qweight = data.view(*run_shape[:-1], f.row_bytes(k))
        parts.append(QuantizedWeight(qweight.to(device), f.qtype, run_shape))
    return parts[0] if len(parts) == 1 else FusedWeight(tuple(parts))


def _packed_bytes(run: list[TensorInfo], source: object) -> torch.Tensor:
    """uint8 [bytes] of the run's blocks: a private map of the file when they lie back to back, else read."""
    mapped = source.map_packed([t.name for t in run])  # type: ignore[attr-defined]
    if mapped is not None:
        return mapped
    out = torch.empty(sum(t.nbytes for t in run), dtype=torch.uint8)
    at = 0
    for t in run:
        source.read_packed(t.name, out[at:at + t.nbytes])  # type: ignore[attr-defined]
        at += t.nbytes
    return out


def _check_scales(run: list[TensorInfo], f: QFormat, data: torch.Tensor) -> None:
    """CheckpointError naming the tensor and block when a block's fp16 scale is inf / NaN."""
    a, b = _SCALE_BYTES[f.name]
    at = 0
    for t in run:
        blocks = data[at:at + t.nbytes].view(-1, f.bytes)                     # [blocks, bytes]
        high = blocks[:, a + 1:b:2]             # the high byte of each little-endian fp16: sign, exponent
        bad = ((high & 0x7C) == 0x7C)           # exponent all ones: inf or NaN
        if bad.any():
            rows = bad.any(dim=1).nonzero()
            first = int(rows[0])
            raise CheckpointError(f"{t.file}: GGUF tensor {t.name!r} ({f.name} {list(t.shape)}): block {first} "
                                  f"(byte {t.offset + first * f.bytes}) has a non-finite scale; {rows.numel()} "
                                  "corrupt block(s) — the file is damaged")
        at += t.nbytes


def quantize_fused(dense: torch.Tensor, device: torch.device | str) -> QuantizedWeight:
    """INT8_ROWWISE of a dense fused matrix (any float dtype, [N, K] or [E, N, K]) on ``device``."""
    return quantize_int8(dense.to(device))
