// dyn_smem.cpp — the largest dynamic shared memory each launcher of csrc/kernels requests, per kernel
// instance, from the launchers' own constexpr sizes; compiled by g++ (the emulator's headers) for
// tests/test_nvcc_ptxas.py, which adds it to ptxas's static figure and checks every target's limit.
// Output: one line per kernel instance, "<kernel name as c++filt prints it, without namespace and
// parameters>\t<bytes>". Kernels not listed launch with 0 dynamic bytes.
#include <cstdio>
#include <type_traits>

#include "kernels/grouped_gemm_tc.cuh"
#include "kernels/moe_qgemm.cuh"
#include "kernels/moe_router.cuh"
#include "kernels/paged_prefill.cuh"
#include "kernels/paged_prefill_tc.cuh"
#include "kernels/quant_gemm.cuh"
#include "kernels/quant_gemv.cuh"

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

// grouped_gemm_tc_kernel<T, GemmTcTile<BM, BN, BK, WM, WN, S, B>, gated> as c++filt prints it (namespaces cut).
template <typename T, typename C>
void grouped_gemm_tc() {
  for (const char* gated : {"false", "true"})
    std::printf("grouped_gemm_tc_kernel<%s, GemmTcTile<%d, %d, %d, %d, %d, %d, %d>, %s>\t%zu\n",
                type_name<T>(), C::BM, C::BN, C::BK, C::WARPS_M, C::WARPS_N, C::STAGES, C::MIN_BLOCKS, gated,
                C::template smem_bytes<T>());
}

template <typename T>
void per_type() {
#define MK_DYN_SMEM_D(D) attention<T, D>();
  MK_HEAD_DIMS(MK_DYN_SMEM_D)
#undef MK_DYN_SMEM_D
  if constexpr (mk::kTcType<T>) {
    grouped_gemm_tc<T, mk::GemmTcDecode>();
    grouped_gemm_tc<T, mk::GemmTcMedium>();
    grouped_gemm_tc<T, mk::GemmTcPrefill>();
  }
  // qlinear: every format of MK_QTYPES (the figures depend on the type and MR only).
#define MK_DYN_SMEM_Q(code, nm, qk, nb)                                                                       \
  std::printf("quant_gemm_kernel<%s, %d>\t%zu\n", type_name<T>(), mk::code, mk::QGemmTile<T>::smem_bytes()); \
  for (const int mr : {1, 2, 4, 8})                                                                         \
    std::printf("quant_gemv_kernel<%s, %d, %d>\t%zu\n", type_name<T>(), mk::code, mr,                        \
                mr == 1 ? mk::gemv_smem_bytes<1>() : mr == 2 ? mk::gemv_smem_bytes<2>()                     \
                        : mr == 4 ? mk::gemv_smem_bytes<4>() : mk::gemv_smem_bytes<8>());
  MK_QTYPES(MK_DYN_SMEM_Q)
#undef MK_DYN_SMEM_Q
  // moe_qgemm: the same bodies (moe_qgemm.cuh), grouped
#define MK_DYN_SMEM_MQ(code, nm, qk, nb)                                                                      \
  std::printf("moe_qgemm_kernel<%s, %d>\t%zu\n", type_name<T>(), mk::code, mk::QGemmTile<T>::smem_bytes());  \
  for (const int mr : {1, 2, 4, 8})                                                                         \
    for (const char* gated : {"false", "true"})                                                             \
      std::printf("moe_qgemv_kernel<%s, %d, %d, %s>\t%zu\n", type_name<T>(), mk::code, mr, gated,            \
                  mr == 1 ? mk::gemv_smem_bytes<1>() : mr == 2 ? mk::gemv_smem_bytes<2>()                   \
                          : mr == 4 ? mk::gemv_smem_bytes<4>() : mk::gemv_smem_bytes<8>());
  MK_QTYPES(MK_DYN_SMEM_MQ)
#undef MK_DYN_SMEM_MQ
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
