// cpu/linear.cpp — skinny_linear: out[M, N] = x[M, K] · W[N, K]ᵀ for small M (decode: M = batch ≤ 16).
//
// Decode matmuls are memory-bound GEMVs: every weight byte is read once per step and the roofline is
// N·K·sizeof(T) / bandwidth. This kernel streams W exactly once per call: parallel over blocks of
// output columns n (at::parallel_for), and for each group of NB rows of W it keeps MB × NB
// accumulators in registers so x (tiny, L1-resident) is re-read instead of W. Results do not depend on
// the thread count (each dot product is computed the same way whatever the split).
//   bf16: AVX-512 BF16 `vdpbf16ps` (32 products per instruction, fp32 accumulation) when compiled
//         for a CPU that has it; else bf16 → fp32 conversion + FMA.
//   fp32: AVX-512F FMA; portable scalar code (16 partial sums, auto-vectorised) elsewhere.
// Prefill-sized M goes to ATen's GEMM (the Python wrapper `ops.linear` picks).
#include <torch/library.h>

#include "../checks/common.h"
#include "common.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace mk::cpu {
namespace {

constexpr int kMaxM = 16;  // rows of x handled per call (the wrapper falls back to ATen above this)

#if defined(__AVX512F__)

// The NB rows of W being reduced are short (K·sizeof(T) bytes each), too short for the hardware
// prefetcher to ramp up on its own: touch the same offset of the next row block while computing this
// one, so the next block's lines are in flight (prefetches past the end of W are harmless no-ops).
template <typename T>
inline void prefetch_next_block(const T* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
}

inline __m512 load_f32x16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load_f32x16(const c10::BFloat16* p, __mmask16 m) {
  const __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// acc[m][r] += Σ_k x[m, k] · w[r, k] over one K-chunk of 16 (fp32 path; bf16 without AVX512-BF16).
template <typename T, int MB, int NB>
inline void dot_block_fma(const T* x, int64_t ldx, const T* w, int64_t K, __m512 (&acc)[MB][NB]) {
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 mask = K - k >= 16 ? __mmask16(0xffff) : __mmask16((1u << (K - k)) - 1);
    __m512 wv[NB];
    for (int r = 0; r < NB; ++r) {
      wv[r] = load_f32x16(w + r * K + k, mask);
      prefetch_next_block(w + (NB + r) * K + k);
    }
    for (int m = 0; m < MB; ++m) {
      const __m512 xv = load_f32x16(x + m * ldx + k, mask);
      for (int r = 0; r < NB; ++r) acc[m][r] = _mm512_fmadd_ps(xv, wv[r], acc[m][r]);
    }
  }
}

#if defined(__AVX512BF16__)
template <int MB, int NB>
inline void dot_block_bf16(const c10::BFloat16* x, int64_t ldx, const c10::BFloat16* w, int64_t K,
                           __m512 (&acc)[MB][NB]) {
  for (int64_t k = 0; k < K; k += 32) {
    const __mmask32 mask = K - k >= 32 ? __mmask32(0xffffffffu) : __mmask32((1ull << (K - k)) - 1);
    __m512bh wv[NB];
    for (int r = 0; r < NB; ++r) {
      wv[r] = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + r * K + k);
      prefetch_next_block(w + (NB + r) * K + k);
    }
    for (int m = 0; m < MB; ++m) {
      const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mask, x + m * ldx + k);
      for (int r = 0; r < NB; ++r) acc[m][r] = _mm512_dpbf16_ps(acc[m][r], xv, wv[r]);
    }
  }
}
#endif

// Columns [n0, n1) of out for rows [0, MB) of x.
template <typename T, int MB, int NB>
void linear_cols(T* out, int64_t ldo, const T* x, int64_t ldx, const T* w, int64_t K, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + NB <= n1; n += NB) {
    __m512 acc[MB][NB];
    for (int m = 0; m < MB; ++m)
      for (int r = 0; r < NB; ++r) acc[m][r] = _mm512_setzero_ps();
#if defined(__AVX512BF16__)
    if constexpr (std::is_same_v<T, c10::BFloat16>)
      dot_block_bf16<MB, NB>(x, ldx, w + n * K, K, acc);
    else
#endif
      dot_block_fma<T, MB, NB>(x, ldx, w + n * K, K, acc);
    for (int m = 0; m < MB; ++m)
      for (int r = 0; r < NB; ++r) out[m * ldo + n + r] = from_f<T>(_mm512_reduce_add_ps(acc[m][r]));
  }
  for (; n < n1; ++n) linear_cols<T, MB, 1>(out, ldo, x, ldx, w, K, n, n + 1);
}

#else  // portable

template <typename T, int MB, int NB>
void linear_cols(T* out, int64_t ldo, const T* x, int64_t ldx, const T* w, int64_t K, int64_t n0, int64_t n1) {
  constexpr int L = 16;
  for (int64_t n = n0; n < n1; ++n) {
    const T* wr = w + n * K;
    for (int m = 0; m < MB; ++m) {
      const T* xr = x + m * ldx;
      float acc[L] = {};
      int64_t k = 0;
      for (; k + L <= K; k += L)
        for (int j = 0; j < L; ++j) acc[j] += to_f(xr[k + j]) * to_f(wr[k + j]);
      float s = 0.f;
      for (int j = 0; j < L; ++j) s += acc[j];
      for (; k < K; ++k) s += to_f(xr[k]) * to_f(wr[k]);
      out[m * ldo + n] = from_f<T>(s);
    }
  }
}

#endif

// Rows of x in blocks of up to 4 (4 × 4 accumulators + 4 W vectors fit the 32 zmm registers).
template <typename T>
void linear_rows(T* out, const T* x, const T* w, int64_t M, int64_t N, int64_t K, int64_t n0, int64_t n1) {
  // M ≤ 2 (batch-1/2 decode): 8 rows of W in flight; otherwise 4 × 4 accumulators.
  if (M == 1) return linear_cols<T, 1, 8>(out, N, x, K, w, K, n0, n1);
  if (M == 2) return linear_cols<T, 2, 8>(out, N, x, K, w, K, n0, n1);
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) linear_cols<T, 4, 4>(out + m * N, N, x + m * K, K, w, K, n0, n1);
  switch (M - m) {
    case 3: linear_cols<T, 3, 4>(out + m * N, N, x + m * K, K, w, K, n0, n1); break;
    case 2: linear_cols<T, 2, 4>(out + m * N, N, x + m * K, K, w, K, n0, n1); break;
    case 1: linear_cols<T, 1, 4>(out + m * N, N, x + m * K, K, w, K, n0, n1); break;
    default: break;
  }
}

void skinny_linear(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight) {
  constexpr const char* op = "skinny_linear";
  require_cpu(op, "x", x);
  check::dtype_in(op, "x", x, kFloatTypes);
  check::same_dtype(op, "weight", weight, "x", x);
  check::same_dtype(op, "out", out, "x", x);
  check::same_device(op, "weight", weight, "x", x);
  check::same_device(op, "out", out, "x", x);
  check::ndim(op, "x", x, 2, "[M, K]");
  check::ndim(op, "weight", weight, 2, "[N, K]");
  check::ndim(op, "out", out, 2, "[M, N]");
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  TORCH_CHECK(M <= kMaxM, op, ": x.shape[0] (M) must be <= ", kMaxM, " (use a GEMM for larger batches), got ", M);
  check::size_eq(op, "weight", weight, 1, K, "K = x.shape[1]");
  check::size_eq(op, "out", out, 0, M, "M = x.shape[0]");
  check::size_eq(op, "out", out, 1, N, "N = weight.shape[0]");
  check::contiguous(op, "x", x);
  check::contiguous(op, "weight", weight);
  check::contiguous(op, "out", out);
  check::no_overlap(op, "out", out, {{"x", &x}, {"weight", &weight}});
  if (M == 0 || N == 0) return;
  if (K == 0) {
    out.zero_();
    return;
  }
  // work per output column: the bytes of its weight row; at least 16 columns per task.
  const int64_t grain = parallel_grain(K * static_cast<int64_t>(x.element_size()), 16);
  MK_CPU_DISPATCH(x.scalar_type(), op, [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* wp = weight.const_data_ptr<scalar_t>();
    scalar_t* op_ = out.data_ptr<scalar_t>();
    at::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) { linear_rows(op_, xp, wp, M, N, K, n0, n1); });
  });
}

}  // namespace
}  // namespace mk::cpu

// CPU only (csrc/registration.cpp kCpuOnlySchemas): one op, no family list.
TORCH_LIBRARY_IMPL(mistral_kernels, CPU, m) { MK_IMPL_CPU(skinny_linear) }
