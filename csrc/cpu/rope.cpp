// cpu/rope.cpp — native CPU rotary_embedding (MK_ROPE_OPS; fp32, bf16, fp16), in place on q and k: the checks
// and the split over tokens; the rotation is a per-ISA kernel (csrc/cpu/isa/rope.cpp).
// Shapes: T tokens, Hq / Hkv heads, D head_dim, R rot_dim, P max positions. Layouts and the
// rotation formula: see csrc/kernels/rope.cuh.
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

}  // namespace
}  // namespace mk::cpu

TORCH_LIBRARY_IMPL(mistral_kernels, CPU, m) { MK_ROPE_OPS(MK_IMPL_CPU) }
