// cpu/isa/attention_tiled.h — the AVX-512 fp32 scan of a tile of query rows (prefill), query rows in lanes.
//
// Shapes: R ≤ 32 query rows (the q heads of one GQA group × a few query tokens), L = 16·NV lanes (NV = 1 or
// 2 vectors of 16 rows), D head_dim (multiple of 4, ≤ 256), KG = 8 keys per register group.
//
// Flash attention with the rows of the tile in the lanes of NV vectors (as a GEMM micro-kernel puts the M
// rows): q is transposed once per scan into Q^T [D][L] and the output accumulator kept as O^T [D][L], so
//   * scores of KG keys: S[c] (L lanes) = Σ_d k_c[d] · Q^T[d] — one broadcast of the cache's fp32 element
//     k_c[d] feeds NV FMAs, one load of Q^T[d] feeds KG·NV (no transposition of K, no horizontal sums);
//   * the online softmax is lane-wise: the group's max, the rescale factor alpha and l of all rows in one
//     vector each (OnlineSoftmax's rules, csrc/kernels/common.cuh, applied per lane: NaN poisons a row,
//     a row with nothing visible yet keeps shift 0);
//   * P·V: O^T[d] += Σ_c v_c[d] · P[c], 4 rows of O^T in registers while the KG probability vectors stay
//     in registers across the whole head dim.
// A key is read once per tile for every row of the tile (K/V reuse across the tile's R rows).
// Row r sees keys lo[r] ≤ j < hi[r]: other lanes get score -inf by a blend (a selection, never arithmetic)
// and p = 0, and their FMA is masked off in groups where some valid row cannot see some key, so a NaN in a
// key visible only to other rows never reaches a row (0·NaN). Lanes past R (padding) see nothing and are
// never written back. Results equal the portable scan's within fp32 rounding (other summation order).
#pragma once

#if defined(__AVX512F__)
#define MK_CPU_ATTN_TILED 1
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "../../kernels/common.cuh"
#include "target.h"
#include "vec_math_avx512.h"

MK_ISA_BEGIN
namespace attn::tiled {

inline constexpr int kKeys = 8;          // KG: keys per register group
inline constexpr int64_t kMinRows = 8;   // fewer rows (decode of a small GQA group): the per-row scan
inline constexpr int64_t kMaxRows = 32;  // L of NV = 2
inline constexpr int64_t kMaxD = 256;

// O^T [D][16·NV] += Σ_c v_c[d] · p[c] over the group's keys, 4 rows of O^T in registers at a time. Masked:
// key c reaches only the lanes in vis[c] (some valid row cannot see some key of the group).
template <int NV, bool Full>
__attribute__((always_inline)) inline void pv(float* ot, int64_t D, const float* const* vr,
                                              const __m512 (&p)[kKeys][NV], const __mmask16 (&vis)[kKeys][NV]) {
  constexpr int L = 16 * NV;
  for (int64_t d0 = 0; d0 < D; d0 += 4) {
    __m512 o[4][NV];
    #pragma GCC unroll 8
    for (int dd = 0; dd < 4; ++dd)
      #pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) o[dd][v] = _mm512_loadu_ps(ot + (d0 + dd) * L + 16 * v);
    #pragma GCC unroll 8
    for (int c = 0; c < kKeys; ++c)
      #pragma GCC unroll 8
      for (int dd = 0; dd < 4; ++dd) {
        const __m512 b = _mm512_set1_ps(vr[c][d0 + dd]);
        #pragma GCC unroll 8
        for (int v = 0; v < NV; ++v)
          o[dd][v] = Full ? _mm512_fmadd_ps(b, p[c][v], o[dd][v]) : _mm512_mask3_fmadd_ps(b, p[c][v], o[dd][v], vis[c][v]);
      }
    #pragma GCC unroll 8
    for (int dd = 0; dd < 4; ++dd)
      #pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) _mm512_storeu_ps(ot + (d0 + dd) * L + 16 * v, o[dd][v]);
  }
}

// Scan keys [kbeg, kend) through R ≤ 16·NV rows. q [R][D] (scaled), acc [R][D] and st [R] are read at the
// start and written at the end; qt, ot: scratch of D·16·NV floats each.
template <int NV, int DC>
void scan_d(int64_t R, int64_t D_arg, const float* q, float* acc, OnlineSoftmax* st, const int64_t* lo_r,
          const int64_t* hi_r, const PagedKV<const float>& kv, int64_t kbeg, int64_t kend, float* qt, float* ot) {
  constexpr int L = 16 * NV;
  const int64_t D = DC > 0 ? DC : D_arg;  // DC: a head dim known at compile time (0: any)
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const float kNaN = std::numeric_limits<float>::quiet_NaN();
  alignas(64) float mb[L], lb[L];
  alignas(64) int32_t lob[L], hib[L];
  for (int r = 0; r < L; ++r) {
    const bool in = r < R;
    for (int64_t d = 0; d < D; ++d) {
      qt[d * L + r] = in ? q[r * D + d] : 0.f;
      ot[d * L + r] = in ? acc[r * D + d] : 0.f;
    }
    mb[r] = in ? st[r].m : -kInf;
    lb[r] = in ? st[r].l : 0.f;
    lob[r] = in ? static_cast<int32_t>(lo_r[r]) : 0;
    hib[r] = in ? static_cast<int32_t>(hi_r[r]) : 0;  // padding: lo = hi, sees nothing
  }
  __m512 m[NV], l[NV];
  __m512i lo[NV], hi[NV];
  __mmask16 valid[NV];
  #pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) {
    m[v] = _mm512_load_ps(mb + 16 * v);
    l[v] = _mm512_load_ps(lb + 16 * v);
    lo[v] = _mm512_load_si512(lob + 16 * v);
    hi[v] = _mm512_load_si512(hib + 16 * v);
    const int64_t n = std::clamp<int64_t>(R - 16 * v, 0, 16);
    valid[v] = static_cast<__mmask16>((1u << n) - 1u);
  }
  alignas(64) static const float kZeros[kMaxD] = {};  // the rows of the keys past the end of a group
  const __m512 neg_inf = _mm512_set1_ps(-kInf), one = _mm512_set1_ps(1.f);

  for (int64_t j = kbeg; j < kend; j += kKeys) {
    const int nk = static_cast<int>(std::min<int64_t>(kKeys, kend - j));
    const float* kr[kKeys];
    const float* vr[kKeys];
    #pragma GCC unroll 8
    for (int c = 0; c < kKeys; ++c) {
      if (c < nk) {
        const int64_t off = kv.row(kv.slot(j + c));  // block ids checked by the glue (check::paged_indices_cpu)
        kr[c] = kv.k + off;
        vr[c] = kv.v + off;
      } else {
        kr[c] = vr[c] = kZeros;
      }
    }
    if (j + kKeys < kend) {  // the next group's rows (possibly in another physical block)
      const int64_t nn = std::min<int64_t>(kKeys, kend - j - kKeys);
      for (int64_t c = 0; c < nn; ++c) {
        const int64_t off = kv.row(kv.slot(j + kKeys + c));
        for (int64_t b = 0; b < D * 4; b += 64) {
          __builtin_prefetch(reinterpret_cast<const char*>(kv.k + off) + b, 0, 3);
          __builtin_prefetch(reinterpret_cast<const char*>(kv.v + off) + b, 0, 3);
        }
      }
    }
    // visibility of key j + c to each lane
    __mmask16 vis[kKeys][NV];
    bool full = true;  // every valid row sees every key of the group
    #pragma GCC unroll 8
    for (int c = 0; c < kKeys; ++c) {
      const __m512i jc = _mm512_set1_epi32(static_cast<int32_t>(j + c));
      #pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        vis[c][v] = c < nk ? static_cast<__mmask16>(_mm512_cmp_epi32_mask(lo[v], jc, _MM_CMPINT_LE) &
                                                    _mm512_cmp_epi32_mask(jc, hi[v], _MM_CMPINT_LT))
                           : static_cast<__mmask16>(0);
        if (c < nk) full = full && (vis[c][v] & valid[v]) == valid[v];
      }
    }
    // scores
    __m512 s[kKeys][NV];
    #pragma GCC unroll 8
    for (int c = 0; c < kKeys; ++c)
      #pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) s[c][v] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; ++d) {
      __m512 qd[NV];
      #pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) qd[v] = _mm512_loadu_ps(qt + d * L + 16 * v);
      #pragma GCC unroll 8
      for (int c = 0; c < kKeys; ++c) {
        const __m512 b = _mm512_set1_ps(kr[c][d]);
        #pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) s[c][v] = _mm512_fmadd_ps(b, qd[v], s[c][v]);
      }
    }
    // online softmax, lane-wise
    __m512 shift[NV];
    bool rescale = false;
    __m512 alpha[NV];
    #pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      __m512 cm = neg_inf;
      __mmask16 nan = 0;
      #pragma GCC unroll 8
      for (int c = 0; c < kKeys; ++c) {
        s[c][v] = _mm512_mask_blend_ps(vis[c][v], neg_inf, s[c][v]);
        nan |= _mm512_cmp_ps_mask(s[c][v], s[c][v], _CMP_UNORD_Q);
        cm = _mm512_max_ps(cm, s[c][v]);
      }
      nan |= _mm512_cmp_ps_mask(m[v], m[v], _CMP_UNORD_Q);  // nan_max: NaN stays NaN
      const __m512 m_new = _mm512_mask_mov_ps(_mm512_max_ps(m[v], cm), nan, _mm512_set1_ps(kNaN));
      shift[v] = _mm512_mask_mov_ps(m_new, _mm512_cmp_ps_mask(m_new, neg_inf, _CMP_EQ_OQ), _mm512_setzero_ps());
      alpha[v] = avx512::exp16(_mm512_sub_ps(m[v], shift[v]));  // 0 on a row's first visible key
      m[v] = m_new;
      rescale = rescale || (_mm512_cmp_ps_mask(alpha[v], one, _CMP_NEQ_UQ) & valid[v]) != 0;
      __m512 sum = _mm512_setzero_ps();
      #pragma GCC unroll 8
      for (int c = 0; c < kKeys; ++c) {
        s[c][v] = _mm512_maskz_mov_ps(vis[c][v], avx512::exp16(_mm512_sub_ps(s[c][v], shift[v])));  // p
        sum = _mm512_add_ps(sum, s[c][v]);
      }
      l[v] = _mm512_fmadd_ps(l[v], alpha[v], sum);
    }
    if (rescale)
      for (int64_t d = 0; d < D; ++d)
        #pragma GCC unroll 8
        for (int v = 0; v < NV; ++v)
          _mm512_storeu_ps(ot + d * L + 16 * v, _mm512_mul_ps(_mm512_loadu_ps(ot + d * L + 16 * v), alpha[v]));
    if (full)
      pv<NV, true>(ot, D, vr, s, vis);
    else
      pv<NV, false>(ot, D, vr, s, vis);
  }
  #pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) {
    _mm512_store_ps(mb + 16 * v, m[v]);
    _mm512_store_ps(lb + 16 * v, l[v]);
  }
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t d = 0; d < D; ++d) acc[r * D + d] = ot[d * L + r];
    st[r].m = mb[r];
    st[r].l = lb[r];
  }
}

// The scan for R rows (kMinRows … kMaxRows), D ≤ kMaxD a multiple of 4; the common head dims unrolled.
template <int NV>
void scan(int64_t R, int64_t D, const float* q, float* acc, OnlineSoftmax* st, const int64_t* lo,
          const int64_t* hi, const PagedKV<const float>& kv, int64_t kbeg, int64_t kend, float* qt, float* ot) {
  switch (D) {
    case 64: return scan_d<NV, 64>(R, D, q, acc, st, lo, hi, kv, kbeg, kend, qt, ot);
    case 128: return scan_d<NV, 128>(R, D, q, acc, st, lo, hi, kv, kbeg, kend, qt, ot);
    default: return scan_d<NV, 0>(R, D, q, acc, st, lo, hi, kv, kbeg, kend, qt, ot);
  }
}

}  // namespace attn::tiled
MK_ISA_END

#endif
