// cpu/isa/vec_math_avx512.h — AVX-512 versions of vec_math.h helpers (16 fp32 lanes) for hot loops that the
// compiler does not vectorise well: exp, silu, bf16 ↔ fp32 loads and stores.
// Compiled only when the target has AVX-512 F + BW (MK_CPU_AVX512); callers keep the portable path.
#pragma once

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define MK_CPU_AVX512 1
#include <immintrin.h>

#include "target.h"

#include <limits>

MK_ISA_BEGIN
namespace avx512 {

// exp of 16 floats: the range reduction and polynomial of exp_f (vec_math.h), 2^n applied by vscalefps
// (no integer exponent arithmetic). x < -87.3 (incl. -inf) → 0, x > 88.7 → +inf, NaN → NaN.
inline __m512 exp16(__m512 x) {
  // max(c, x) / min(c, x) return x when x is NaN, so NaN flows through the arithmetic.
  const __m512 xc = _mm512_min_ps(_mm512_set1_ps(88.7f), _mm512_max_ps(_mm512_set1_ps(-87.3f), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc));
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  __m512 y = _mm512_scalef_ps(p, n);
  y = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_NLT_UQ), y);  // x < -87.3 → 0
  return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, _mm512_set1_ps(88.7f), _CMP_GT_OQ),
                            _mm512_set1_ps(std::numeric_limits<float>::infinity()));
}

inline __m512 load_bf16x16(const bf16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// 16 floats → bf16, round to nearest even. With AVX512_BF16 one vcvtneps2bf16 (it flushes fp32
// denormals, |x| < 1.2e-38, to ±0 — the only difference from from_f); otherwise integer rounding
// bit-identical to from_f<BFloat16> (NaN → 0x7fc0).
inline void store_bf16x16(bf16* p, __m512 x) {
#if defined(__AVX512BF16__)
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), (__m256i)_mm512_cvtneps_pbh(x));
#else
  const __m512i b = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7fff)), odd), 16);
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_set1_epi32(0x7fc0));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
#endif
}

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const bf16* p) { return load_bf16x16(p); }
inline void store16(float* p, __m512 x) { _mm512_storeu_ps(p, x); }
inline void store16(bf16* p, __m512 x) { store_bf16x16(p, x); }
// float16: vcvtph2ps / vcvtps2ph (AVX-512F), round to nearest even as from_f<f16>.
inline __m512 load16(const f16* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline void store16(f16* p, __m512 x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// silu(g) = g / (1 + exp(-g)), as silu_f.
inline __m512 silu16(__m512 g) {
  const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
  return _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.f), e));
}

}  // namespace avx512
MK_ISA_END

#endif
