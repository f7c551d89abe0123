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
// GQA head) in ceil(q_b·G / BM) tiles. Sequence b's tiles start at grid index
//   T(b) = floor(cu[b] · G / BM) + b          (cu = cu_seqlens_q; T(b+1) - T(b) ≥ ceil(q_b·G / BM))
// which a block recovers from cu_seqlens_q alone by a binary search over b (prefill_locate_tile): no
// planning pass and no sync, and the grid is T(B) = floor(Tq·G / BM) + B blocks — at most B more than the
// tiles that exist (the old grid gave every sequence the tiles of the whole batch: 64 sequences of 512
// tokens launched 64× too many blocks).
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

// Prefill: first grid index of sequence b's tiles (cu_b = cu_seqlens_q[b]); T(B) is the grid size.
MK_PLAN_HD constexpr int64_t prefill_tile_start(int64_t cu_b, int64_t b, int G, int BM) { return cu_b * G / BM + b; }

// Sequence b and tile of grid index t (binary search over cu[0..B]); false for an index past its
// sequence's tiles (an idle block: at most one per sequence) — the kernels return at once then.
template <typename Index>
MK_PLAN_HD constexpr bool prefill_locate_tile(const Index* cu, int B, int64_t t, int G, int BM, int& b, int& tile) {
  int lo = 0, hi = B - 1;  // the last b with T(b) <= t
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (prefill_tile_start(cu[mid], mid, G, BM) <= t) lo = mid;
    else hi = mid - 1;
  }
  b = lo;
  tile = static_cast<int>(t - prefill_tile_start(cu[lo], lo, G, BM));
  const int64_t rows = static_cast<int64_t>(cu[lo + 1] - cu[lo]) * G;
  return tile >= 0 && static_cast<int64_t>(tile) * BM < rows;  // (tile < 0 only for a cu[0] ≠ 0 no check caught)
}

}  // namespace mk::inline MK_ABI
