"""Packed (quantized) weights of a model: what a linear layer holds instead of a dense tensor.

:class:`QuantizedWeight` is one matrix [N, K] (or a stack of experts [E, N, K]) in one format of
:data:`mistral_kernels.ops.quant.QFORMATS`: GGUF blocks kept as the file stores them (uint8 [.., N, R], R =
K / QK · bytes per block; memory-mapped where possible) or INT8_ROWWISE (int8 [.., N, K] and fp32 scales
[.., N], made at load by :func:`quantize_int8`). :class:`FusedWeight` joins row groups of different formats
(a Q4_K_M file stores wq, wk in Q4_K and wv in Q6_K: the fused qkv is two groups, one qlinear each, outputs
concatenated). :func:`mistral_kernels.ops.linear` dispatches on both to ``ops.qlinear`` (this module holds
data only, so that ops can import it).

Shape letters: M rows (tokens), N out features, K in features, R packed row bytes, E experts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .ops.quant import INT8_ROWWISE, QFORMAT_BY_CODE, QFormat

__all__ = ["FusedWeight", "PackedWeight", "QuantizedWeight", "quantize_int8"]


@dataclass(frozen=True)
class QuantizedWeight:
    """A quantized matrix W [N, K] (``shape`` (N, K)) or expert stack [E, N, K] (``shape`` (E, N, K)).

    qweight : GGUF formats: uint8 [.., N, R]; INT8_ROWWISE: int8 [.., N, K]
    qtype : the format's code (:data:`~mistral_kernels.ops.quant.QFORMATS`)
    scales : INT8_ROWWISE only: fp32 [.., N], W[n, k] = qweight[n, k] · scales[n]
    """

    qweight: torch.Tensor
    qtype: int
    shape: tuple[int, ...]
    scales: torch.Tensor | None = None

    def __post_init__(self) -> None:
        f = self.format
        k = self.shape[-1]
        want = (*self.shape[:-1], k) if f.qtype == INT8_ROWWISE else (*self.shape[:-1], f.row_bytes(k))
        if k % f.block or tuple(self.qweight.shape) != want:
            raise ValueError(f"QuantizedWeight: {f.name} {list(self.shape)} needs qweight {list(want)} (K a "
                             f"multiple of {f.block}), got {list(self.qweight.shape)}")
        if (self.scales is None) != (f.qtype != INT8_ROWWISE):
            raise ValueError(f"QuantizedWeight: scales are required for INT8_ROWWISE and only for it ({f.name})")

    @property
    def format(self) -> QFormat:
        f = QFORMAT_BY_CODE.get(self.qtype)
        if f is None:
            raise ValueError(f"QuantizedWeight: qtype {self.qtype} has no native format")
        return f

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    @property
    def nbytes(self) -> int:
        """Packed bytes (blocks, plus the scales of INT8_ROWWISE)."""
        scales = 0 if self.scales is None else self.scales.numel() * self.scales.element_size()
        return self.qweight.numel() * self.qweight.element_size() + scales

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def to(self, device: torch.device | str) -> QuantizedWeight:
        """The same weight on ``device`` (self when it is there already)."""
        if self.qweight.device == torch.device(device):
            return self
        return QuantizedWeight(self.qweight.to(device), self.qtype, self.shape,
                               None if self.scales is None else self.scales.to(device))

    def __getitem__(self, e: int) -> QuantizedWeight:
        """Expert ``e`` of a stack [E, N, K] → [N, K] (a view, no copy)."""
        if len(self.shape) != 3:
            raise ValueError(f"QuantizedWeight: indexing needs an expert stack [E, N, K], got {list(self.shape)}")
        return QuantizedWeight(self.qweight[e], self.qtype, self.shape[1:],
                               None if self.scales is None else self.scales[e])

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The dense weight [.., N, K] in ``dtype`` (GGUF formats decoded by the ``gguf`` package)."""
        from .ops.reference import dequantize

        if len(self.shape) == 3:
            return torch.stack([self[e].dequantize(dtype) for e in range(self.shape[0])])
        return dequantize(self.qweight, self.qtype, self.scales).to(device=self.device, dtype=dtype)


@dataclass(frozen=True)
class FusedWeight:
    """Row groups [N_g, K] of different formats stacked along N = Σ N_g: one qlinear per group, the outputs
    concatenated (a fused projection whose parts the file stores in different formats)."""

    parts: tuple[QuantizedWeight, ...]

    @property
    def shape(self) -> tuple[int, int]:
        return (sum(p.shape[0] for p in self.parts), self.parts[0].shape[1])

    @property
    def device(self) -> torch.device:
        return self.parts[0].device

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def to(self, device: torch.device | str) -> FusedWeight:
        return FusedWeight(tuple(p.to(device) for p in self.parts))

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.cat([p.dequantize(dtype) for p in self.parts])


PackedWeight = QuantizedWeight | FusedWeight


def quantize_int8(w: torch.Tensor, chunk_rows: int = 4096) -> QuantizedWeight:
    """INT8_ROWWISE of a dense W [.., N, K]: per output row symmetric, scale = max|w| / 127 (fp32),
    q = round(w / scale) in [-127, 127]; an all-zero row gets scale 0 (and q = 0). Rows are converted in
    chunks of ``chunk_rows``, so the fp32 temporaries stay small whatever the weight."""
    k = w.shape[-1]
    rows = w.reshape(-1, k)
    q = torch.empty(rows.shape, dtype=torch.int8, device=w.device)
    scales = torch.empty(rows.shape[0], dtype=torch.float32, device=w.device)
    for a in range(0, rows.shape[0], chunk_rows):
        w32 = rows[a:a + chunk_rows].float()
        s = w32.abs().amax(dim=-1) / 127.0                                          # [chunk]
        scales[a:a + chunk_rows] = s
        q[a:a + chunk_rows] = torch.round(w32 / torch.where(s > 0, s, 1.0).unsqueeze(-1)).clamp_(-127, 127)
    return QuantizedWeight(q.view(w.shape), INT8_ROWWISE, tuple(w.shape), scales.view(w.shape[:-1]))


def packed_format_names(w: PackedWeight) -> list[str]:
    """The format names of a packed weight (one per group), for messages and ``info``."""
    parts = w.parts if isinstance(w, FusedWeight) else (w,)
    return [p.format.name for p in parts]
