"""The CUDA qlinear kernels (csrc/kernels/quant_gemv.cuh for M ≤ 8, quant_gemm.cuh above) under the SIMT
emulator, every schedule, and on a real GPU (the ``cuda`` backend: skipped without one), against
reference.qlinear (the gguf package's dequantization + an fp32 matmul); ``ops.linear`` on packed weights
(QuantizedWeight / FusedWeight, the model's path) on a GPU too.

Shape letters: M rows (tokens), K in features, N out features.

Tolerances, relative to the largest |output|: fp32 1e-5 (summation order only: the kernels decode the weights
bit-exactly, quant_blocks.h); bf16 8e-3 and fp16 1e-3 (two units in the last place at the largest output:
the output's rounding plus, on the tensor-core GEMM, the dequantized weight rounded once to x's dtype;
observed ≤ 3.5e-3 / 5e-4). The GEMV with fp16 / bf16 x quantizes x to int8 (blocks of 16, quant_q8x.cuh): its
outputs may further differ by the elementwise bound quant_data.int8_activation_bound (Σ_k d_k / 2 · |W[n, k]|),
computed here from the gguf dequantization and x, plus one rounding of that term.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mistral_kernels.ops import reference
from mistral_kernels.quant_formats import INT8_ROWWISE, QFORMATS

from .conftest import Backend
from .helpers.quant_data import Q8_INT8_DTYPES, int8_activation_bound

gguf = pytest.importorskip("gguf", reason="the gguf package is not installed (the test extra: pip install gguf)")

EMU = ["emu-forward", "emu-reverse", "emu-random"]
KERNELS = [*EMU, "cuda"]  # every backend that runs the CUDA kernels
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
    dev = backend.device
    got = backend.ops.qlinear(x.to(dev), qweight.to(dev), qtype, None if scales is None else scales.to(dev)).cpu()
    want = reference.qlinear(x.float(), qweight, qtype, scales)
    assert got.dtype == dtype and got.shape == (m, n)
    tol = torch.full_like(want, REL_TOL[dtype] * want.abs().max().item())
    if int8_activations(name, dtype, m):
        tol = tol + int8_activation_bound(x, reference.dequantize(qweight, qtype, scales)) * (1 + REL_TOL[dtype])
    err = (got.float() - want).abs()
    worst = int((err - tol).flatten().argmax())
    assert bool((err <= tol).all()), (f"{name} {dtype} M={m}: |out - ref| = {err.flatten()[worst].item():.3e} exceeds "
                                      f"{tol.flatten()[worst].item():.3e} at flat index {worst}")


def int8_activations(name: str, dtype: torch.dtype, m: int) -> bool:
    """True where qlinear runs the int8-activation GEMV: M ≤ 8, fp16 / bf16 x, a GGUF block format."""
    return m <= 8 and dtype in Q8_INT8_DTYPES and name != "INT8_ROWWISE"


@pytest.mark.parametrize("backend", KERNELS, indirect=True)
@pytest.mark.parametrize("name", [*BLOCK_FORMATS, "INT8_ROWWISE"])
@pytest.mark.parametrize("m", [1, 3, 17, 40, 72])
def test_every_format_matches_gguf(backend: Backend, name: str, m: int) -> None:
    # M 1, 3: the GEMV (MR 1, 4); 17, 40: the GEMM (one 64-row tile, rows past M zero-filled); 72: above
    # kQGemmDequantRows, W dequantized once + the dense GEMM. N = 13: a tail of the GEMV's 4-row blocks and of
    # the GEMM's 64-column tile. K: two super-blocks (eight 32-blocks).
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        check(backend, name, dtype, m, 13, 512)


@pytest.mark.parametrize("backend", ["emu-random", "cuda"], indirect=True)
@pytest.mark.parametrize(("name", "m", "n", "k"), [
    ("Q4_0", 2, 5, 32),          # one block: the GEMV's x chunk partial
    ("Q4_0", 9, 5, 32),          # one block: the GEMM's K tile is half empty
    ("Q8_0", 24, 70, 96),        # an odd number of 32-blocks, two N tiles of the GEMM
    ("Q4_1", 8, 9, 1280),        # GEMV MR 8, K over three x chunks (KC 512 at MR 8), the last partial
    ("Q6_K", 70, 66, 256),       # two M tiles and two N tiles
    ("INT8_ROWWISE", 5, 7, 37),  # K not a multiple of 8: partial unit, x rows unfit for 16-byte copies
    ("INT8_ROWWISE", 33, 7, 37),
    ("INT8_ROWWISE", 70, 7, 37),  # dequantized once: the partial last unit of each row written elementwise
    ("Q4_K", 8, 9, 2304),         # GEMV MR 8 over nine super-blocks: lanes of the last warp iteration idle
])
def test_tails_and_chunks(backend: Backend, name: str, m: int, n: int, k: int) -> None:
    for dtype in (torch.bfloat16, torch.float32):
        check(backend, name, dtype, m, n, k, seed=m + n + k)


# The tile GEMM's split-K plan (qgemm_plan, quant_gemm.cuh) on the emulator's 132 SMs: these shapes are one
# or two output tiles, so K is cut into ranges of tps = 3 K tiles of 64 (the plan's minimum), the last one
# shorter; each split's fp32 sums go to a workspace the reduce kernel adds in split order.
@pytest.mark.parametrize("backend", EMU, indirect=True)
@pytest.mark.parametrize(("name", "m", "n", "k"), [
    ("Q8_0", 17, 13, 416),         # KT 7 (the last tile half past K): splits of 3, 3, 1 tiles
    ("Q4_0", 33, 65, 352),         # KT 6 (last tile half): 3, 3; two N tiles, the second 1 column
    ("Q4_1", 24, 9, 480),          # KT 8 (7.5): 3, 3, 2
    ("Q4_K", 40, 70, 512),         # KT 8: 3, 3, 2; two N tiles
    ("Q5_K", 64, 3, 768),          # KT 12: four splits of 3; a full 64-row M tile
    ("Q6_K", 9, 5, 1280),          # KT 20: six splits of 3 and one of 2
    ("INT8_ROWWISE", 20, 7, 400),  # KT 7 (K not a multiple of 8: the partial unit in the last split)
])
def test_split_k_uneven_ranges(backend: Backend, name: str, m: int, n: int, k: int) -> None:
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        check(backend, name, dtype, m, n, k, seed=m + n + k)


@pytest.mark.parametrize("backend", ["emu-random"], indirect=True)
def test_split_k_is_deterministic(backend: Backend) -> None:
    # The partial sums are added in split order (no atomics): two calls under different random schedules give
    # the same bits.
    qweight, _ = packed_weight("Q4_K", 13, 1024, seed=5)
    x = torch.randn(20, 1024, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    first = backend.ops.qlinear(x, qweight, QFORMATS["Q4_K"].qtype)
    second = backend.ops.qlinear(x, qweight, QFORMATS["Q4_K"].qtype)
    assert torch.equal(first, second)


@pytest.mark.parametrize("backend", ["emu-forward", "cuda"], indirect=True)
def test_gemm_x_view_off_16_bytes(backend: Backend) -> None:
    # The tile GEMM copies x in 16-byte vectors: a view 2 bytes into its storage is copied by the glue.
    qweight, _ = packed_weight("Q8_0", 11, 384, seed=6)
    x = torch.randn(12, 384, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    storage = torch.zeros(x.numel() + 1, dtype=torch.bfloat16, device=backend.device)
    view = storage[1:].view(x.shape)
    view.copy_(x.to(backend.device))
    got = backend.ops.qlinear(view, qweight.to(backend.device), QFORMATS["Q8_0"].qtype).cpu()
    want = reference.qlinear(x.float(), qweight, QFORMATS["Q8_0"].qtype)
    torch.testing.assert_close(got.float(), want, rtol=0, atol=REL_TOL[torch.bfloat16] * want.abs().max().item())


@pytest.mark.parametrize("backend", ["emu-forward", "cuda"], indirect=True)
def test_misaligned_qweight_view_and_leading_dims(backend: Backend) -> None:
    qweight, _ = packed_weight("Q4_K", 6, 256)
    storage = torch.zeros(qweight.numel() + 2, dtype=torch.uint8, device=backend.device)
    view = storage[2:].view(qweight.shape)  # 2-byte offset: the glue copies it for the 4-byte unit loads
    view.copy_(qweight)
    x = torch.randn(2, 3, 256).to(torch.bfloat16)
    got = backend.ops.qlinear(x.to(backend.device), view, QFORMATS["Q4_K"].qtype).cpu()
    want = reference.qlinear(x.float(), qweight, QFORMATS["Q4_K"].qtype)
    assert got.shape == (2, 3, 6)
    torch.testing.assert_close(got.float(), want, rtol=0, atol=REL_TOL[torch.bfloat16] * want.abs().max().item())


@pytest.mark.parametrize("backend", ["emu-forward", "cuda"], indirect=True)
def test_bad_inputs_raise(backend: Backend) -> None:
    q4k = QFORMATS["Q4_K"].qtype
    dev = backend.device
    qweight, _ = packed_weight("Q4_K", 4, 256)
    qweight = qweight.to(dev)
    x = torch.randn(1, 256, device=dev)
    with pytest.raises(RuntimeError, match="qtype 7 has no native kernel"):
        backend.ops.qlinear(x, qweight, 7)
    with pytest.raises(RuntimeError, match="K = x.shape\\[1\\] = 128 must be a multiple of 256"):
        backend.ops.qlinear(torch.randn(1, 128, device=dev), qweight, q4k)
    with pytest.raises(RuntimeError, match="qweight"):
        backend.ops.qlinear(x, qweight[:, :100].contiguous(), q4k)
    with pytest.raises(RuntimeError, match="scales must be None"):
        backend.ops.qlinear(x, qweight, q4k, torch.ones(4, device=dev))
    with pytest.raises(RuntimeError, match="scales"):
        backend.ops.qlinear(x, torch.zeros(4, 256, dtype=torch.int8, device=dev), INT8_ROWWISE)
    with pytest.raises(RuntimeError, match="x"):
        backend.ops.qlinear(x.to(torch.int32), qweight, q4k)


@pytest.mark.parametrize("backend", ["cuda"], indirect=True)
@pytest.mark.parametrize("m", [1, 5, 40])
def test_ops_linear_on_packed_weights(backend: Backend, m: int) -> None:
    """The model's path: ops.linear on a QuantizedWeight and on a FusedWeight of two formats (a Q4_K_M qkv: Q4_K
    rows then Q6_K rows) dispatches to qlinear on the device, outputs concatenated, against the reference."""
    from mistral_kernels import ops
    from mistral_kernels.quant_weight import FusedWeight, QuantizedWeight

    dev = backend.device
    q4, _ = packed_weight("Q4_K", 24, 512, seed=1)
    q6, _ = packed_weight("Q6_K", 8, 512, seed=2)
    parts = (QuantizedWeight(q4.to(dev), QFORMATS["Q4_K"].qtype, (24, 512)),
             QuantizedWeight(q6.to(dev), QFORMATS["Q6_K"].qtype, (8, 512)))
    x = torch.randn(m, 512, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
    want = torch.cat([reference.qlinear(x.float(), q4, QFORMATS["Q4_K"].qtype),
                      reference.qlinear(x.float(), q6, QFORMATS["Q6_K"].qtype)], dim=-1)
    # Up to 8 rows the device GEMV quantizes x to int8 per 16 (quant_gemv.cuh): its bound on top of rounding.
    w = torch.cat([reference.dequantize(q4, QFORMATS["Q4_K"].qtype), reference.dequantize(q6, QFORMATS["Q6_K"].qtype)])
    act = int8_activation_bound(x, w) * (1 + REL_TOL[torch.bfloat16])
    tol = REL_TOL[torch.bfloat16] * want.abs().max().item() + act
    single = ops.linear(x.to(dev), parts[0])
    assert single.device.type == "cuda" and single.shape == (m, 24)
    assert bool(((single.cpu().float() - want[:, :24]).abs() <= tol[:, :24]).all())
    fused = ops.linear(x.to(dev), FusedWeight(parts))
    assert fused.shape == (m, 32)
    assert bool(((fused.cpu().float() - want).abs() <= tol).all())


@pytest.mark.parametrize("backend", ["emu-random"], indirect=True)
def test_gemv_q4k_view_off_16_bytes_runs_the_exact_kernel(backend: Backend) -> None:
    # Q4_K's int8 path reads 16-byte vectors; a view 4 bytes into its storage keeps the exact fp32-product GEMV.
    qweight, _ = packed_weight("Q4_K", 5, 512, seed=3)
    storage = torch.zeros(qweight.numel() + 4, dtype=torch.uint8)
    view = storage[4:].view(qweight.shape)
    view.copy_(qweight)
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(3)).to(torch.float16)
    got = backend.ops.qlinear(x, view, QFORMATS["Q4_K"].qtype)
    want = reference.qlinear(x.float(), qweight, QFORMATS["Q4_K"].qtype)
    torch.testing.assert_close(got.float(), want, rtol=0, atol=REL_TOL[torch.float16] * want.abs().max().item())


@pytest.mark.parametrize("backend", ["emu-forward"], indirect=True)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_gemv_int8_path_non_finite_x_gives_nan_row(backend: Backend, bad: float) -> None:
    # A non-finite x makes its 16-block's scale NaN: that row's outputs are NaN, the other rows unaffected.
    qweight, _ = packed_weight("Q6_K", 6, 256, seed=4)
    x = torch.randn(2, 256, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    x[1, 37] = bad
    got = backend.ops.qlinear(x, qweight, QFORMATS["Q6_K"].qtype)
    assert bool(got[1].isnan().all()) and bool(got[0].isfinite().all())
    want = reference.qlinear(x[:1].float(), qweight, QFORMATS["Q6_K"].qtype)
    tol = REL_TOL[torch.bfloat16] * want.abs().max().item() + int8_activation_bound(x[:1], reference.dequantize(
        qweight, QFORMATS["Q6_K"].qtype)) * (1 + REL_TOL[torch.bfloat16])
    assert bool(((got[:1].float() - want).abs() <= tol).all())
