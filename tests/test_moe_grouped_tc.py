"""The tensor-core grouped GEMM of the expert projections (csrc/kernels/grouped_gemm_tc.cuh) through moe_expert_ffn
and fused_moe, against reference.py, under the SIMT emulator's three schedules (and on cpu / cuda where they run the
dtype): every tile (decode / medium / prefill, picked from the expected rows per expert M / G), gated (w1 | w3 with
the SwiGLU epilogue) and plain (w2), fp16 and bf16, empty experts, one row per expert, partial M / N / K tiles.
A second group of tests reads the emulator's launch records (MK_SIMT_STATS) to pin which kernel runs.

Shape letters: T tokens, H hidden, I intermediate, E experts, k top-k, M = T·k permuted rows, G weight groups.
Shapes stay tiny: H = 136 and I = 72 are multiples of 8 but not of any tile's K (32, 64) or N (32, 64, 128).
"""

from __future__ import annotations

import functools

import pytest
import torch

import mistral_kernels
from mistral_kernels import reference as ref

from .conftest import Backend, _make_backend, assert_close

TC_DTYPES = [torch.float16, torch.bfloat16]
H, I = 136, 72


@pytest.fixture(params=["emu-forward", "emu-reverse", "emu-random", "cuda"])
def tc_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Backend:
    """The backends that run the CUDA kernels (the cpu backend's MoE: test_moe*.py)."""
    return _make_backend(request.param, monkeypatch)


def _weights(G: int, h: int, i: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    w1 = torch.randn(G, i, h, generator=g) / h**0.5
    w3 = torch.randn(G, i, h, generator=g) / h**0.5
    w2 = torch.randn(G, h, i, generator=g) / i**0.5
    return tuple(w.to(dtype) for w in (w1, w2, w3))


def _routed_offsets(T: int, E: int, k: int, seed: int) -> torch.Tensor:
    """int64 [E+1]: the segment bounds of T tokens routed to k distinct experts each (a router's output)."""
    ids = torch.rand(T, E, generator=torch.Generator().manual_seed(seed)).topk(k, dim=-1).indices
    return torch.cat([torch.zeros(1, dtype=torch.long), torch.bincount(ids.flatten(), minlength=E).cumsum(0)])


@functools.lru_cache(maxsize=None)
def _case(offsets: tuple[int, ...], dtype: torch.dtype, h: int, i: int, seed: int) -> tuple[torch.Tensor, ...]:
    """Inputs and reference.py's result, computed once for every backend."""
    off = torch.tensor(offsets)
    x = torch.randn(offsets[-1], h, generator=torch.Generator().manual_seed(seed + 1)).to(dtype)
    w1, w2, w3 = _weights(len(offsets) - 1, h, i, dtype, seed)
    return off, x, w1, w2, w3, ref.moe_expert_ffn(x, off, w1, w2, w3)


def _check_ffn(backend: Backend, offsets: torch.Tensor, dtype: torch.dtype, h: int, i: int, seed: int) -> None:
    off, x, w1, w2, w3, expect = _case(tuple(offsets.tolist()), dtype, h, i, seed)
    dev = backend.device
    got = backend.ops.moe_expert_ffn(*(t.to(dev) for t in (x, off, w1, w2, w3)))
    assert_close(got, expect)


# M / G = T·k / E: T 1, 7 → decode tile; (300, 64, 6) → 28 rows: medium; (300, 8, 2) → 75 rows: prefill.
# E = 64 runs H = 40, I = 24 (one partial K / N tile; 93 blocks of 128 threads at T = 300 keep the emulator fast).
@pytest.mark.parametrize("T", [1, 7, 300])
@pytest.mark.parametrize("E,k,h,i", [(8, 2, H, I), (64, 6, 40, 24)])
@pytest.mark.parametrize("dtype", TC_DTYPES)
def test_routed_segments(tc_backend: Backend, T: int, E: int, k: int, h: int, i: int, dtype: torch.dtype) -> None:
    """Router-shaped segments (E = 64 with T ≤ 7 leaves most experts empty)."""
    _check_ffn(tc_backend, _routed_offsets(T, E, k, seed=T + E), dtype, h, i, seed=T * E)


@pytest.mark.parametrize("offsets", [
    [0, 1, 2, 3, 4, 5],             # one row per expert (decode tile)
    [0, 0, 3, 3, 3, 20, 20],        # empty experts around a 17-row segment (two 16-row M-tiles)
    [0, 0, 0],                      # no rows at all
    [0, 130, 130, 259],             # 129-row segments: 128-row prefill tiles plus a 1-row / 2-row rest
])
@pytest.mark.parametrize("dtype", TC_DTYPES)
def test_segment_edges(tc_backend: Backend, offsets: list[int], dtype: torch.dtype) -> None:
    _check_ffn(tc_backend, torch.tensor(offsets), dtype, H, I, seed=len(offsets))


def test_unaligned_sizes_fall_back(tc_backend: Backend) -> None:
    """H = 36 (not a multiple of 8: no 16-byte chunks) runs the SIMT grouped GEMM, same results."""
    _check_ffn(tc_backend, torch.tensor([0, 3, 9]), torch.bfloat16, 36, 24, seed=3)


@functools.lru_cache(maxsize=None)
def _fused_case(T: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    E, h, i = 8, 40, 24
    g = torch.Generator().manual_seed(T)
    gate = (torch.randn(E, h, generator=g) / h**0.5).to(dtype)
    w1, w2, w3 = _weights(E, h, i, dtype, seed=T + 1)
    x = torch.randn(T, h, generator=g).to(dtype)
    return x, gate, w1, w2, w3, ref.fused_moe(x, gate, w1, w2, w3, top_k=2)


# decode and prefill tiles (E 8, k 2); reference.py's per-token fp16 loop is slow on CPU, so T = 300 runs bf16 only
# (moe_expert_ffn runs the prefill tile in fp16 above).
@pytest.mark.parametrize("T,dtype", [(1, torch.float16), (7, torch.float16), (1, torch.bfloat16), (300, torch.bfloat16)])
def test_fused_moe(tc_backend: Backend, T: int, dtype: torch.dtype) -> None:
    *args, expect = _fused_case(T, dtype)
    out = tc_backend.ops.fused_moe(*(t.to(tc_backend.device) for t in args), top_k=2)
    assert_close(out, expect)


# ---- which kernel runs (the emulator's launch records) -------------------------------------------------------


@pytest.fixture
def emulated(monkeypatch: pytest.MonkeyPatch):
    if not mistral_kernels.emulator_compiled():
        pytest.skip("emulated kernels not built (MK_EMU=OFF); .ci/run requires them")
    from mistral_kernels import emulated

    monkeypatch.setenv("MK_SIMT_STATS", "1")
    monkeypatch.setenv("MK_SIMT_SCHEDULE", "forward")
    emulated.simt_stats(reset=True)
    return emulated


TILES = {"decode": "GemmTcTile<16, 64, 64, 1, 4, 4, 3>", "medium": "GemmTcTile<64, 128, 32, 2, 2, 3, 3>",
         "prefill": "GemmTcTile<128, 128, 32, 2, 4, 3, 2>"}


@pytest.mark.parametrize("T,E,k,tile", [(1, 8, 2, "decode"), (64, 8, 2, "decode"), (65, 8, 2, "medium"),
                                        (300, 64, 6, "medium"), (300, 8, 2, "prefill")])
def test_tile_follows_rows_per_expert(emulated, T: int, E: int, k: int, tile: str) -> None:
    """The tile comes from T·k / E (≤ 16 decode, ≤ 64 medium, else prefill), not from T; no h13, no silu_and_mul."""
    offsets = _routed_offsets(T, E, k, seed=1)
    M = int(offsets[-1])
    x = torch.randn(M, 40, dtype=torch.bfloat16)
    w1, w2, w3 = _weights(E, 40, 24, torch.bfloat16, seed=2)
    emulated.moe_expert_ffn(x, offsets, w1, w2, w3)
    names = [s.kernel for s in emulated.simt_stats()]
    gemms = [n for n in names if "gemm" in n]
    assert len(gemms) == 2, names
    assert "grouped_gemm_tc_kernel" in gemms[0] and TILES[tile] in gemms[0] and "true>" in gemms[0], gemms
    assert "grouped_gemm_tc_kernel" in gemms[1] and TILES[tile] in gemms[1] and "false>" in gemms[1], gemms
    assert not any("silu_and_mul" in n for n in names), names


def test_decode_grid_has_no_idle_blocks(emulated) -> None:
    """T = 1, k = 2 of E = 8: floor(M / BM) + min(G, M) = 2 slots per N-tile, both with a segment."""
    offsets = _routed_offsets(1, 8, 2, seed=9)
    w1, w2, w3 = _weights(8, 40, 24, torch.float16, seed=9)
    emulated.moe_expert_ffn(torch.randn(2, 40, dtype=torch.float16), offsets, w1, w2, w3)
    launches = [s for s in emulated.simt_stats() if "grouped_gemm_tc_kernel" in s.kernel]
    assert len(launches) == 2 and all(s.grid[0] == 2 and s.empty_blocks == 0 for s in launches), launches


def test_expert_parallel_rows_count_every_bucket(emulated) -> None:
    """moe_expert_ffn with G = 2 local experts of 8 buckets (expert parallelism): 130 rows / 8 = 17 per expert →
    the medium tile (130 / G = 65 would pick prefill); the other ranks' rows stay 0."""
    offsets = _routed_offsets(65, 8, 2, seed=7)
    x = torch.randn(int(offsets[-1]), 40, dtype=torch.bfloat16)
    w1, w2, w3 = _weights(2, 40, 24, torch.bfloat16, seed=8)
    got = emulated.moe_expert_ffn(x, offsets, w1, w2, w3)
    gemms = [s.kernel for s in emulated.simt_stats() if "gemm" in s.kernel]
    assert len(gemms) == 2 and all(TILES["medium"] in n for n in gemms), gemms
    assert_close(got, ref.moe_expert_ffn(x, offsets, w1, w2, w3))


def test_fp32_keeps_the_simt_gemm(emulated) -> None:
    x = torch.randn(7, 40)
    w1, w2, w3 = _weights(2, 40, 24, torch.float32, seed=4)
    emulated.moe_expert_ffn(x, torch.tensor([0, 3, 7]), w1, w2, w3)
    gemms = [s.kernel for s in emulated.simt_stats() if "gemm" in s.kernel]
    assert len(gemms) == 3 and all("grouped_gemm_nt_kernel" in n for n in gemms), gemms


@pytest.mark.parametrize("T,E,k", [(7, 8, 2), (300, 8, 2)])
def test_shared_and_global_access(emulated, T: int, E: int, k: int) -> None:
    """The header's claims: ldmatrix phases conflict-free; cp.async moves whole 16-byte chunks of rows."""
    offsets = _routed_offsets(T, E, k, seed=5)
    x = torch.randn(int(offsets[-1]), 128, dtype=torch.float16)  # rows of whole 32-byte sectors
    w1, w2, w3 = _weights(E, 128, 96, torch.float16, seed=6)
    emulated.moe_expert_ffn(x, offsets, w1, w2, w3)
    launches = [s for s in emulated.simt_stats() if "grouped_gemm_tc_kernel" in s.kernel]
    assert len(launches) == 2
    for launch in launches:
        ldmatrix = [s for s in launch.sites if s.space == "shared" and s.op == "load"]
        assert ldmatrix and all(s.max_degree == 1 for s in ldmatrix), (launch.kernel, ldmatrix)
        cp_async = [s for s in launch.sites if s.space == "global" and s.op == "load"]
        assert cp_async and all(s.efficiency >= 0.99 for s in cp_async), (launch.kernel, cp_async)
