// cpu/isa/gemv.cpp — gemv_rows (gemv.h) for one ISA level.
//
// Decode matmuls are memory-bound GEMVs: every weight byte is read once per step. For each group of NB
// rows of W the loop keeps MB × NB accumulators in registers and walks all row blocks of x over that
// group before moving on, so W is streamed from memory exactly once whatever M is (the group, NB·K
// elements, stays in L1 across the row blocks of x). Each dot product x[m]·w[n] is computed the same way
// whatever M, the tiling or the thread split are (one accumulation order per level).
//   avx512bf16  bf16: `vdpbf16ps` (32 products per instruction, fp32 accumulation); fp32 / fp16: FMA
//   avx512      16-lane FMA; bf16 / fp16 converted to fp32 on load (masked tails)
//   avx2        8-lane FMA; bf16 / fp16 converted on load; scalar tail of K % 8
//   generic     scalar code with 16 partial sums (auto-vectorised for the baseline)
#include "gemv.h"

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
inline void dot_block_fma(const T* x, int64_t ldx, const T* w, int64_t K, __m512 (&acc)[MB][NB], bool prefetch) {
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 mask = K - k >= 16 ? __mmask16(0xffff) : __mmask16((1u << (K - k)) - 1);
    __m512 wv[NB];
    for (int r = 0; r < NB; ++r) {
      wv[r] = load_f32x16(w + r * K + k, mask);
      if (prefetch) prefetch_next_block(w + (NB + r) * K + k);
    }
    for (int m = 0; m < MB; ++m) {
      const __m512 xv = load_f32x16(x + m * ldx + k, mask);
      for (int r = 0; r < NB; ++r) acc[m][r] = _mm512_fmadd_ps(xv, wv[r], acc[m][r]);
    }
  }
}

#if defined(__AVX512BF16__)
template <int MB, int NB>
inline void dot_block_bf16(const bf16* x, int64_t ldx, const bf16* w, int64_t K, __m512 (&acc)[MB][NB],
                           bool prefetch) {
  for (int64_t k = 0; k < K; k += 32) {
    const __mmask32 mask = K - k >= 32 ? __mmask32(0xffffffffu) : __mmask32((1ull << (K - k)) - 1);
    __m512bh wv[NB];
    for (int r = 0; r < NB; ++r) {
      wv[r] = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + r * K + k);
      if (prefetch) prefetch_next_block(w + (NB + r) * K + k);
    }
    for (int m = 0; m < MB; ++m) {
      const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mask, x + m * ldx + k);
      for (int r = 0; r < NB; ++r) acc[m][r] = _mm512_dpbf16_ps(acc[m][r], xv, wv[r]);
    }
  }
}
#endif

// Columns [n, n + NB) of rows [0, MB) of out (the first tile of a group prefetches the next group).
template <typename T, int MB, int NB>
inline void tile(T* out, int64_t ldo, const T* x, int64_t ldx, const T* w, int64_t K, int64_t n, bool prefetch) {
  __m512 acc[MB][NB];
  for (int m = 0; m < MB; ++m)
    for (int r = 0; r < NB; ++r) acc[m][r] = _mm512_setzero_ps();
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<T, bf16>)
    dot_block_bf16<MB, NB>(x, ldx, w + n * K, K, acc, prefetch);
  else
#endif
    dot_block_fma<T, MB, NB>(x, ldx, w + n * K, K, acc, prefetch);
  for (int m = 0; m < MB; ++m)
    for (int r = 0; r < NB; ++r) out[m * ldo + n + r] = from_f<T>(_mm512_reduce_add_ps(acc[m][r]));
}

// Row blocks of 4 (4 × 4 accumulators + 4 W vectors fit the 32 zmm registers); M ≤ 2 (batch-1/2 decode)
// uses groups of 8 rows of W.
constexpr int kRowBlock = 4;
constexpr int kWideNB = 8, kNarrowNB = 4;

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

// Columns [n, n + NB) of rows [0, MB) of out: K in chunks of 8 (16 ymm registers: MB·NB + NB + 1 ≤ 16),
// the last K % 8 products scalar.
template <typename T, int MB, int NB>
inline void tile(T* out, int64_t ldo, const T* x, int64_t ldx, const T* w, int64_t K, int64_t n, bool prefetch) {
  const int64_t K8 = K & ~int64_t{7};
  const T* wb = w + n * K;
  __m256 acc[MB][NB];
  for (int m = 0; m < MB; ++m)
    for (int r = 0; r < NB; ++r) acc[m][r] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K8; k += 8) {
    __m256 wv[NB];
    for (int r = 0; r < NB; ++r) {
      wv[r] = load8(wb + r * K + k);
      if (prefetch) _mm_prefetch(reinterpret_cast<const char*>(wb + (NB + r) * K + k), _MM_HINT_T0);
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

// Row blocks of 3 (3 × 3 accumulators + 3 W vectors + x fit the 16 ymm registers); M ≤ 2 uses groups of
// 4 rows of W (2 × 4 + 4 + 1 = 13 registers; 8 for M = 1 would need 17 at M = 2).
constexpr int kRowBlock = 3;
constexpr int kWideNB = 4, kNarrowNB = 3;

#endif

#if (defined(__AVX512F__) && defined(__AVX512BW__)) || (defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))

// All M rows for the column group [n, n + NB): the group's rows of W stay in L1 across the row blocks.
template <typename T, int NB>
inline void group(T* out, int64_t ldo, const T* x, int64_t ldx, const T* w, int64_t K, int64_t M, int64_t n) {
  if constexpr (NB == kWideNB) {  // only for M ≤ 2 (rows)
    if (M == 1) return tile<T, 1, NB>(out, ldo, x, ldx, w, K, n, true);
    return tile<T, 2, NB>(out, ldo, x, ldx, w, K, n, true);
  } else {
    int64_t m = 0;
    for (; m + kRowBlock <= M; m += kRowBlock)
      tile<T, kRowBlock, NB>(out + m * ldo, ldo, x + m * ldx, ldx, w, K, n, m == 0);
    switch (M - m) {
      case 3:
        if constexpr (kRowBlock > 3) tile<T, 3, NB>(out + m * ldo, ldo, x + m * ldx, ldx, w, K, n, m == 0);
        break;
      case 2: tile<T, 2, NB>(out + m * ldo, ldo, x + m * ldx, ldx, w, K, n, m == 0); break;
      case 1: tile<T, 1, NB>(out + m * ldo, ldo, x + m * ldx, ldx, w, K, n, m == 0); break;
      default: break;
    }
  }
}

template <typename T>
void rows(T* out, int64_t ldo, const T* x, int64_t ldx, const T* w, int64_t K, int64_t M, int64_t n0, int64_t n1) {
  if (M <= 0 || n0 >= n1) return;
  int64_t n = n0;
  if (M <= 2) {
    for (; n + kWideNB <= n1; n += kWideNB) group<T, kWideNB>(out, ldo, x, ldx, w, K, M, n);
  } else {
    for (; n + kNarrowNB <= n1; n += kNarrowNB) group<T, kNarrowNB>(out, ldo, x, ldx, w, K, M, n);
  }
  for (; n < n1; ++n) group<T, 1>(out, ldo, x, ldx, w, K, M, n);
}

#else  // generic

template <typename T>
void rows(T* out, int64_t ldo, const T* x, int64_t ldx, const T* w, int64_t K, int64_t M, int64_t n0, int64_t n1) {
  constexpr int L = 16;
  for (int64_t n = n0; n < n1; ++n) {
    const T* wr = w + n * K;
    for (int64_t m = 0; m < M; ++m) {
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

}  // namespace

void gemv_rows(Elem elem, void* out, int64_t ldo, const void* x, int64_t ldx, const void* w, int64_t K, int64_t M,
               int64_t n0, int64_t n1) {
  switch (elem) {
    case Elem::f32:
      return rows(static_cast<float*>(out), ldo, static_cast<const float*>(x), ldx, static_cast<const float*>(w), K, M,
                  n0, n1);
    case Elem::bf16:
      return rows(static_cast<bf16*>(out), ldo, static_cast<const bf16*>(x), ldx, static_cast<const bf16*>(w), K, M,
                  n0, n1);
    case Elem::f16:
      return rows(static_cast<f16*>(out), ldo, static_cast<const f16*>(x), ldx, static_cast<const f16*>(w), K, M, n0,
                  n1);
  }
}

MK_ISA_END
