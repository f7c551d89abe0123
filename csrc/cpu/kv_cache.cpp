// cpu/kv_cache.cpp — native CPU reshape_and_cache (fp32, bf16): scatter new K/V rows into the paged cache.
// Shapes: T tokens, Hkv kv heads, D head_dim, N num_blocks, S block_size.
//   k, v [T, Hkv, D] → k_cache, v_cache [N, S, Hkv, D] at slot = block*S + offset (slot_mapping int64 [T]);
//   slot -1 skips the token (padding). A pure copy: bit-exact. Parallel over tokens.
#include <torch/library.h>

#include "../checks/attention.h"
#include "common.h"

namespace mk::cpu {
namespace {

void reshape_and_cache(const at::Tensor& k, const at::Tensor& v, at::Tensor& k_cache, at::Tensor& v_cache,
                       const at::Tensor& slot_mapping) {
  constexpr const char* op = "reshape_and_cache";
  require_cpu(op, "k", k);
  check::reshape_and_cache_args(op, k, v, k_cache, v_cache, slot_mapping, kFloatTypes);
  const int64_t T = k.size(0), row = k.size(1) * k.size(2);  // Hkv*D elements per token
  const int64_t* slots = slot_mapping.const_data_ptr<int64_t>();
  const int64_t ks = k.stride(0), vs = v.stride(0);
  const size_t bytes = static_cast<size_t>(row) * k.element_size();
  const char* kp = static_cast<const char*>(k.const_data_ptr());
  const char* vp = static_cast<const char*>(v.const_data_ptr());
  char* kc = static_cast<char*>(k_cache.data_ptr());
  char* vc = static_cast<char*>(v_cache.data_ptr());
  const int64_t es = k.element_size();
  at::parallel_for(0, T, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, row)), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t s = slots[t];
      if (s < 0) continue;
      std::memcpy(kc + s * row * es, kp + t * ks * es, bytes);
      std::memcpy(vc + s * row * es, vp + t * vs * es, bytes);
    }
  });
}

}  // namespace
}  // namespace mk::cpu

TORCH_LIBRARY_IMPL(mistral_kernels, CPU, m) { m.impl("reshape_and_cache", &mk::cpu::reshape_and_cache); }
