// glue/rope.h — rotary_embedding and rotary_embedding_and_cache for the CUDA and emulated backends.
// Shapes: T tokens, Hq / Hkv heads, D head_dim, R rot_dim, P max positions.
#pragma once

#include "../checks/rope.h"
#include "../kernels/rope.cuh"
#include "../kernels/rope_cache.cuh"
#include "common.h"

namespace mk::inline MK_ABI::glue {

// In place on q [T, Hq, D] and k [T, Hkv, D]; positions int64 [T]; cos_sin_cache fp32 [P, R].
inline void rotary_embedding(const at::Tensor& positions, at::Tensor& q, at::Tensor& k,
                             const at::Tensor& cos_sin_cache, bool is_neox) {
  constexpr const char* op = "rotary_embedding";
  backend::require_device(op, "q", q);
  check::rotary_embedding_args(op, positions, q, k, cos_sin_cache, backend::kFloatTypes);
  const int64_t P = cos_sin_cache.size(0);
  check::index_range_cpu<int64_t>(op, "positions", positions, 0, P, "rows of cos_sin_cache");
  backend::Context ctx(q);
  MK_DISPATCH_FLOAT(q.scalar_type(), op, [&] {
    check_launch(launch_rotary_embedding(positions.const_data_ptr<int64_t>(), kptr<scalar_t>(q), kptr<scalar_t>(k),
                                         cos_sin_cache.const_data_ptr<float>(), q.size(0), q.stride(0), k.stride(0),
                                         q.size(1), k.size(1), q.size(2), cos_sin_cache.size(1), P, is_neox,
                                         ctx.stream()),
                 op);
  });
}

// rotary_embedding(positions, q, k, ...) then reshape_and_cache(k, v, k_cache, v_cache, slot_mapping), one launch.
inline void rotary_embedding_and_cache(const at::Tensor& positions, at::Tensor& q, at::Tensor& k, const at::Tensor& v,
                                       const at::Tensor& cos_sin_cache, bool is_neox, at::Tensor& k_cache,
                                       at::Tensor& v_cache, const at::Tensor& slot_mapping) {
  constexpr const char* op = "rotary_embedding_and_cache";
  backend::require_device(op, "q", q);
  check::rotary_embedding_and_cache_args(op, positions, q, k, v, cos_sin_cache, k_cache, v_cache, slot_mapping,
                                         backend::kFloatTypes);
  const int64_t P = cos_sin_cache.size(0);
  check::index_range_cpu<int64_t>(op, "positions", positions, 0, P, "rows of cos_sin_cache");
  backend::Context ctx(q);
  MK_DISPATCH_FLOAT(q.scalar_type(), op, [&] {
    // The whole cache as slots of Hkv·D elements (no block table: slot_mapping holds the slots).
    const PagedKV<kernel_t<scalar_t>> cache{kptr<scalar_t>(k_cache), kptr<scalar_t>(v_cache), nullptr,
                                            k.size(1) * k.size(2), static_cast<int>(k_cache.size(1)),
                                            static_cast<int>(k_cache.size(0))};
    check_launch(launch_rotary_embedding_and_cache(
                     positions.const_data_ptr<int64_t>(), kptr<scalar_t>(q), kptr<scalar_t>(k), kptr<scalar_t>(v),
                     cos_sin_cache.const_data_ptr<float>(), cache, slot_mapping.const_data_ptr<int64_t>(), q.size(0),
                     q.stride(0), k.stride(0), v.stride(0), q.size(1), k.size(1), q.size(2), cos_sin_cache.size(1), P,
                     is_neox, ctx.stream()),
                 op);
  });
}

}  // namespace mk::inline MK_ABI::glue
