"""MK_SIMT_STATS=1 and mistral_kernels.emulated.simt_stats(): per-launch grid waste (blocks that exit without a
barrier, a warp collective or a global store) and the module's store / ldmatrix / cp.async counters, on real
ops under the emulator. The prefill grid bound is the issue's: multi-sequence batches must not launch mostly
empty blocks.

Shape letters: T tokens, H hidden, Tq packed queries, B sequences, Hq / Hkv heads, D head_dim, S block_size.
"""

from __future__ import annotations

import pytest
import torch

import mistral_kernels

pytestmark = pytest.mark.skipif(not mistral_kernels.emulator_compiled(), reason="emulated kernels not built")


@pytest.fixture
def emulated(monkeypatch: pytest.MonkeyPatch):
    from mistral_kernels import emulated

    monkeypatch.setenv("MK_SIMT_STATS", "1")
    monkeypatch.setenv("MK_SIMT_SCHEDULE", "forward")
    emulated.simt_stats(reset=True)
    return emulated


def test_rms_norm_blocks_all_work_and_stores_coalesce(emulated) -> None:
    T, H = 6, 256
    emulated.rms_norm(torch.randn(T, H), torch.randn(H))
    (launch,) = emulated.simt_stats()
    assert "rms_norm_kernel" in launch.kernel and launch.blocks == T and launch.empty_blocks == 0
    stores = [s for s in launch.sites if s.space == "global" and s.op == "store"]
    assert stores and all(s.efficiency == 1.0 for s in stores), stores
    assert emulated.simt_stats() == []  # reset by the previous call


def test_stats_off_records_nothing(emulated, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MK_SIMT_STATS", "0")
    emulated.rms_norm(torch.randn(2, 64), torch.randn(64))
    assert emulated.simt_stats() == []


def test_prefill_tc_counters(emulated) -> None:
    from .helpers.attention import _check_prefill

    _check_prefill(emulated, "cpu", [40, 9], [24, 9], 2, 1, 128, 16, torch.float16, None, seed=1)
    (launch,) = [s for s in emulated.simt_stats() if "paged_prefill_tc_kernel" in s.kernel]
    ldmatrix = [s for s in launch.sites if s.space == "shared" and s.op == "load"]
    assert ldmatrix and all(s.max_degree == 1 for s in ldmatrix), ldmatrix  # conflict-free (header's claim)
    cp_async = [s for s in launch.sites if s.space == "global" and s.op == "load"]
    assert cp_async and all(s.efficiency >= 0.99 for s in cp_async), cp_async  # whole 16-byte chunks of rows


def _prefill_launch(emulated, seq_lens: list[int], q_lens: list[int], dtype: torch.dtype):
    from .helpers.attention import _check_prefill

    # Hq 2, Hkv 2 (G = 1), D 64, S 16; the result is checked against the reference by _check_prefill.
    _check_prefill(emulated, "cpu", seq_lens, q_lens, 2, 2, 64, 16, dtype, None, seed=2)
    (launch,) = [s for s in emulated.simt_stats() if "paged_prefill" in s.kernel]
    print(f"{launch.kernel}: grid {launch.grid}, {launch.empty_blocks} of {launch.blocks} blocks empty")
    return launch


# The work list (csrc/kernels/attention_plan.h): one item per (sequence, 64-row q tile) that exists, grid
# ceil(Tq·G/64) × Hkv blocks (never more than the items), so no block is empty.
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_prefill_grid_has_no_empty_block(emulated, dtype: torch.dtype) -> None:
    # One long prompt batched with seven single-token chunks (decode-like rows in a prefill batch): 11 tiles
    # run by 5 blocks per kv head (the old per-sequence grid left 72.5 % of its blocks empty).
    launch = _prefill_launch(emulated, [300, 5, 9, 12, 3, 7, 20, 4], [256, 1, 1, 1, 1, 1, 1, 1], dtype)
    assert launch.empty_blocks == 0 and launch.blocks == 5 * 2


def test_prefill_64_sequences_launch_one_block_per_tile(emulated) -> None:
    """64 sequences whose chunks fill whole tiles (64 or 128 new tokens, G = 1): exactly Σ ceil(q_b / 64)
    blocks per kv head, none empty."""
    q_lens = [64 * (1 + b % 2) for b in range(64)]
    launch = _prefill_launch(emulated, [q + 3 for q in q_lens], q_lens, torch.float16)
    assert launch.empty_blocks == 0 and launch.blocks == sum(-(-q // 64) for q in q_lens) * 2
