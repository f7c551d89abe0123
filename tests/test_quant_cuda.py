"""The CUDA qlinear kernels (csrc/kernels/quant_gemv.cuh for M ≤ 8, quant_gemm.cuh above) under the SIMT
emulator, every schedule, against reference.qlinear (the gguf package's dequantization + an fp32 matmul).

Shape letters: M rows (tokens), K in features, N out features.

Tolerances, relative to the largest |output|: fp32 1e-5 (summation order only: the kernels decode the weights
bit-exactly, quant_blocks.h); bf16 8e-3 and fp16 1e-3 (two units in the last place at the largest output:
the output's rounding plus, on the tensor-core GEMM, the dequantized weight rounded once to x's dtype;
observed ≤ 3.5e-3 / 5e-4).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mistral_kernels.ops import reference
from mistral_kernels.quant_formats import INT8_ROWWISE, QFORMATS

from .conftest import Backend

EMU = ["emu-forward", "emu-reverse", "emu-random"]
BLOCK_FORMATS = ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
# byte offsets of the fp16 scale fields (d, dmin / m) inside a block
SCALE_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q8_0": [0], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}
REL_TOL = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}


def packed_weight(name: str, n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Random W [N, K] in format `name`: (qweight, scales). Q4_0 / Q4_1 / Q8_0 by gguf's own quantizer; K formats
    random bytes with small finite fp16 scale fields; INT8_ROWWISE random int8 with fp32 scales."""
    import gguf
    import gguf.quants

    rng = np.random.default_rng(seed)
    if name == "INT8_ROWWISE":
        q = torch.from_numpy(rng.integers(-128, 128, size=(n, k), dtype=np.int8))
        return q, torch.from_numpy(rng.uniform(0.001, 0.02, size=n).astype(np.float32))
    fmt = QFORMATS[name]
    qtype = gguf.GGMLQuantizationType(fmt.qtype)
    if name in ("Q4_0", "Q4_1", "Q8_0"):
        w = rng.standard_normal((n, k)).astype(np.float32) * 0.1
        return torch.from_numpy(np.ascontiguousarray(gguf.quants.quantize(w, qtype))), None
    blocks = n * k // fmt.block
    raw = rng.integers(0, 256, size=(blocks, fmt.bytes), dtype=np.uint8)
    for off in SCALE_FIELDS[name]:
        d = (rng.standard_normal(blocks) * (0.002 if name == "Q6_K" else 0.01)).astype(np.float16)
        raw[:, off:off + 2] = d.view(np.uint8).reshape(blocks, 2)
    return torch.from_numpy(raw.reshape(n, fmt.row_bytes(k))), None


def check(backend: Backend, name: str, dtype: torch.dtype, m: int, n: int, k: int, seed: int = 0) -> None:
    qweight, scales = packed_weight(name, n, k, seed)
    qtype = QFORMATS[name].qtype
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).to(dtype)
    got = backend.ops.qlinear(x, qweight, qtype, scales)
    want = reference.qlinear(x.float(), qweight, qtype, scales)
    assert got.dtype == dtype and got.shape == (m, n)
    scale = want.abs().max().item()
    torch.testing.assert_close(got.float(), want, rtol=0, atol=REL_TOL[dtype] * scale)


@pytest.mark.parametrize("backend", EMU, indirect=True)
@pytest.mark.parametrize("name", [*BLOCK_FORMATS, "INT8_ROWWISE"])
@pytest.mark.parametrize("m", [1, 3, 17, 40])
def test_every_format_matches_gguf(backend: Backend, name: str, m: int) -> None:
    # M 1, 3: the GEMV (MR 1, 4); 17, 40: the GEMM (one 64-row tile, rows past M zero-filled). N = 13: a tail
    # of the GEMV's 4-row blocks and of the GEMM's 64-column tile. K: two super-blocks (eight 32-blocks).
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        check(backend, name, dtype, m, 13, 512)


@pytest.mark.parametrize("backend", ["emu-random"], indirect=True)
@pytest.mark.parametrize(("name", "m", "n", "k"), [
    ("Q4_0", 2, 5, 32),          # one block: the GEMV's x chunk partial
    ("Q4_0", 9, 5, 32),          # one block: the GEMM's K tile is half empty
    ("Q8_0", 24, 70, 96),        # an odd number of 32-blocks, two N tiles of the GEMM
    ("Q4_1", 8, 9, 1280),        # GEMV MR 8, K over three x chunks (KC 512 at MR 8), the last partial
    ("Q6_K", 70, 66, 256),       # two M tiles and two N tiles
    ("INT8_ROWWISE", 5, 7, 37),  # K not a multiple of 8: partial unit, x rows unfit for 16-byte copies
    ("INT8_ROWWISE", 33, 7, 37),
])
def test_tails_and_chunks(backend: Backend, name: str, m: int, n: int, k: int) -> None:
    for dtype in (torch.bfloat16, torch.float32):
        check(backend, name, dtype, m, n, k, seed=m + n + k)


@pytest.mark.parametrize("backend", ["emu-forward"], indirect=True)
def test_misaligned_qweight_view_and_leading_dims(backend: Backend) -> None:
    qweight, _ = packed_weight("Q4_K", 6, 256)
    storage = torch.zeros(qweight.numel() + 2, dtype=torch.uint8)
    view = storage[2:].view(qweight.shape)  # 2-byte offset: the glue copies it for the 4-byte unit loads
    view.copy_(qweight)
    x = torch.randn(2, 3, 256).to(torch.bfloat16)
    got = backend.ops.qlinear(x, view, QFORMATS["Q4_K"].qtype)
    want = reference.qlinear(x.float(), qweight, QFORMATS["Q4_K"].qtype)
    assert got.shape == (2, 3, 6)
    torch.testing.assert_close(got.float(), want, rtol=0, atol=REL_TOL[torch.bfloat16] * want.abs().max().item())


@pytest.mark.parametrize("backend", ["emu-forward"], indirect=True)
def test_bad_inputs_raise(backend: Backend) -> None:
    q4k = QFORMATS["Q4_K"].qtype
    qweight, _ = packed_weight("Q4_K", 4, 256)
    x = torch.randn(1, 256)
    with pytest.raises(RuntimeError, match="qtype 7 has no native kernel"):
        backend.ops.qlinear(x, qweight, 7)
    with pytest.raises(RuntimeError, match="K = x.shape\\[1\\] = 128 must be a multiple of 256"):
        backend.ops.qlinear(torch.randn(1, 128), qweight, q4k)
    with pytest.raises(RuntimeError, match="qweight"):
        backend.ops.qlinear(x, qweight[:, :100].contiguous(), q4k)
    with pytest.raises(RuntimeError, match="scales must be None"):
        backend.ops.qlinear(x, qweight, q4k, torch.ones(4))
    with pytest.raises(RuntimeError, match="scales"):
        backend.ops.qlinear(x, torch.zeros(4, 256, dtype=torch.int8), INT8_ROWWISE)
    with pytest.raises(RuntimeError, match="x"):
        backend.ops.qlinear(x.to(torch.int32), qweight, q4k)
