// checks/attention.h — argument checks for reshape_and_cache, paged_decode_attention and
// paged_prefill_attention (shared by the CPU, CUDA and emulated backends).
//
// Shapes: T tokens, Tq packed query tokens, B sequences, Hq / Hkv heads, D head_dim, N num_blocks,
// S block_size, M max_blocks per sequence.
//   k, v [T, Hkv, D]  (heads and dim dense; token stride free)     slot_mapping int64 [T]
//   k_cache, v_cache [N, S, Hkv, D] contiguous
//   decode:  q [B, Hq, D]   block_tables int32 [B, M]   seq_lens int32 [B]   out [B, Hq, D]
//   prefill: q [Tq, Hq, D]  cu_seqlens_q int32 [B+1]                          out [Tq, Hq, D]
// Content checks (seq_lens within the block tables' capacity, the block ids actually read in
// [0, N), cu_seqlens_q monotone with q_b ≤ seq_lens[b]) run here for CPU tensors only; device
// tensors are checked by the Python wrapper (mistral_kernels/ops/attention.py).
// The visibility rule (first_visible_key) and the head dims of the CUDA kernels (MK_HEAD_DIMS) come
// from csrc/kernels/common.cuh.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>

#include "../kernels/common.cuh"
#include "common.h"

// The ops of this family (registered by every backend from this list; see common.h).
#define MK_ATTENTION_OPS(X) X(reshape_and_cache) X(paged_decode_attention) X(paged_prefill_attention)

namespace mk::inline MK_ABI::check {

// "64, 80, 96, 128, 256": the head dims the CUDA kernels are instantiated for.
inline std::string head_dim_list() {
  std::string s;
  for (const int d : kHeadDims) s += (s.empty() ? "" : ", ") + std::to_string(d);
  return s;
}

// The paged cache of checked tensors k_cache / v_cache [N, S, Hkv, D] and block_tables int32 [B, M], their
// data seen as T (the kernels' element type).
template <typename T>
PagedCache<T> paged_cache_of(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& block_tables) {
  return {static_cast<const T*>(k_cache.const_data_ptr()),
          static_cast<const T*>(v_cache.const_data_ptr()),
          block_tables.const_data_ptr<int32_t>(),
          static_cast<int>(k_cache.size(2)),
          static_cast<int>(k_cache.size(1)),
          static_cast<int>(block_tables.size(1)),
          static_cast<int>(k_cache.size(0))};
}

inline void kv_cache_pair(const char* op, const at::Tensor& k_cache, const at::Tensor& v_cache) {
  ndim(op, "k_cache", k_cache, 4, "[num_blocks, block_size, Hkv, D]");
  TORCH_CHECK(v_cache.sizes() == k_cache.sizes(), op, ": v_cache must have the shape of k_cache ",
              shape_str(k_cache), ", got ", shape_str(v_cache));
  same_dtype(op, "v_cache", v_cache, "k_cache", k_cache);
  same_device(op, "v_cache", v_cache, "k_cache", k_cache);
  TORCH_CHECK(k_cache.size(1) > 0, op, ": k_cache block_size (shape[1]) must be > 0, got shape ",
              shape_str(k_cache));
  contiguous(op, "k_cache", k_cache);
  contiguous(op, "v_cache", v_cache);
}

inline void reshape_and_cache_args(const char* op, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& k_cache, const at::Tensor& v_cache,
                                   const at::Tensor& slot_mapping, std::initializer_list<at::ScalarType> dtypes) {
  dtype_in(op, "k", k, dtypes);
  same_dtype(op, "v", v, "k", k);
  same_dtype(op, "k_cache", k_cache, "k", k);
  dtype_is(op, "slot_mapping", slot_mapping, at::kLong);
  same_device(op, "v", v, "k", k);
  same_device(op, "k_cache", k_cache, "k", k);
  same_device(op, "slot_mapping", slot_mapping, "k", k);
  kv_cache_pair(op, k_cache, v_cache);
  ndim(op, "k", k, 3, "[T, Hkv, D]");
  TORCH_CHECK(v.sizes() == k.sizes(), op, ": v must have the shape of k ", shape_str(k), ", got ", shape_str(v));
  ndim(op, "slot_mapping", slot_mapping, 1, "[T]");
  size_eq(op, "slot_mapping", slot_mapping, 0, k.size(0), "T = k.shape[0]");
  size_eq(op, "k", k, 1, k_cache.size(2), "Hkv = k_cache.shape[2]");
  size_eq(op, "k", k, 2, k_cache.size(3), "D = k_cache.shape[3]");
  dense_inner(op, "k", k, 2);
  dense_inner(op, "v", v, 2);
  contiguous(op, "slot_mapping", slot_mapping);
  no_overlap(op, "k_cache", k_cache, {{"v_cache", &v_cache}, {"k", &k}, {"v", &v}, {"slot_mapping", &slot_mapping}});
  no_overlap(op, "v_cache", v_cache, {{"k", &k}, {"v", &v}, {"slot_mapping", &slot_mapping}});
  const int64_t slots = k_cache.size(0) * k_cache.size(1);
  if (slot_mapping.device().is_cpu()) {
    const int64_t* s = slot_mapping.const_data_ptr<int64_t>();
    for (int64_t i = 0; i < slot_mapping.numel(); ++i)
      TORCH_CHECK(s[i] >= -1 && s[i] < slots, op, ": slot_mapping[", i, "]=", s[i], " is out of range [-1, ", slots,
                  ") (num_blocks*block_size; -1 skips the token)");
  }
}

// q [*, Hq, D] against the caches; shared by decode and prefill. `gpu_kernel` restricts head_dim.
inline void attention_common_args(const char* op, const at::Tensor& out, const at::Tensor& q,
                                  const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale,
                                  std::initializer_list<at::ScalarType> dtypes, bool gpu_kernel) {
  dtype_in(op, "q", q, dtypes);
  same_dtype(op, "k_cache", k_cache, "q", q);
  same_dtype(op, "out", out, "q", q);
  dtype_is(op, "block_tables", block_tables, at::kInt);
  dtype_is(op, "seq_lens", seq_lens, at::kInt);
  same_device(op, "k_cache", k_cache, "q", q);
  same_device(op, "out", out, "q", q);
  same_device(op, "block_tables", block_tables, "q", q);
  same_device(op, "seq_lens", seq_lens, "q", q);
  kv_cache_pair(op, k_cache, v_cache);
  ndim(op, "q", q, 3, "[tokens, Hq, D]");
  const int64_t Hq = q.size(1), D = q.size(2), Hkv = k_cache.size(2);
  size_eq(op, "k_cache", k_cache, 3, D, "head_dim D = q.shape[2]");
  TORCH_CHECK(Hkv > 0 && Hq % Hkv == 0, op, ": q has ", Hq, " heads, which is not a multiple of the ", Hkv,
              " kv heads of k_cache (shape[2]); GQA needs Hq % Hkv == 0");
  TORCH_CHECK(!gpu_kernel || head_dim_supported(D), op, ": head_dim ", D, " is not supported by the CUDA kernels (",
              head_dim_list(), ")");
  TORCH_CHECK(out.sizes() == q.sizes(), op, ": out must have the shape of q ", shape_str(q), ", got ",
              shape_str(out));
  ndim(op, "block_tables", block_tables, 2, "[B, max_blocks]");
  ndim(op, "seq_lens", seq_lens, 1, "[B]");
  size_eq(op, "block_tables", block_tables, 0, seq_lens.size(0), "B = seq_lens.shape[0]");
  TORCH_CHECK(std::isfinite(scale), op, ": scale must be finite, got ", scale);
  dense_inner(op, "q", q, 2);
  contiguous(op, "out", out);
  contiguous(op, "block_tables", block_tables);
  contiguous(op, "seq_lens", seq_lens);
  no_overlap(op, "out", out,
             {{"q", &q}, {"k_cache", &k_cache}, {"v_cache", &v_cache}, {"block_tables", &block_tables},
              {"seq_lens", &seq_lens}});
}

// The CUDA grid's z dimension holds the split-K partitions (paged_decode.cuh).
inline constexpr int64_t kMaxDecodePartitions = 65535;

// Decode only: one query row per sequence, and a partition_size whose partition count fits the grid on every
// backend (the CPU has no such limit, but a call must not succeed on one backend and fail on another).
inline void decode_shape_args(const char* op, const at::Tensor& q, const at::Tensor& k_cache,
                              const at::Tensor& block_tables, const at::Tensor& seq_lens, int64_t sliding_window,
                              int64_t partition_size) {
  size_eq(op, "q", q, 0, seq_lens.size(0), "B = seq_lens.shape[0], one query per sequence");
  TORCH_CHECK(partition_size >= 0, op, ": partition_size must be >= 0 (0 = automatic), got ", partition_size);
  const int64_t capacity = block_tables.size(1) * k_cache.size(1);
  const int64_t w = effective_window(sliding_window, capacity), range = w > 0 ? w : capacity;
  if (partition_size > 0) {
    const int64_t parts = (range + partition_size - 1) / partition_size;
    TORCH_CHECK(parts <= kMaxDecodePartitions, op, ": partition_size=", partition_size, " splits the ", range,
                " keys a query can see (block_tables capacity or sliding_window) into ", parts,
                " partitions, more than the ", kMaxDecodePartitions, " allowed; pass partition_size >= ",
                (range + kMaxDecodePartitions - 1) / kMaxDecodePartitions, " or 0 (automatic)");
  }
}

// CPU index tensors only: every seq_lens[b] in [0, M*S] and the block ids of the blocks the kernels
// read — logical blocks first/S … (seq_lens[b]-1)/S with first = first_visible_key(first query position,
// window) — in [0, N). The first query sits at seq_lens[b]-1 for decode (cu_seqlens_q undefined) and at
// seq_lens[b]-q_b for prefill (q_b from cu_seqlens_q, validated before by cu_seqlens_cpu).
inline void paged_indices_cpu(const char* op, const at::Tensor& k_cache, const at::Tensor& block_tables,
                              const at::Tensor& seq_lens, int64_t window, const at::Tensor& cu_seqlens_q = {}) {
  if (!seq_lens.device().is_cpu()) return;
  const int64_t B = seq_lens.size(0), M = block_tables.size(1), S = k_cache.size(1), N = k_cache.size(0);
  const int32_t* sl = seq_lens.const_data_ptr<int32_t>();
  const int32_t* bt = block_tables.const_data_ptr<int32_t>();
  const int32_t* cu = cu_seqlens_q.defined() ? cu_seqlens_q.const_data_ptr<int32_t>() : nullptr;
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(sl[b] >= 0, op, ": seq_lens[", b, "]=", sl[b], " is negative");
    TORCH_CHECK(sl[b] <= M * S, op, ": seq_lens[", b, "]=", sl[b], " exceeds block_tables capacity ", M * S,
                " (max_blocks*block_size)");
    if (sl[b] == 0) continue;
    const int64_t first = first_visible_key(cu ? sl[b] - (cu[b + 1] - cu[b]) : sl[b] - 1, window);
    for (int64_t j = first / S; j <= (sl[b] - 1) / S; ++j) {
      const int32_t id = bt[b * M + j];
      TORCH_CHECK(id >= 0 && id < N, op, ": block_tables[", b, ", ", j, "]=", id, " is out of range [0, ", N,
                  ") (num_blocks = k_cache.shape[0]); it holds keys ", j * S, "..", (j + 1) * S - 1, " of sequence ",
                  b);
    }
  }
}

// CPU only: cu_seqlens_q[0] == 0, non-decreasing, cu_seqlens_q[B] == Tq, and q_b ≤ seq_lens[b].
inline void cu_seqlens_cpu(const char* op, const at::Tensor& cu_seqlens_q, const at::Tensor& seq_lens, int64_t Tq) {
  if (!cu_seqlens_q.device().is_cpu()) return;
  const int64_t B = seq_lens.size(0);
  const int32_t* cu = cu_seqlens_q.const_data_ptr<int32_t>();
  const int32_t* sl = seq_lens.const_data_ptr<int32_t>();
  TORCH_CHECK(cu[0] == 0, op, ": cu_seqlens_q[0] must be 0, got ", cu[0]);
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(cu[b + 1] >= cu[b], op, ": cu_seqlens_q must be non-decreasing, got cu_seqlens_q[", b, "]=", cu[b],
                " > cu_seqlens_q[", b + 1, "]=", cu[b + 1]);
    TORCH_CHECK(cu[b + 1] - cu[b] <= sl[b], op, ": sequence ", b, " has ", cu[b + 1] - cu[b],
                " query tokens (cu_seqlens_q) but seq_lens[", b, "]=", sl[b],
                "; the new tokens are part of the cached sequence, so q_b <= seq_lens[b]");
  }
  TORCH_CHECK(cu[B] == Tq, op, ": cu_seqlens_q[-1]=", cu[B], " must equal the number of query tokens q.shape[0]=",
              Tq);
}

inline void prefill_shape_args(const char* op, const at::Tensor& q, const at::Tensor& cu_seqlens_q,
                               const at::Tensor& seq_lens) {
  dtype_is(op, "cu_seqlens_q", cu_seqlens_q, at::kInt);
  same_device(op, "cu_seqlens_q", cu_seqlens_q, "q", q);
  ndim(op, "cu_seqlens_q", cu_seqlens_q, 1, "[B+1]");
  size_eq(op, "cu_seqlens_q", cu_seqlens_q, 0, seq_lens.size(0) + 1, "B+1 = seq_lens.shape[0]+1");
  contiguous(op, "cu_seqlens_q", cu_seqlens_q);
}

inline void prefill_out_args(const char* op, const at::Tensor& out, const at::Tensor& cu_seqlens_q) {
  no_overlap(op, "out", out, {{"cu_seqlens_q", &cu_seqlens_q}});
}

}  // namespace mk::inline MK_ABI::check
