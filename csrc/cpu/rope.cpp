// cpu/rope.cpp — native CPU rotary_embedding (MK_ROPE_OPS; fp32, bf16, fp16), in place on q and k: the checks
// and the split over tokens; the rotation is a per-ISA kernel (csrc/cpu/isa/rope.cpp).
// rotary_embedding_and_cache composes it with the CPU reshape_and_cache (csrc/cpu/paged_attention.cpp,
// called through the dispatcher): on the CPU there is no launch to save.
// Shapes: T tokens, Hq / Hkv heads, D head_dim, R rot_dim, P max positions. Layouts and the
// rotation formula: see csrc/kernels/rope.cuh.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "../checks/rope.h"
#include "common.h"
#include "isa/rope.h"
#include "isa_dispatch.h"

namespace mk::cpu {
namespace {

void rotary_embedding(const at::Tensor& positions, at::Tensor& q, at::Tensor& k, const at::Tensor& cos_sin_cache,
                      bool is_neox) {
  constexpr const char* op = "rotary_embedding";
  require_cpu(op, "q", q);
  check::rotary_embedding_args(op, positions, q, k, cos_sin_cache, kFloatTypes);
  check::index_range_cpu<int64_t>(op, "positions", positions, 0, cos_sin_cache.size(0), "rows of cos_sin_cache");
  if (cos_sin_cache.size(1) == 0) return;
  const auto kernel = MK_ISA_CALL(rope_tokens);
  const Elem elem = elem_of(q.scalar_type());
  const int64_t T = q.size(0), Hq = q.size(1), Hkv = k.size(1), D = q.size(2), R = cos_sin_cache.size(1);
  const int64_t* pos = positions.const_data_ptr<int64_t>();
  void* qp = q.data_ptr();
  void* kp = k.data_ptr();
  const float* cs = cos_sin_cache.const_data_ptr<float>();
  const int64_t qs = q.stride(0), ks = k.stride(0);
  // work per token: 4 multiply-adds per rotated pair
  at::parallel_for(0, T, parallel_grain(4 * (Hq + Hkv) * (R / 2)), [&](int64_t t0, int64_t t1) {
    kernel(elem, is_neox, pos, qp, kp, cs, t0, t1, qs, ks, Hq, Hkv, D, R);
  });
}

void rotary_embedding_and_cache(const at::Tensor& positions, at::Tensor& q, at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& cos_sin_cache, bool is_neox, at::Tensor& k_cache, at::Tensor& v_cache,
                                const at::Tensor& slot_mapping) {
  constexpr const char* op = "rotary_embedding_and_cache";
  require_cpu(op, "q", q);
  check::rotary_embedding_and_cache_args(op, positions, q, k, v, cos_sin_cache, k_cache, v_cache, slot_mapping,
                                         kFloatTypes);
  check::index_range_cpu<int64_t>(op, "positions", positions, 0, cos_sin_cache.size(0), "rows of cos_sin_cache");
  rotary_embedding(positions, q, k, cos_sin_cache, is_neox);
  static const auto cache_write =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("mistral_kernels::reshape_and_cache", "")
          .typed<void(const at::Tensor&, const at::Tensor&, at::Tensor&, at::Tensor&, const at::Tensor&)>();
  cache_write.call(k, v, k_cache, v_cache, slot_mapping);
}

}  // namespace
}  // namespace mk::cpu

TORCH_LIBRARY_IMPL(mistral_kernels, CPU, m) { MK_ROPE_OPS(MK_IMPL_CPU) }
