// cpu/isa/attention_avx512.h — AVX-512 chunk kernels of the CPU paged attention (attention_core.h's
// scan_keys_vec): bf16 caches with AVX-512 BF16, fp32 caches with AVX-512 F + BW.
//
// Shapes: R query rows, D head_dim (bf16: multiple of 64, ≤ 256; fp32: 64 or 128), n ≤ 16 keys per chunk
// (kVecChunk), NR ≤ 4 rows per P·V register tile.
//
// Scores: bf16 — q (bf16, unscaled) · k (bf16) with vdpbf16ps (bf16×bf16 products are exact in fp32, the
// accumulation is fp32), then × scale; fp32 — q (already × scale) · k by FMA. Key c of a row accumulates into
// its own 16-lane vector (the K rows of the chunk stay in L1, q stays in registers); the 16 vectors are
// reduced to one vector of 16 scores by a fixed shuffle tree (deterministic). Softmax of the chunk is
// vectorised (one max, one exp pass, one rescale per row and chunk). P·V: the V row is loaded as fp32 once
// per tile of NR rows and 64 columns and FMA'd into NR×4 accumulators held in registers. Every row's
// arithmetic is its own (the tile only shares the loads): a row's output does not depend on the rows
// scanned with it (a speculative verify row equals its plain decode).
// Keys outside a row's visible range get score -inf by a blend (never arithmetic), p = 0; a key that no
// row of the tile sees is never loaded, so NaN in unused cache slots cannot reach the output.
#pragma once

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define MK_CPU_ATTN_AVX512 1
#if defined(__AVX512BF16__)
#define MK_CPU_ATTN_AVX512BF16 1
#endif
#include <immintrin.h>

#include "target.h"
#include "vec_math_avx512.h"

#include <cstdint>
#include <limits>

MK_ISA_BEGIN
namespace attn::avx512 {

using MK_ISA_NS::avx512::exp16;
using MK_ISA_NS::avx512::load16;

inline constexpr int64_t kVecChunk = 16;

// Lane i of the result = horizontal sum of v[i], i < 16 (fixed shuffle tree).
inline __m512 hsum16(const __m512* v) {
  __m512 u[4];
  for (int g = 0; g < 4; ++g) {
    const __m512 a = v[4 * g], b = v[4 * g + 1], c = v[4 * g + 2], d = v[4 * g + 3];
    const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));  // [a02 b02 a13 b13]
    const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    u[g] = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));  // per 128-bit lane [a b c d]
  }
  const __m512 x01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 x23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(x01, x23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(x01, x23, _MM_SHUFFLE(3, 1, 3, 1)));
}

// The 16-lane score vector of keys [c0, c1) from the per-key accumulators v (lanes outside: -inf, by a blend).
inline __m512 masked_scores(const __m512* v, int64_t c0, int64_t c1, float scale) {
  const __mmask16 vis = static_cast<__mmask16>(((1u << c1) - 1u) & ~((1u << c0) - 1u));
  return _mm512_mask_mul_ps(_mm512_set1_ps(-std::numeric_limits<float>::infinity()), vis, hsum16(v),
                            _mm512_set1_ps(scale));
}

#if defined(__AVX512BF16__)
// Scores of one row for keys [c0, c1) of a chunk of n ≤ 16 keys (key c at k0 + c*stride); lanes outside
// [c0, c1) are -inf. q: D/32 registers of bf16 pairs.
template <int QV>
inline __m512 row_scores(const __m512bh* q, const bf16* k0, int64_t stride, int64_t c0, int64_t c1,
                         float scale) {
  __m512 v[16];
  for (int c = 0; c < 16; ++c) {
    __m512 acc = _mm512_setzero_ps();
    if (c >= c0 && c < c1) {
      const bf16* k = k0 + c * stride;
      for (int i = 0; i < QV; ++i)
        acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(k + 32 * i), q[i]);
    }
    v[c] = acc;
  }
  return masked_scores(v, c0, c1, scale);
}
#endif

// The same for an fp32 cache: q (× the softmax scale already) in D/16 registers.
template <int QV>
inline __m512 row_scores(const __m512* q, const float* k0, int64_t stride, int64_t c0, int64_t c1) {
  __m512 v[16];
  for (int c = 0; c < 16; ++c) {
    __m512 acc = _mm512_setzero_ps();
    if (c >= c0 && c < c1) {
      const float* k = k0 + c * stride;
      for (int i = 0; i < QV; ++i) acc = _mm512_fmadd_ps(_mm512_loadu_ps(k + 16 * i), q[i], acc);
    }
    v[c] = acc;
  }
  return masked_scores(v, c0, c1, 1.0f);
}

// acc rows [NR][D] += Σ_c p[r][c] · v[c] over the keys c that row r sees (bit c of row_live[r]); live = the
// union of row_live (the V rows loaded). A key row r cannot see is never multiplied into it (a masked
// select, not p = 0: 0·NaN would leak a NaN of a key visible only to another row of the tile).
template <int NR, typename T>
inline void tile_pv(float* acc, int64_t D, const float* p, int64_t kp, const T* v0, int64_t stride,
                    uint32_t live, const uint32_t* row_live) {
  for (int64_t d0 = 0; d0 < D; d0 += 64) {
    __m512 a[NR][4];
    for (int r = 0; r < NR; ++r)
      for (int u = 0; u < 4; ++u) a[r][u] = _mm512_loadu_ps(acc + r * D + d0 + 16 * u);
    for (uint32_t m = live; m != 0; m &= m - 1) {
      const int c = __builtin_ctz(m);
      const T* v = v0 + c * stride + d0;
      __m512 x[4];
      for (int u = 0; u < 4; ++u) x[u] = load16(v + 16 * u);
      for (int r = 0; r < NR; ++r) {
        const __m512 pr = _mm512_set1_ps(p[r * kp + c]);
        const __mmask16 sees = ((row_live[r] >> c) & 1u) ? 0xFFFF : 0;
        for (int u = 0; u < 4; ++u) a[r][u] = _mm512_mask3_fmadd_ps(pr, x[u], a[r][u], sees);
      }
    }
    for (int r = 0; r < NR; ++r)
      for (int u = 0; u < 4; ++u) _mm512_storeu_ps(acc + r * D + d0 + 16 * u, a[r][u]);
  }
}

}  // namespace attn::avx512
MK_ISA_END

#endif
