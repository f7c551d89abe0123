// attention_plan.h — launch planning of the paged attention kernels, on the host from shapes only (no
// device sync, so it works inside a CUDA-graph capture). Plain C++ (no CUDA headers): the glue calls it,
// and tests/plan/plan_dump.cpp prints it for tests/test_attention_plan.py.
//
// Decode split-K (paged_decode.cuh). Blocks of one partition = B · head_blocks (head_blocks = Hkv ·
// ceil(G / GC)). An H100 has 132 SMs: at batch 1 with Hkv = 8 a single partition is 8 blocks, 6 % of the
// GPU. The automatic partition size therefore splits the longest visible range (``range``: the block
// table's capacity, or the window) into enough partitions that ≥ 2 blocks per SM exist:
//   P_target = ceil(2 · SMs / (B · head_blocks));  part = range / P_target rounded down to 32 keys (≥ 32)
//   e.g. B = 1, Hkv = 8, G = 4, 4096 keys, 132 SMs: P_target 33, part 96 → 43 partitions, 344 blocks;
//        B = 64: 512 blocks per partition already → one partition (no split-K workspace at all).
// With the automatic size the kernel then splits each sequence's own visible keys over these P partitions
// (decode_partition_size, paged_decode.cuh: multiples of 32 keys), so planning for the capacity does not
// leave a short sequence on one block; partitions past a sequence's keys exit at once (the kernel and the
// reduce skip them). An explicit partition_size is honoured, but
// clamped to [ceil(range / 65535), range]: at most 65535 partitions (grid.z), none larger than the
// range (so it fits the kernel's int and a huge value means "one partition", not zeros).
//
// Prefill work list (paged_prefill.cuh, paged_prefill_tc.cuh). Sequence b has q_b·G query rows (token ×
// GQA head) in prefill_tiles(q_b) = ceil(q_b·G / BM) tiles. The work list numbers the tiles sequence after
// sequence: item E(b) + i is tile i of sequence b, E(b) = Σ_{c<b} prefill_tiles(q_c) — exactly one item
// per existing (sequence, tile) pair, none for a sequence without new tokens. The kernels find an item's
// (b, tile) with a warp scan over cu_seqlens_q (prefill_find_item, paged_prefill.cuh; prefill_item below
// is the same map on the host, for tests/plan): no planning pass, no host read, no sync.
// Grid: prefill_grid = ceil(Tq·G / BM) blocks, sized from q's shape alone. Since Σ_b ceil(q_b·G / BM) ≥
// ceil(Σ_b q_b·G / BM), the grid never exceeds the items: NO block is empty. Block x takes items x,
// x + grid, x + 2·grid, ...: the grid equals the item count when the sequences fill whole tiles (64
// sequences of 512 tokens, G = 4, BM = 64: 2048 blocks for 2048 tiles), else up to B - 1 items (the
// sequences' partial last tiles) are second items of some blocks. (The old grid gave every sequence the
// tiles of the whole batch: 64 sequences of 512 tokens launched 64× the blocks, < 2 % of them working.)
#pragma once

#include <algorithm>
#include <cstdint>

#include "../abi.h"

// The prefill kernels call the work-list functions on the device: host + device under nvcc (keywords,
// no CUDA header needed), plain functions elsewhere.
#if defined(__CUDACC__)
#define MK_PLAN_HD __host__ __device__
#else
#define MK_PLAN_HD
#endif

namespace mk::inline MK_ABI {

inline constexpr int64_t kMaxGridYZ = 65535;          // CUDA's limit of gridDim.y and gridDim.z
inline constexpr int64_t kDecodeMinPartition = 32;    // keys: one 8-key chunk of each of the 4 warps (D 128, 16-bit)
inline constexpr int64_t kDecodeBlocksPerSm = 2;      // the automatic plan's occupancy target

struct DecodePlan {
  int64_t part_size;    // keys per partition (≤ range, fits int)
  int64_t partitions;   // P (≤ 65535)
  int64_t blocks;       // B · head_blocks · P (the split-K pass; the reduce adds B · Hq when P > 1)
};

constexpr int64_t plan_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// range: most keys one query sees (≥ 0); requested: partition_size (0 = automatic); sm_count: SMs.
constexpr DecodePlan decode_plan(int64_t B, int64_t head_blocks, int64_t range, int64_t requested,
                                 int64_t sm_count) {
  range = std::max<int64_t>(range, 1);
  int64_t part = requested;
  if (part <= 0) {
    const int64_t per_partition = std::max<int64_t>(B * head_blocks, 1);
    const int64_t want = plan_ceil_div(kDecodeBlocksPerSm * std::max<int64_t>(sm_count, 1), per_partition);
    part = want <= 1 ? range
                     : std::max(kDecodeMinPartition, range / want / kDecodeMinPartition * kDecodeMinPartition);
  }
  part = std::max(std::min(part, range), plan_ceil_div(range, kMaxGridYZ));
  const int64_t P = plan_ceil_div(range, part);
  return {part, P, B * head_blocks * P};
}

// Prefill: tiles of a sequence with q new tokens; the grid of a call with Tq packed tokens (≤ the items).
MK_PLAN_HD constexpr int64_t prefill_tiles(int64_t q, int G, int BM) { return (q * G + BM - 1) / BM; }
MK_PLAN_HD constexpr int64_t prefill_grid(int64_t Tq, int G, int BM) { return prefill_tiles(Tq, G, BM); }

// Host reference of the work list's map: item t → (sequence b, tile); false when t ≥ the item count.
template <typename Index>
constexpr bool prefill_item(const Index* cu, int B, int64_t t, int G, int BM, int& b, int& tile) {
  for (int64_t base = 0, c = 0; c < B; ++c) {
    const int64_t n = prefill_tiles(cu[c + 1] - cu[c], G, BM);
    if (t < base + n) {
      b = static_cast<int>(c);
      tile = static_cast<int>(t - base);
      return true;
    }
    base += n;
  }
  return false;
}

}  // namespace mk::inline MK_ABI
