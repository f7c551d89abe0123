"""Launch planning of the attention kernels (csrc/kernels/attention_plan.h), from shapes only (no sync).

tests/plan/plan_dump.cpp (plain C++, compiled here with g++) prints the plans the glue launches:
- decode split-K: ≥ 2 blocks per SM at batch 1 / 4k context on an H100 (132 SMs), no split when the batch
  fills the GPU, an explicit partition_size honoured but clamped (no partition beyond the keys, ≤ 65535
  partitions: grid.z);
- prefill work list: every (sequence, q tile) that exists is claimed by exactly one block, and the grid has
  at most one idle block per sequence (the old grid gave each of 64 sequences the whole batch's tiles).
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
    # 64 sequences of 512 tokens, G = 4, BM = 64: 2048 tiles exist.
    (grid, items, idle, covered), = plan("prefill 4 64 " + " ".join(["512"] * 64))
    assert covered == 1 and items == 64 * 512 * 4 // 64
    assert grid == items + idle and idle <= 64
    assert grid < 64 * items / 60                 # the old grid: 64 × items blocks


def test_prefill_work_list_ragged(plan) -> None:
    lengths = [1, 0, 17, 300, 5, 0, 64, 63, 65, 1000]
    for g, bm in [(1, 64), (4, 64), (8, 128), (3, 64)]:
        (grid, items, idle, covered), = plan(f"prefill {g} {bm} " + " ".join(map(str, lengths)))
        assert covered == 1 and grid == items + idle and idle <= len(lengths), (g, bm)
