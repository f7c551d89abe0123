// cpu/isa/attention.h — the per-ISA entry of the CPU paged attention: one scan of a key range of one
// sequence and kv head through the online-softmax state of R query rows (attention_core.h). The ops'
// glue (csrc/cpu/paged_attention.cpp) loads q, splits the work, merges split-K partitions and stores.
// Shapes: R rows, D head_dim, C = kAttnScanChunk keys per chunk.
#pragma once

#include <cstdint>

#include "api.h"

namespace mk::cpu {

inline constexpr int64_t kAttnScanChunk = 32;  // scratch rows per chunk (attn::kChunk)

// Plain arguments (no member functions: shared by the baseline glue and every level).
struct AttnScan {
  Elem elem;                   // dtype of the caches and of q_raw
  int64_t R, D;
  const float* q;              // [R][D] fp32, multiplied by the softmax scale
  const void* q_raw;           // [R][D] the same rows unscaled in the cache dtype (bf16 scan), or null
  float q_scale;               // q = q_raw · q_scale
  float* acc;                  // [R][D] unnormalised output rows (in/out)
  void* softmax;               // OnlineSoftmax [R] (csrc/kernels/common.cuh: {float m, l}), in/out
  const int64_t* lo;           // [R] row r sees keys lo[r] ≤ j < hi[r]
  const int64_t* hi;           // [R]
  const void* k;               // PagedKV (common.cuh) of the sequence and kv head: k_cache + kvh·D
  const void* v;               // v_cache + kvh·D
  const int32_t* block_table;  // the sequence's row of block_tables
  int64_t slot_stride;         // Hkv·D
  int block_size, num_blocks;  // S, N
  int64_t kbeg, kend;          // the keys scanned: [kbeg, kend)
  float* scores;               // scratch [R][kAttnScanChunk]
  float* kbuf;                 // scratch [kAttnScanChunk][D]
  float* vbuf;                 // scratch [kAttnScanChunk][D]
};

}  // namespace mk::cpu

MK_ISA_DECLARE(void attn_scan(const AttnScan& a))
