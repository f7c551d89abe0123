// cpu/isa/linear.cpp — linear_cols (linear.h) for one ISA level: the GEMV of skinny_linear.
//
// Decode matmuls are memory-bound GEMVs: every weight byte is read once per step and the roofline is
// N·K·sizeof(T) / bandwidth. For each group of NB rows of W the kernel keeps MB × NB accumulators in
// registers, so x (tiny, L1-resident) is re-read instead of W. Results do not depend on how the caller
// splits [n0, n1) (each dot product is computed the same way whatever the split).
//   avx512bf16  bf16: `vdpbf16ps` (32 products per instruction, fp32 accumulation); fp32 / fp16: FMA
//   avx512      16-lane FMA; bf16 / fp16 converted to fp32 on load (masked tails)
//   avx2        8-lane FMA, NB rows of W in flight; bf16 / fp16 converted on load; scalar tail
//   generic     scalar code with 16 partial sums (auto-vectorised for the baseline)
#include "linear.h"

#include <type_traits>

#include "target.h"

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

MK_ISA_BEGIN
namespace {

#if defined(__AVX512F__) && defined(__AVX512BW__)

// The NB rows of W being reduced are short (K·sizeof(T) bytes each), too short for the hardware
// prefetcher to ramp up on its own: touch the same offset of the next row block while computing this
// one, so the next block's lines are in flight (prefetches past the end of W are harmless no-ops).
template <typename T>
inline void prefetch_next_block(const T* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0);
}

inline __m512 load_f32x16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load_f32x16(const bf16* p, __mmask16 m) {
  const __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline __m512 load_f32x16(const f16* p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }

// acc[m][r] += Σ_k x[m, k] · w[r, k] over K in chunks of 16 (fp32, fp16; bf16 without AVX512-BF16).
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
inline void dot_block_bf16(const bf16* x, int64_t ldx, const bf16* w, int64_t K, __m512 (&acc)[MB][NB]) {
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
void cols(T* out, int64_t ldo, const T* x, int64_t ldx, const T* w, int64_t K, int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + NB <= n1; n += NB) {
    __m512 acc[MB][NB];
    for (int m = 0; m < MB; ++m)
      for (int r = 0; r < NB; ++r) acc[m][r] = _mm512_setzero_ps();
#if defined(__AVX512BF16__)
    if constexpr (std::is_same_v<T, bf16>)
      dot_block_bf16<MB, NB>(x, ldx, w + n * K, K, acc);
    else
#endif
      dot_block_fma<T, MB, NB>(x, ldx, w + n * K, K, acc);
    for (int m = 0; m < MB; ++m)
      for (int r = 0; r < NB; ++r) out[m * ldo + n + r] = from_f<T>(_mm512_reduce_add_ps(acc[m][r]));
  }
  for (; n < n1; ++n) cols<T, MB, 1>(out, ldo, x, ldx, w, K, n, n + 1);
}

#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const bf16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m256 load8(const f16* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

// Sum of the 8 lanes in a fixed order.
inline float hsum8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

// Columns [n0, n1) of out for rows [0, MB) of x: K in chunks of 8 (16 ymm registers: MB·NB + NB + 1 ≤ 16),
// the last K % 8 products scalar.
template <typename T, int MB, int NB>
void cols(T* out, int64_t ldo, const T* x, int64_t ldx, const T* w, int64_t K, int64_t n0, int64_t n1) {
  const int64_t K8 = K & ~int64_t{7};
  int64_t n = n0;
  for (; n + NB <= n1; n += NB) {
    const T* wb = w + n * K;
    __m256 acc[MB][NB];
    for (int m = 0; m < MB; ++m)
      for (int r = 0; r < NB; ++r) acc[m][r] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K8; k += 8) {
      __m256 wv[NB];
      for (int r = 0; r < NB; ++r) {
        wv[r] = load8(wb + r * K + k);
        _mm_prefetch(reinterpret_cast<const char*>(wb + (NB + r) * K + k), _MM_HINT_T0);
      }
      for (int m = 0; m < MB; ++m) {
        const __m256 xv = load8(x + m * ldx + k);
        for (int r = 0; r < NB; ++r) acc[m][r] = _mm256_fmadd_ps(xv, wv[r], acc[m][r]);
      }
    }
    for (int m = 0; m < MB; ++m)
      for (int r = 0; r < NB; ++r) {
        float s = hsum8(acc[m][r]);
        for (int64_t k = K8; k < K; ++k) s += to_f(x[m * ldx + k]) * to_f(wb[r * K + k]);
        out[m * ldo + n + r] = from_f<T>(s);
      }
  }
  for (; n < n1; ++n) cols<T, MB, 1>(out, ldo, x, ldx, w, K, n, n + 1);
}

#else  // generic

template <typename T, int MB, int NB>
void cols(T* out, int64_t ldo, const T* x, int64_t ldx, const T* w, int64_t K, int64_t n0, int64_t n1) {
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

// Rows of x: M ≤ 2 (batch-1/2 decode) with 8 rows of W in flight (AVX2: 4 for M = 2), otherwise blocks
// of 4 rows × 4 accumulators (4 × 4 + 4 W vectors fit the 32 zmm registers; AVX2: 3 rows × 3).
template <typename T>
void rows(T* out, const T* x, const T* w, int64_t M, int64_t N, int64_t K, int64_t n0, int64_t n1) {
#if !defined(__AVX512F__) && defined(__AVX2__)
  constexpr int kRowBlock = 3;
  if (M == 1) return cols<T, 1, 8>(out, N, x, K, w, K, n0, n1);
  if (M == 2) return cols<T, 2, 4>(out, N, x, K, w, K, n0, n1);
  int64_t m = 0;
  for (; m + kRowBlock <= M; m += kRowBlock) cols<T, 3, 3>(out + m * N, N, x + m * K, K, w, K, n0, n1);
  switch (M - m) {
    case 2: cols<T, 2, 4>(out + m * N, N, x + m * K, K, w, K, n0, n1); break;
    case 1: cols<T, 1, 8>(out + m * N, N, x + m * K, K, w, K, n0, n1); break;
    default: break;
  }
#else
  if (M == 1) return cols<T, 1, 8>(out, N, x, K, w, K, n0, n1);
  if (M == 2) return cols<T, 2, 8>(out, N, x, K, w, K, n0, n1);
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) cols<T, 4, 4>(out + m * N, N, x + m * K, K, w, K, n0, n1);
  switch (M - m) {
    case 3: cols<T, 3, 4>(out + m * N, N, x + m * K, K, w, K, n0, n1); break;
    case 2: cols<T, 2, 4>(out + m * N, N, x + m * K, K, w, K, n0, n1); break;
    case 1: cols<T, 1, 4>(out + m * N, N, x + m * K, K, w, K, n0, n1); break;
    default: break;
  }
#endif
}

}  // namespace

void linear_cols(Elem elem, void* out, const void* x, const void* w, int64_t M, int64_t N, int64_t K, int64_t n0,
                 int64_t n1) {
  switch (elem) {
    case Elem::f32:
      return rows(static_cast<float*>(out), static_cast<const float*>(x), static_cast<const float*>(w), M, N, K, n0, n1);
    case Elem::bf16:
      return rows(static_cast<bf16*>(out), static_cast<const bf16*>(x), static_cast<const bf16*>(w), M, N, K, n0, n1);
    case Elem::f16:
      return rows(static_cast<f16*>(out), static_cast<const f16*>(x), static_cast<const f16*>(w), M, N, K, n0, n1);
  }
}

MK_ISA_END
