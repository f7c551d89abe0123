"""Packed (quantized) weights of a model: what a linear layer holds instead of a dense tensor, and their matmuls.

:class:`QuantizedWeight` is one matrix [N, K] (or a stack of experts [E, N, K]) in one format of
:data:`mistral_kernels.quant_formats.QFORMATS`: GGUF blocks kept as the file stores them (uint8 [.., N, R], R =
K / QK · bytes per block; memory-mapped where possible) or INT8_ROWWISE (int8 [.., N, K] and fp32 scales
[.., N], made at load by :func:`quantize_int8`). :class:`FusedWeight` joins row groups of different formats
(a Q4_K_M file stores wq, wk in Q4_K and wv in Q6_K: the fused qkv is two groups, one qlinear each, outputs
concatenated).

A packed weight owns its matmul: ``w.linear(x, kernels)`` (``kernels``: the op namespace, anything with
``qlinear``: ``ops``' quantized family, :mod:`mistral_kernels.emulated`, :mod:`mistral_kernels.reference`), an
expert stack its MoE block (``w1.fused_moe(kernels, ...)``, :mod:`mistral_kernels.packed_moe`); the fused CPU
decode step reads its row groups (``w.row_groups()``). The ops take a dense tensor or "a weight with these
methods" and never ask which packed type it is; this module is the only one that knows the types
(tests/test_weight_types.py). :func:`weight_bytes` counts the bytes of dense and packed weights alike.

Shape letters: M rows (tokens), N out features, K in features, R packed row bytes, E experts, T tokens,
H hidden.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from .activations import ACTIVATIONS
from .packed_moe import packed_moe
from .quant_formats import INT8_ROWWISE, QFORMAT_BY_CODE, QFormat, dequantize, weight_nbytes

__all__ = ["format_names", "FusedWeight", "has_packed_matrices", "PackedWeight", "quantize_int8", "quantize_x_for",
           "QuantizedWeight", "Weight", "weight_bytes", "with_quantized_activations"]


@dataclass(frozen=True)
class QuantizedWeight:
    """A quantized matrix W [N, K] (``shape`` (N, K)) or expert stack [E, N, K] (``shape`` (E, N, K)).

    qweight : GGUF formats: uint8 [.., N, R]; INT8_ROWWISE: int8 [.., N, K]
    qtype : the format's code (:data:`~mistral_kernels.quant_formats.QFORMATS`)
    scales : INT8_ROWWISE only: fp32 [.., N], W[n, k] = qweight[n, k] · scales[n]
    quantize_x : fp32 x is multiplied as bf16 x is — rounded to bf16, then int8 per block in the kernels that
        have an int8-activation path (llama.cpp's q8 activations; :func:`with_quantized_activations`); False:
        exact fp32 products. bf16 x takes those paths either way.
    """

    qweight: torch.Tensor
    qtype: int
    shape: tuple[int, ...]
    scales: torch.Tensor | None = None
    quantize_x: bool = False

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
        return weight_nbytes(self.shape, self.format)

    def data_ptr(self) -> int:
        """Address of the blocks (as ``Tensor.data_ptr``): two weights with the same one hold the same bytes."""
        return self.qweight.data_ptr()

    def row_groups(self) -> tuple[QuantizedWeight, ...]:
        """The row groups of one format each, in row order: this weight itself."""
        return (self,)

    def linear(self, x: torch.Tensor, kernels: Any, out: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ W.T``: x [..., K] → [..., N] by ``kernels.qlinear`` (fp32 accumulation, x's dtype)."""
        if len(self.shape) != 2:
            raise ValueError(f"linear: weight must be a matrix [N, K], got an expert stack {list(self.shape)}")
        if self.quantize_x and x.dtype == torch.float32:  # bf16 in; the bf16 product widened to fp32
            y = kernels.qlinear(x.to(torch.bfloat16), self.qweight, self.qtype, self.scales).to(torch.float32)
            return y if out is None else out.copy_(y)
        return kernels.qlinear(x, self.qweight, self.qtype, self.scales, out=out)

    def expert_linear(self, x: torch.Tensor, offsets: torch.Tensor, kernels: Any) -> torch.Tensor:
        """This expert stack W [E, N, K] on rows grouped by expert: x [M, K] → [M, N] (``kernels.moe_qgemm``)."""
        return kernels.moe_qgemm(x, offsets, self.qweight, self.qtype, self.scales)

    def expert_swiglu(self, up: QuantizedWeight, x: torch.Tensor, offsets: torch.Tensor, kernels: Any) -> torch.Tensor:
        """``silu(x·Wᵀ) * (x·Upᵀ)`` per expert segment, x [M, K] → [M, N]: one fused ``moe_qgemm`` when both
        stacks share a format, else two calls and ``silu_and_mul`` (the same roundings)."""
        if up.qtype == self.qtype:
            return kernels.moe_qgemm(x, offsets, self.qweight, self.qtype, self.scales, up.qweight, up.scales)
        gate_up = torch.cat([self.expert_linear(x, offsets, kernels), up.expert_linear(x, offsets, kernels)], dim=-1)
        return kernels.silu_and_mul(gate_up)                                       # [M, 2N] → [M, N]

    def fused_moe(self, kernels: Any, x: torch.Tensor, gate: torch.Tensor, w2: QuantizedWeight, w3: QuantizedWeight,
                  top_k: int, renormalize: bool = True) -> torch.Tensor:
        """Mixtral's MoE block with this stack as w1 [E, I, H] (x [T, H] → [T, H]; see
        :func:`~mistral_kernels.packed_moe.packed_moe`)."""
        return packed_moe(kernels, x, gate, self, w2, w3, top_k, renormalize)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def to(self, device: torch.device | str) -> QuantizedWeight:
        """The same weight on ``device`` (self when it is there already)."""
        if self.qweight.device == torch.device(device):
            return self
        return dataclasses.replace(self, qweight=self.qweight.to(device),
                                   scales=None if self.scales is None else self.scales.to(device))

    def __getitem__(self, e: int) -> QuantizedWeight:
        """Expert ``e`` of a stack [E, N, K] → [N, K] (a view, no copy)."""
        if len(self.shape) != 3:
            raise ValueError(f"QuantizedWeight: indexing needs an expert stack [E, N, K], got {list(self.shape)}")
        return dataclasses.replace(self, qweight=self.qweight[e], shape=self.shape[1:],
                                   scales=None if self.scales is None else self.scales[e])

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The dense weight [.., N, K] in ``dtype`` (GGUF formats decoded by the ``gguf`` package)."""
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

    def data_ptr(self) -> int:
        return self.parts[0].data_ptr()

    def row_groups(self) -> tuple[QuantizedWeight, ...]:
        """The row groups of one format each, in row order."""
        return self.parts

    def linear(self, x: torch.Tensor, kernels: Any, out: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ W.T``: one ``qlinear`` per row group, the outputs concatenated ([..., K] → [..., N])."""
        y = torch.cat([p.linear(x, kernels) for p in self.parts], dim=-1)
        return y if out is None else out.copy_(y)

    def to(self, device: torch.device | str) -> FusedWeight:
        return FusedWeight(tuple(p.to(device) for p in self.parts))

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.cat([p.dequantize(dtype) for p in self.parts])


PackedWeight = QuantizedWeight | FusedWeight
Weight = torch.Tensor | PackedWeight  # what a model's matmul multiplies by


def weight_bytes(weights: Iterable[Weight]) -> int:
    """Bytes held by these weights, each storage once (a tied head that is the embedding counts once): a dense
    tensor's elements × element size, a packed weight's blocks (+ INT8_ROWWISE scales); the rule of
    :func:`mistral_kernels.quant_formats.weight_nbytes`."""
    seen: set[int] = set()
    total = 0
    for w in weights:
        ptr = w.data_ptr()
        if ptr not in seen:
            nbytes = weight_nbytes(w.shape, w.dtype) if isinstance(w, torch.Tensor) else w.nbytes
            seen.add(ptr)
            total += nbytes
    return total


def format_names(w: Weight) -> list[str]:
    """The packed format names of a weight (one per row group); [] for a dense tensor."""
    return [] if isinstance(w, torch.Tensor) else [p.format.name for p in w.row_groups()]


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


def quantize_x_for(activations: str, dtype: torch.dtype) -> bool:
    """Whether packed matrices get ``quantize_x`` (:func:`with_quantized_activations`), from the activations
    choice and the model's activation dtype: ``auto`` — yes for fp32 activations (llama.cpp's default: 8-bit
    activations in every quantized matmul, the residual stream and attention in full precision), ``int8`` —
    yes for fp32 / bf16 activations, ``exact`` — no: fp32 products of the exactly decoded weights, which needs fp32
    activations (bf16 / fp16 x take the int8 paths where a kernel has them). fp16 activations take neither
    choice explicitly: their path is the device's (CUDA's GEMV quantizes them, the CPU multiplies exactly)."""
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations must be one of {list(ACTIVATIONS)}, got {activations!r}")
    if activations == "int8" and dtype == torch.float16:
        raise ValueError("activations='int8' needs fp32 or bf16 activations, got torch.float16 (its quantized "
                         "matmuls follow the device: int8 on CUDA, exact on the CPU); use activations='auto'")
    if activations == "exact" and dtype != torch.float32:
        raise ValueError(f"activations='exact' needs fp32 activations (dtype float32), got {dtype}; "
                         "use --dtype float32 or activations='auto'")
    return activations == "int8" or (activations == "auto" and dtype == torch.float32)


def has_packed_matrices(weights: dict[str, Any]) -> bool:
    """Whether any weight is a packed matrix [N, K] (a 2-D :class:`QuantizedWeight` or a :class:`FusedWeight`):
    what ``quantize_x`` (:func:`with_quantized_activations`) applies to."""
    return any((isinstance(w, QuantizedWeight) and len(w.shape) == 2) or isinstance(w, FusedWeight)
               for w in weights.values())


def with_quantized_activations(weights: dict[str, Any]) -> dict[str, Any]:
    """The same weights with every packed matrix [N, K] (a :class:`QuantizedWeight` or the parts of a
    :class:`FusedWeight`) set to ``quantize_x``: fp32 activations enter its products as bf16, quantized to int8
    per block where the kernel has that path — what llama.cpp does in every quantized matmul, and what bf16
    activations get anyway. Expert stacks and dense tensors are returned as they are (MoE experts keep exact
    fp32 products)."""
    def flagged(w: Any) -> Any:
        if isinstance(w, QuantizedWeight) and len(w.shape) == 2:
            return dataclasses.replace(w, quantize_x=True)
        if isinstance(w, FusedWeight):
            return FusedWeight(tuple(dataclasses.replace(p, quantize_x=True) for p in w.parts))
        return w
    return {name: flagged(w) for name, w in weights.items()}
