// cpu/isa/quant_tiles.cpp — the fp32 prefill GEMM on a dequantized tile of W for one ISA level (interface and
// layout: quant_tiles.h). AVX-512F levels only; the others report no kernel (the glue then uses ATen's GEMM).
//
// Register tile: kRows rows of W × 32 rows of x (a pair of 16-row blocks of xt), 2·kRows fp32 accumulators.
// Per k: two vector loads of xt, kRows broadcast operands of W (embedded {1to16}), 2·kRows FMAs — bound by
// the FMA rate (Zen 4: one 512-bit FMA per cycle; 16 FMAs per 10 loads), 2·M·N·K FLOPs per call. The pair
// of xt blocks (K · 128 bytes) and the tile (≤ ~1 MB, the caller's) are reused from L2; each output is one
// FMA chain over k in order, so the result is exact up to fp32 rounding like any fp32 dot product.
#include "quant_tiles.h"

#include <algorithm>

#include "target.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

MK_ISA_BEGIN
namespace {

inline int64_t round16(int64_t m) { return (m + 15) / 16 * 16; }

#if defined(__AVX512F__)
constexpr int kRows = 8;  // rows of W per register tile

// c[i·32 + l] = Σ_k xt[k, l] · w[i, k] for i < R and l < 16·NB (NB blocks of xt from xb).
template <int R, int NB>
inline void micro(const float* xb, int64_t K, const float* w, float* c) {
  __m512 acc[R][NB];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 2
    for (int b = 0; b < NB; ++b) acc[i][b] = _mm512_setzero_ps();
  const float* x1 = xb + K * 16;
  for (int64_t k = 0; k < K; ++k) {
    __m512 xv[NB];
    xv[0] = _mm512_load_ps(xb + k * 16);
    if constexpr (NB == 2) xv[1] = _mm512_load_ps(x1 + k * 16);
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const __m512 wv = _mm512_set1_ps(w[i * K + k]);
#pragma GCC unroll 2
      for (int b = 0; b < NB; ++b) acc[i][b] = _mm512_fmadd_ps(xv[b], wv, acc[i][b]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 2
    for (int b = 0; b < NB; ++b) _mm512_store_ps(c + i * 32 + b * 16, acc[i][b]);
}

// The register tile of r ≤ kRows rows (fewer only at the end of a tile).
template <int NB, int R = kRows>
inline void micro_rows(int r, const float* xb, int64_t K, const float* w, float* c) {
  if constexpr (R > 1) {
    if (r < R) return micro_rows<NB, R - 1>(r, xb, K, w, c);
  }
  micro<R, NB>(xb, K, w, c);
}
#endif

}  // namespace

bool tile_gemm_supported() {
#if defined(__AVX512F__)
  return true;
#else
  return false;
#endif
}

int64_t tile_x_bytes(int64_t M, int64_t K) { return round16(M) * K * 4; }

void tile_pack_x(const float* x, int64_t M, int64_t K, int64_t b0, int64_t b1, float* xt) {
  for (int64_t b = b0; b < b1; ++b)
    for (int64_t l = 0; l < 16; ++l) {
      const int64_t m = 16 * b + l;
      const float* xr = x + std::min(m, M - 1) * K;
      float* d = xt + b * K * 16 + l;
      for (int64_t k = 0; k < K; ++k) d[k * 16] = m < M ? xr[k] : 0.0f;
    }
}

void tile_gemm(const float* xt, int64_t M, int64_t K, const float* w, int64_t R, float* y, int64_t ldy) {
#if defined(__AVX512F__)
  const int64_t nb = round16(M) / 16;
  alignas(64) float c[kRows * 32];
  for (int64_t b = 0; b < nb; b += 2) {  // a pair of 16-row blocks of x, every row group of the tile
    const int nbk = b + 1 < nb ? 2 : 1;
    const float* xb = xt + b * K * 16;
    const int64_t m0 = 16 * b, mlen = std::min<int64_t>(16 * nbk, M - m0);
    for (int64_t j0 = 0; j0 < R; j0 += kRows) {
      const int r = static_cast<int>(std::min<int64_t>(kRows, R - j0));
      if (nbk == 2)
        micro_rows<2>(r, xb, K, w + j0 * K, c);
      else
        micro_rows<1>(r, xb, K, w + j0 * K, c);
      float* yb = y + m0 * ldy + j0;
      for (int64_t l = 0; l < mlen; ++l)
        for (int i = 0; i < r; ++i) yb[l * ldy + i] = c[i * 32 + l];
    }
  }
#else
  (void)xt, (void)M, (void)K, (void)w, (void)R, (void)y, (void)ldy;
#endif
}

MK_ISA_END
