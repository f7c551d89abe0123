// dyn_smem.cpp — the largest dynamic shared memory each launcher of csrc/kernels requests, per kernel
// instance, from the launchers' own constexpr sizes; compiled by g++ (the emulator's headers) for
// tests/test_nvcc_ptxas.py, which adds it to ptxas's static figure and checks every target's limit.
// Output: one line per kernel instance, "<kernel name as c++filt prints it, without namespace and
// parameters>\t<bytes>". Kernels not listed launch with 0 dynamic bytes.
#include <cstdio>
#include <type_traits>

#include "kernels/moe_router.cuh"
#include "kernels/paged_prefill.cuh"
#include "kernels/paged_prefill_tc.cuh"

template <typename T>
const char* type_name() {
  return std::is_same_v<T, float> ? "float" : std::is_same_v<T, __half> ? "__half" : "__nv_bfloat16";
}

template <typename T, int D>
void attention() {
  std::printf("paged_prefill_kernel<%s, %d>\t%zu\n", type_name<T>(), D, mk::prefill_smem_bytes<T>(D));
  if constexpr (mk::kPrefillTcType<T>)
    std::printf("paged_prefill_tc_kernel<%s, %d>\t%zu\n", type_name<T>(), D,
                mk::PrefillTcTile<D>::template smem_bytes<T>());
}

template <typename T>
void per_type() {
#define MK_DYN_SMEM_D(D) attention<T, D>();
  MK_HEAD_DIMS(MK_DYN_SMEM_D)
#undef MK_DYN_SMEM_D
  // launch_topk_softmax, general path (E > 32): kRouterWarps·E floats, E ≤ kRouterMaxExperts.
  std::printf("topk_softmax_kernel<%s, false>\t%zu\n", type_name<T>(),
              sizeof(float) * mk::kRouterWarps * mk::kRouterMaxExperts);
}

int main() {
  per_type<float>();
  per_type<__half>();
  per_type<__nv_bfloat16>();
  return 0;
}
