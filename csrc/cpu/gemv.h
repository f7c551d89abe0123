// cpu/gemv.h — the decode matmul core: out[m, n] = Σ_k x[m, k] · w[n, k] for M ≤ 16 rows of x and the
// output columns [n0, n1) of one thread. Framework-free (raw pointers; T = float or c10::BFloat16), used
// by skinny_linear (linear.cpp) and by the fused decode step (decode_layers.cpp).
//
// Shapes: M rows of x (decode: batch ≤ 16), K in features, N out features; NB rows of W reduced
// together, MB rows of x per register tile.
//
// Decode matmuls are memory-bound GEMVs: every weight byte is read once per step. For each group of NB
// rows of W the loop keeps MB × NB accumulators in registers and walks all row blocks of x over that
// group before moving on, so W is streamed from memory exactly once whatever M is (the group, NB·K
// elements, stays in L1 across the row blocks of x).
// Each dot product x[m]·w[n] is one 16-lane fp32 accumulation over k in steps of 16 (32 for AVX-512
// BF16), lanes summed by _mm512_reduce_add_ps: the result depends neither on M, on the tiling nor on
// the thread split.
//   bf16: AVX-512 BF16 `vdpbf16ps` (32 products per instruction, fp32 accumulation) when compiled
//         for a CPU that has it; else bf16 → fp32 conversion + FMA.
//   fp32: AVX-512F FMA; portable scalar code (16 partial sums, auto-vectorised) elsewhere.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace mk::cpu::gemv {

inline constexpr int kMaxM = 16;  // rows of x handled per call (skinny_linear falls back to ATen above this)

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

// acc[m][r] += Σ_k x[m, k] · w[r, k] (fp32 path; bf16 without AVX512-BF16).
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
inline void dot_block_bf16(const c10::BFloat16* x, int64_t ldx, const c10::BFloat16* w, int64_t K,
                           __m512 (&acc)[MB][NB], bool prefetch) {
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
  if constexpr (std::is_same_v<T, c10::BFloat16>)
    dot_block_bf16<MB, NB>(x, ldx, w + n * K, K, acc, prefetch);
  else
#endif
    dot_block_fma<T, MB, NB>(x, ldx, w + n * K, K, acc, prefetch);
  for (int m = 0; m < MB; ++m)
    for (int r = 0; r < NB; ++r) out[m * ldo + n + r] = from_f<T>(_mm512_reduce_add_ps(acc[m][r]));
}

// All M rows for the column group [n, n + NB): row blocks of 4 (4 × 4 accumulators + 4 W vectors fit the
// 32 zmm registers); M ≤ 2 (batch-1/2 decode) uses groups of 8 rows of W.
template <typename T, int NB>
inline void group(T* out, int64_t ldo, const T* x, int64_t ldx, const T* w, int64_t K, int64_t M, int64_t n) {
  if constexpr (NB == 8) {
    if (M == 1) return tile<T, 1, 8>(out, ldo, x, ldx, w, K, n, true);
    return tile<T, 2, 8>(out, ldo, x, ldx, w, K, n, true);
  } else {
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) tile<T, 4, NB>(out + m * ldo, ldo, x + m * ldx, ldx, w, K, n, m == 0);
    switch (M - m) {
      case 3: tile<T, 3, NB>(out + m * ldo, ldo, x + m * ldx, ldx, w, K, n, m == 0); break;
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
    for (; n + 8 <= n1; n += 8) group<T, 8>(out, ldo, x, ldx, w, K, M, n);
  } else {
    for (; n + 4 <= n1; n += 4) group<T, 4>(out, ldo, x, ldx, w, K, M, n);
  }
  for (; n < n1; ++n) group<T, 1>(out, ldo, x, ldx, w, K, M, n);
}

#else  // portable

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

}  // namespace mk::cpu::gemv
