// prefill_tc_kernels.cu — instantiates the tensor-core prefill kernels (fp16 and bf16 × every head_dim of
// launch_paged_prefill_tc) for tests/test_nvcc_ptxas.py, which compiles this file with -Xptxas -v.
#include "kernels/paged_prefill_tc.cuh"

cudaError_t prefill_tc_half(const mk::PrefillParams<__half>& p, int64_t Tq, int B, int D) {
  return mk::launch_paged_prefill_tc(p, Tq, B, D, nullptr);
}
cudaError_t prefill_tc_bf16(const mk::PrefillParams<__nv_bfloat16>& p, int64_t Tq, int B, int D) {
  return mk::launch_paged_prefill_tc(p, Tq, B, D, nullptr);
}
