"""Launch planning of the attention kernels (csrc/kernels/attention_plan.h), from shapes only (no sync).

tests/plan/plan_dump.cpp (plain C++, compiled here with g++) prints the plans the glue launches:
- decode split-K: ≥ 2 blocks per SM at batch 1 / 4k context on an H100 (132 SMs), no split when the batch
  fills the GPU, an explicit partition_size honoured but clamped (no partition beyond the keys, ≤ 65535
  partitions: grid.z);
- prefill work list: exactly one item per (sequence, q tile) that exists, each run by exactly one block; no
  block is empty (grid ceil(Tq·G/BM) ≤ items); a 64-sequence batch of whole tiles launches exactly Σ ceil(q_b·G/BM)
  blocks (the old grid gave each of 64 sequences the whole batch's tiles).
The kernels themselves run these plans in tests/test_attention.py and tests/test_prefill_tc.py (emulated).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GXX = shutil.which("g++")
H100_SMS = 132


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory):
    if GXX is None:
        pytest.skip("g++ not found")
    exe = tmp_path_factory.mktemp("plan") / "plan_dump"
    r = subprocess.run([GXX, "-std=c++20", "-O1", "-Wall", f"-I{ROOT / 'csrc'}", str(ROOT / "tests/plan/plan_dump.cpp"),
                        "-o", str(exe)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]

    def run(*commands: str) -> list[list[int]]:
        out = subprocess.run([str(exe)], input="\n".join(commands) + "\n", capture_output=True, text=True,
                             timeout=60, check=True).stdout
        return [[int(x) for x in line.split()] for line in out.splitlines()]

    return run


def test_decode_fills_the_gpu_at_batch_1(plan) -> None:
    # Mistral 7B: Hkv 8, G 4 → one block per kv head (head_blocks 8); 4096 keys.
    (part, parts, blocks), = plan(f"decode 1 8 4096 0 {H100_SMS}")
    assert blocks >= 2 * H100_SMS and blocks == 8 * parts
    assert part % 32 == 0 and part * parts >= 4096 and part * (parts - 1) < 4096
    (part, parts, blocks), = plan(f"decode 4 8 4096 0 {H100_SMS}")
    assert blocks >= 2 * H100_SMS and parts > 1


def test_decode_does_not_split_a_full_batch(plan) -> None:
    (part, parts, blocks), = plan(f"decode 64 8 4096 0 {H100_SMS}")
    assert (part, parts, blocks) == (4096, 1, 512)


def test_decode_partition_size_clamped(plan) -> None:
    explicit, huge, tiny_range, too_many = plan("decode 1 8 4096 64 132", f"decode 1 8 4096 {2**31} 132",
                                                "decode 2 1 0 0 132", f"decode 1 1 {2**28} 16 132")
    assert explicit == [64, 64, 512]
    assert huge == [4096, 1, 8]                  # clamped to the range: one partition, not int truncation
    assert tiny_range[1] == 1                    # an empty table still gets its one (zero-writing) partition
    assert too_many[1] <= 65535 and too_many[0] * too_many[1] >= 2**28  # grid.z limit


def test_prefill_work_list_64_sequences(plan) -> None:
    # 64 sequences of 512 tokens, G = 4, BM = 64: 2048 tiles exist, 2048 blocks run one each.
    (grid, items, empty, covered, most), = plan("prefill 4 64 " + " ".join(["512"] * 64))
    assert (grid, items, empty, covered, most) == (2048, 2048, 0, 1, 1)
    # 64 sequences of 16 tokens (G = 4: one whole tile each) and of 48 + 16·k tokens: grid = Σ ceil exactly.
    (grid, items, empty, covered, most), = plan("prefill 4 64 " + " ".join(["16"] * 64))
    assert (grid, items, empty, covered, most) == (64, 64, 0, 1, 1)
    lengths = [48 + 16 * (k % 5) for k in range(64)]
    (grid, items, empty, covered, most), = plan("prefill 4 64 " + " ".join(map(str, lengths)))
    assert grid == items == sum(-(-n * 4 // 64) for n in lengths) and (empty, covered, most) == (0, 1, 1)


def test_prefill_work_list_ragged(plan) -> None:
    """Ragged lengths, empty sequences included: still no empty block; every tile once; the blocks that run a
    second item are at most the sequences' partial last tiles (≤ B - 1)."""
    lengths = [1, 0, 17, 300, 5, 0, 64, 63, 65, 1000]
    for g, bm in [(1, 64), (4, 64), (8, 128), (3, 64)]:
        (grid, items, empty, covered, most), = plan(f"prefill {g} {bm} " + " ".join(map(str, lengths)))
        assert covered == 1 and empty == 0, (g, bm)
        assert grid == -(-sum(lengths) * g // bm) and grid <= items < grid + len(lengths) and most <= 2, (g, bm)
