"""Random quantized weights for the qlinear tests, in the layout csrc/kernels/quant_blocks.h describes.

Shape letters: N out features, K in features, R = K / QK · bytes per block (a packed row).

Q4_0, Q4_1, Q8_0: random floats quantized by the ``gguf`` package. The K formats (which ``gguf`` cannot
quantize): random bytes with their fp16 scale fields replaced by finite values (one subnormal among them, to
cover the fp16 decoding). INT8_ROWWISE: random int8 and fp32 scales.
"""

from __future__ import annotations

import numpy as np
import torch

from mistral_kernels.ops.quant import INT8_ROWWISE, QFORMATS, QFormat

# Byte offsets of the fp16 fields (d, dmin) inside one block of each GGUF format.
FP16_FIELDS: dict[str, tuple[int, ...]] = {
    "Q4_0": (0,), "Q4_1": (0, 2), "Q8_0": (0,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
}
GGUF_QUANTIZABLE = ("Q4_0", "Q4_1", "Q8_0")
FORMATS = tuple(QFORMATS)  # every format with native kernels


def random_qweight(
    name: str, n: int, k: int, seed: int, random_bytes: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(qweight, scales) of a random W [N, K] in format ``name``: uint8 [N, R] and None, or for
    INT8_ROWWISE int8 [N, K] and fp32 [N]. ``random_bytes``: random blocks for every GGUF format (fast at
    model sizes; benchmarks/bench_quant.py)."""
    import gguf
    import gguf.quants

    f: QFormat = QFORMATS[name]
    rng = np.random.default_rng(seed)
    if f.qtype == INT8_ROWWISE:
        q = rng.integers(-127, 128, size=(n, k), dtype=np.int8)
        scales = (rng.random(n, dtype=np.float32) * 0.02 + 1e-3).astype(np.float32)
        return torch.from_numpy(q), torch.from_numpy(scales)
    if name in GGUF_QUANTIZABLE and not random_bytes:
        w = rng.standard_normal((n, k)).astype(np.float32)
        packed = gguf.quants.quantize(w, gguf.GGMLQuantizationType(f.qtype))
        return torch.from_numpy(np.ascontiguousarray(packed, dtype=np.uint8)), None
    blocks = n * (k // f.block)
    raw = rng.integers(0, 256, size=(blocks, f.bytes), dtype=np.uint8)
    for off in FP16_FIELDS[name]:
        raw[:, off : off + 2] = (rng.standard_normal(blocks) * 0.01).astype(np.float16).view(np.uint8).reshape(-1, 2)
    raw[0, FP16_FIELDS[name][0] : FP16_FIELDS[name][0] + 2] = np.array([3], np.uint16).view(np.uint8)  # subnormal d
    return torch.from_numpy(raw.reshape(n, k // f.block * f.bytes)), None


# The CUDA GEMV's int8 activations (csrc/kernels/quant_q8x.cuh): x in blocks of 16 along K, each quantized with
# d = max|x| / 127; |x - x̂| ≤ d / 2 · (1 + 5e-5) per element.
Q8_BLOCK = 16
Q8_INT8_DTYPES = (torch.bfloat16, torch.float16)


def int8_activation_bound(x: torch.Tensor, w: torch.Tensor, block: int = Q8_BLOCK, slack: float = 1e-4) -> torch.Tensor:
    """[M, N] bound on |x̂ · Wᵀ - x · Wᵀ| for x [M, K] quantized to int8 per `block` elements along K (scale
    max|x| / 127, round to nearest) and W [N, K] (dequantized, fp32): Σ_k max|x of k's block| / 254 · |W[n, k]|,
    times 1 + slack for the rounding of the scale."""
    xf = x.float()
    m, k = xf.shape
    block_max = xf.abs().reshape(m, k // block, block).amax(-1)
    return (block_max.repeat_interleave(block, dim=1) / 254 * (1 + slack)) @ w.float().abs().T
