// cpu/rope.cpp — native CPU rotary_embedding (MK_ROPE_OPS; fp32, bf16), in place on q and k.
// Shapes: T tokens, Hq / Hkv heads, D head_dim, R rot_dim, P max positions. Layouts and the
// rotation formula: see csrc/kernels/rope.cuh. Parallel over tokens.
#include <torch/library.h>

#include "../checks/rope.h"
#include "common.h"
#include "row_ops.h"

namespace mk::cpu {
namespace {

template <typename T, bool NEOX>
void rope_tokens(const int64_t* pos, T* q, T* k, const float* cos_sin, int64_t T_, int64_t qs, int64_t ks,
                 int64_t Hq, int64_t Hkv, int64_t D, int64_t R) {
  const int64_t half = R / 2;
  // work per token: 4 multiply-adds per rotated pair
  at::parallel_for(0, T_, parallel_grain(4 * (Hq + Hkv) * half), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* cos = cos_sin + pos[t] * R;
      rowops::rotate_heads<T, NEOX>(q + t * qs, Hq, D, half, cos, cos + half);
      rowops::rotate_heads<T, NEOX>(k + t * ks, Hkv, D, half, cos, cos + half);
    }
  });
}

void rotary_embedding(const at::Tensor& positions, at::Tensor& q, at::Tensor& k, const at::Tensor& cos_sin_cache,
                      bool is_neox) {
  constexpr const char* op = "rotary_embedding";
  require_cpu(op, "q", q);
  check::rotary_embedding_args(op, positions, q, k, cos_sin_cache, kFloatTypes);
  check::index_range_cpu<int64_t>(op, "positions", positions, 0, cos_sin_cache.size(0), "rows of cos_sin_cache");
  if (cos_sin_cache.size(1) == 0) return;
  MK_CPU_DISPATCH(q.scalar_type(), op, [&] {
    auto run = is_neox ? rope_tokens<scalar_t, true> : rope_tokens<scalar_t, false>;
    run(positions.const_data_ptr<int64_t>(), q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(),
        cos_sin_cache.const_data_ptr<float>(), q.size(0), q.stride(0), k.stride(0), q.size(1), k.size(1), q.size(2),
        cos_sin_cache.size(1));
  });
}

}  // namespace
}  // namespace mk::cpu

TORCH_LIBRARY_IMPL(mistral_kernels, CPU, m) { MK_ROPE_OPS(MK_IMPL_CPU) }
