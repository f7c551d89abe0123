// checks/rope.h — argument checks for rotary_embedding and rotary_embedding_and_cache.
// Shapes: T tokens, Hq / Hkv heads, D head_dim, R rot_dim, P max positions.
#pragma once

#include "attention.h"
#include "common.h"

// The ops of this family (registered by every backend from this list; see common.h).
#define MK_ROPE_OPS(X) X(rotary_embedding) X(rotary_embedding_and_cache)

namespace mk::inline MK_ABI::check {

// positions int64 [T]; q [T, Hq, D]; k [T, Hkv, D] (heads and dim dense, token stride free);
// cos_sin_cache fp32 [P, R] contiguous with R even and R ≤ D.
inline void rotary_embedding_args(const char* op, const at::Tensor& positions, const at::Tensor& q,
                                  const at::Tensor& k, const at::Tensor& cos_sin,
                                  std::initializer_list<at::ScalarType> dtypes) {
  dtype_is(op, "positions", positions, at::kLong);
  dtype_in(op, "q", q, dtypes);
  same_dtype(op, "k", k, "q", q);
  dtype_is(op, "cos_sin_cache", cos_sin, at::kFloat);
  same_device(op, "k", k, "q", q);
  same_device(op, "positions", positions, "q", q);
  same_device(op, "cos_sin_cache", cos_sin, "q", q);
  ndim(op, "positions", positions, 1, "[T]");
  ndim(op, "q", q, 3, "[T, Hq, D]");
  ndim(op, "k", k, 3, "[T, Hkv, D]");
  ndim(op, "cos_sin_cache", cos_sin, 2, "[max_pos, rot_dim]");
  const int64_t T = positions.size(0), D = q.size(2), R = cos_sin.size(1);
  size_eq(op, "q", q, 0, T, "T = positions.shape[0]");
  size_eq(op, "k", k, 0, T, "T = positions.shape[0]");
  size_eq(op, "k", k, 2, D, "head_dim D = q.shape[2]");
  TORCH_CHECK(R % 2 == 0 && R <= D, op, ": cos_sin_cache.shape[1] (rot_dim) must be even and <= head_dim ", D,
              ", got ", R);
  dense_inner(op, "q", q, 2);
  dense_inner(op, "k", k, 2);
  contiguous(op, "positions", positions);
  contiguous(op, "cos_sin_cache", cos_sin);
  // q and k are rotated in place: each must own its rows, and they must not share memory (k a view of q
  // would be rotated twice); views of one fused QKV buffer with disjoint columns are fine.
  no_internal_overlap(op, "q", q);
  no_internal_overlap(op, "k", k);
  no_overlap(op, "q", q, {{"k", &k}, {"positions", &positions}, {"cos_sin_cache", &cos_sin}});
  no_overlap(op, "k", k, {{"positions", &positions}, {"cos_sin_cache", &cos_sin}});
}

// rotary_embedding's arguments (q, k, positions, cos_sin_cache) and reshape_and_cache's (k, v, the caches,
// slot_mapping), and what the fused op adds: q and k are written too, so they may not share memory with v
// or the caches, nor the caches with positions or cos_sin_cache. Every check runs before anything is written.
inline void rotary_embedding_and_cache_args(const char* op, const at::Tensor& positions, const at::Tensor& q,
                                            const at::Tensor& k, const at::Tensor& v, const at::Tensor& cos_sin,
                                            const at::Tensor& k_cache, const at::Tensor& v_cache,
                                            const at::Tensor& slot_mapping,
                                            std::initializer_list<at::ScalarType> dtypes) {
  rotary_embedding_args(op, positions, q, k, cos_sin, dtypes);
  reshape_and_cache_args(op, k, v, k_cache, v_cache, slot_mapping, dtypes);
  no_overlap(op, "q", q, {{"v", &v}, {"k_cache", &k_cache}, {"v_cache", &v_cache}, {"slot_mapping", &slot_mapping}});
  no_overlap(op, "k", k, {{"v", &v}});
  // the caches are written while later tokens still read their positions and cos / sin rows
  no_overlap(op, "k_cache", k_cache, {{"cos_sin_cache", &cos_sin}, {"positions", &positions}});
  no_overlap(op, "v_cache", v_cache, {{"cos_sin_cache", &cos_sin}, {"positions", &positions}});
}

}  // namespace mk::inline MK_ABI::check
