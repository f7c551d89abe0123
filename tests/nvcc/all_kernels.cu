// all_kernels.cu — instantiates every kernel the CUDA backend launches (each launcher of csrc/kernels for
// fp32, fp16 and bf16; the attention launchers over every head_dim of MK_HEAD_DIMS) for
// tests/test_nvcc_ptxas.py, which compiles this file with -Xptxas -v and checks every kernel's resources.
#include "kernels/activation.cuh"
#include "kernels/grouped_gemm.cuh"
#include "kernels/grouped_gemm_tc.cuh"
#include "kernels/kv_cache.cuh"
#include "kernels/moe_permute.cuh"
#include "kernels/moe_qgemm.cuh"
#include "kernels/moe_router.cuh"
#include "kernels/norm.cuh"
#include "kernels/paged_decode.cuh"
#include "kernels/paged_prefill.cuh"
#include "kernels/paged_prefill_tc.cuh"
#include "kernels/quant_gemm.cuh"
#include "kernels/quant_gemv.cuh"
#include "kernels/rope.cuh"

// Arguments are opaque to the compiler (function parameters), so every launcher and kernel is kept.
template <typename T>
struct Args {
  T *a, *b, *c;
  float *w, *cos_sin;
  uint8_t* packed;
  void* workspace;
  int32_t *ids, *inv_perm, *counts, *rank;
  int64_t *offsets, *slots, *positions;
  mk::PagedKV<T> cache;
  mk::DecodeParams<T> decode;
  mk::PrefillParams<T> prefill;
  int64_t n;
  int d;
};

template <typename T>
cudaError_t launch_all(const Args<T>& x) {
  cudaError_t e = cudaSuccess;
  auto acc = [&](cudaError_t r) { e = e == cudaSuccess ? r : e; };
  acc(mk::launch_silu_and_mul(x.a, x.b, x.n, x.n, nullptr));
  acc(mk::launch_grouped_gemm_nt(x.a, x.n, x.b, x.n, x.c, x.offsets, x.d, x.n, x.n, x.n, x.n, nullptr));
  acc(mk::launch_reshape_and_cache(x.a, x.b, x.cache, x.slots, x.n, x.n, x.n, nullptr));
  acc(mk::launch_moe_permute(x.a, x.offsets, x.inv_perm, x.counts, x.rank, x.b, x.ids, x.n, x.n, x.n, x.d, nullptr));
  acc(mk::launch_moe_unpermute(x.a, x.b, x.w, x.inv_perm, x.n, x.n, x.n, x.n, nullptr));
  acc(mk::launch_topk_softmax(x.w, x.ids, x.a, x.n, x.d, x.d, true, nullptr));
  acc(mk::launch_rms_norm<T, false>(x.a, nullptr, x.b, x.c, x.n, x.n, 1e-5f, nullptr));
  acc(mk::launch_rms_norm<T, true>(x.a, x.b, x.b, x.c, x.n, x.n, 1e-5f, nullptr));
  acc(mk::launch_rotary_embedding(x.positions, x.a, x.b, x.cos_sin, x.n, x.n, x.n, x.n, x.n, x.n, x.n, x.n, true,
                                  nullptr));
  acc(mk::launch_paged_decode(x.decode, x.d, nullptr));
  acc(mk::launch_paged_prefill(x.prefill, x.n, x.d, x.d, nullptr));
  acc(mk::launch_paged_prefill_tc(x.prefill, x.n, x.d, x.d, nullptr));
  // every tile (decode / medium / prefill, picked by the rows per group), plain and gated (x.c as W3)
  const mk::GroupedGemmTcArgs<T> plain{x.a, x.n, x.b, x.n, x.c, nullptr, x.offsets, x.d, x.n, x.n, x.n};
  mk::GroupedGemmTcArgs<T> gated = plain;
  gated.W3 = x.c;
  acc(mk::launch_grouped_gemm_tc(plain, x.n, nullptr));
  acc(mk::launch_grouped_gemm_tc(gated, x.n, nullptr));
  // qlinear: GEMV (every MR) and GEMM for every format of MK_QTYPES
  // (with a workspace: the int8-activation GEMV for fp16 / bf16 and the x quantization; the dequantization of
  // the large-M path)
#define MK_ALL_QUANT(code, name, qk, nb)                                                              \
  acc(mk::launch_quant_gemv<T, mk::code>(x.a, x.b, x.packed, x.w, x.n, x.n, x.n, nullptr));              \
  acc(mk::launch_quant_gemv<T, mk::code>(x.a, x.b, x.packed, x.w, x.n, x.n, x.n, nullptr, x.workspace)); \
  acc(mk::launch_quant_gemm<T, mk::code>(x.a, x.b, x.packed, x.w, x.n, x.n, x.n, nullptr));              \
  acc(mk::launch_quant_dequantize<T, mk::code>(x.a, x.packed, x.w, x.n, x.n, nullptr));
  MK_QTYPES(MK_ALL_QUANT)
#undef MK_ALL_QUANT
  // moe_qgemm: the grouped GEMV (every MR, plain and gated: x.packed as w3) and GEMM for every format
  const mk::MoeQArgs<T> mplain{x.a, x.n, x.b, x.packed, nullptr, x.w, nullptr, x.offsets, x.d, x.n, x.n, x.n};
  mk::MoeQArgs<T> mgated = mplain;
  mgated.w3 = x.packed;
#define MK_ALL_MOE_QUANT(code, name, qk, nb)                             \
  acc(mk::launch_moe_qgemv<T, mk::code>(mplain, nullptr));              \
  acc(mk::launch_moe_qgemv<T, mk::code>(mgated, nullptr));              \
  acc(mk::launch_moe_qgemv<T, mk::code>(mplain, nullptr, x.workspace)); \
  acc(mk::launch_moe_qgemv<T, mk::code>(mgated, nullptr, x.workspace)); \
  acc(mk::launch_moe_qgemm<T, mk::code>(mplain, nullptr));
  MK_QTYPES(MK_ALL_MOE_QUANT)
#undef MK_ALL_MOE_QUANT
  return e;
}

cudaError_t launch_all_f32(const Args<float>& x) { return launch_all(x); }
cudaError_t launch_all_f16(const Args<__half>& x) { return launch_all(x); }
cudaError_t launch_all_bf16(const Args<__nv_bfloat16>& x) { return launch_all(x); }
