// cpu/isa/quant_gemm8.cpp — the int8-activation prefill GEMM on a decoded tile of W for one ISA level
// (interface, layouts and arithmetic: quant_gemm8.h). AVX512-VNNI levels only; the others report no kernel.
//
// Register tile: kRows rows of W × 16·kBlocks rows of x (kBlocks 64-byte vectors of xq). Per k-quad: kBlocks
// loads of xq, kRows broadcasts of 4 codes, kRows·kBlocks vpdpbusd (int32 accumulators, exact). Then per
// accumulator: the 32-blocks, per chunk of 8 vpdpbusd, a vpsubd or an FMA for the offset, a conversion and two
// fp32 operations; the K-quants, per sub-block (8 vpdpbusd, Q6_K 4) a vpmulld + vpaddd, and per super-block
// P vpdpwssd, two conversions and four fp32 operations. Bound: vpdpbusd issue (Zen 4: one 512-bit per cycle,
// 64 multiply-adds) plus that epilogue work; 2·M·N·K integer operations per call.
#include "quant_gemm8.h"

#include "quant_kernels.h"
#include "target.h"

MK_ISA_BEGIN
namespace {

#if defined(MK_QUANT_CODES) && defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define MK_GEMM8 1

#if !defined(MK_GEMM8_ROWS)
#define MK_GEMM8_ROWS 4
#endif
#if !defined(MK_GEMM8_BLOCKS)
#define MK_GEMM8_BLOCKS 2
#endif
constexpr int kRows = MK_GEMM8_ROWS;      // rows of W per register tile
constexpr int kBlocks = MK_GEMM8_BLOCKS;  // 16-row blocks of x per register tile

template <int32_t QT>
constexpr bool kChunked = QT == ::mk::kQ4_0 || QT == ::mk::kQ4_1 || QT == ::mk::kQ8_0;
template <int32_t QT>
constexpr bool kSuper = QT == ::mk::kQ4_K || QT == ::mk::kQ5_K || QT == ::mk::kQ6_K;
template <int32_t QT>
constexpr bool kFormat = kChunked<QT> || kSuper<QT>;
// The 32-blocks: the fixed offset (o = −off · s), 0 for Q4_1 (an offset of its own).
template <int32_t QT>
constexpr int kOff = QT == ::mk::kQ4_0 ? 8 : QT == ::mk::kQ8_0 ? 128 : 0;
// The K-quants: sub-blocks per super-block (one integer scale each) and int16 pairs of their offset terms.
template <int32_t QT>
constexpr int kSubs = QT == ::mk::kQ6_K ? 16 : 8;
template <int32_t QT>
constexpr int kPairs = kSubs<QT> / 2;

inline int64_t up64(int64_t n) { return (n + 63) / 64 * 64; }

// Byte offsets of the parts of the prepared x (after xq [Mp/16][K/4][16][4]): the 32-blocks dx [Mp/16][K/32][16]
// fp32 then xo [Mp/16][K/32][16]; the K-quants dk [Mp/16][K/256][16] fp32 then xs [Mp/16][K/256][P][16] int32.
struct XParts {
  int64_t a, b, total;
};
template <int32_t QT>
XParts x_parts(int64_t M, int64_t K) {
  const int64_t mp = (M + 15) / 16 * 16;
  if constexpr (kChunked<QT>) return {mp * K, mp * K + mp * (K / 32) * 4, mp * K + 2 * mp * (K / 32) * 4};
  const int64_t kb = K / 256;
  return {mp * K, mp * K + mp * kb * 4, mp * K + mp * kb * 4 + mp * kb * kPairs<QT> * 4};
}
// Byte offsets of the parts of a tile (after codes [R][K]): the 32-blocks s [R][K/32] fp32, o [R][K/32] fp32
// (Q4_1 only); the K-quants sc [R][K/256][NS] int32, mp [R][K/256][P] int32, dd [R][K/256][2] fp32.
struct TileParts {
  int64_t a, b, c, total;
};
template <int32_t QT>
TileParts tile_parts(int64_t R, int64_t K) {
  const int64_t a = up64(R * K);
  if constexpr (kChunked<QT>) {
    const int64_t b = a + up64(R * (K / 32) * 4);
    return {a, b, b, kOff<QT> == 0 ? b + up64(R * (K / 32) * 4) : b};
  }
  const int64_t kb = K / 256;
  const int64_t b = a + up64(R * kb * kSubs<QT> * 4), c = b + up64(R * kb * kPairs<QT> * 4);
  return {a, b, c, c + up64(R * kb * 8)};
}

// One row of bf16 x quantized into lane l of block b of the prepared x (zeros for m ≥ M).
template <int32_t QT>
void prepare_row(const uint16_t* xr, bool valid, int64_t K, int l, int8_t* xq, uint8_t* pa, uint8_t* pb,
                 int8_t* qrow, int16_t* bs, float* dk) {
  auto put = [&](uint8_t* base, int64_t i, auto v) { std::memcpy(base + (i * 16 + l) * 4, &v, 4); };
  if constexpr (kChunked<QT>) {
    for (int64_t c = 0; c < K / 32; ++c) {
      int32_t sums[2] = {0, 0};
      const float d = valid ? quant::quantize_chunk32(xr + 32 * c, qrow + 32 * c, sums) : 0.0f;
      const int32_t qs = sums[0] + sums[1];
      put(pa, c, d);
      if constexpr (kOff<QT> != 0)
        put(pb, c, kOff<QT> * qs);
      else
        put(pb, c, d * static_cast<float>(qs));
    }
  } else {
    if (valid) quant::quantize_x_q8k(xr, 1, K, qrow, dk, bs);
    for (int64_t b = 0; b < K / 256; ++b) {
      put(pa, b, valid ? dk[b] : 0.0f);
      for (int p = 0; p < kPairs<QT>; ++p) {
        // the sums of q over sub-blocks 2p, 2p + 1 (per 16 for Q6_K, per 32 otherwise) as an int16 pair
        const int16_t* h = bs + 16 * b;
        int32_t lo = 0, hi = 0;
        if (valid) {
          if constexpr (QT == ::mk::kQ6_K)
            lo = h[2 * p], hi = h[2 * p + 1];
          else
            lo = h[4 * p] + h[4 * p + 1], hi = h[4 * p + 2] + h[4 * p + 3];
        }
        put(pb, b * kPairs<QT> + p, static_cast<int32_t>((static_cast<uint32_t>(hi) << 16) | static_cast<uint16_t>(lo)));
      }
    }
  }
  if (!valid) std::memset(qrow, 0, static_cast<size_t>(K));
  for (int64_t j = 0; j < K / 4; ++j) std::memcpy(xq + j * 64 + 4 * l, qrow + 4 * j, 4);
}

template <int32_t QT>
void prepare_x(const uint16_t* x, int64_t M, int64_t K, int64_t b0, int64_t b1, uint8_t* xp) {
  const XParts p = x_parts<QT>(M, K);
  const int64_t per = kChunked<QT> ? K / 32 : (K / 256) * kPairs<QT>;  // entries of part b per lane
  const int64_t pera = kChunked<QT> ? K / 32 : K / 256;
  quant::FloatBuf scratch(K / 4 + K / 32 + K / 256 + 1);  // one row: q int8 [K], Σ q per 16 int16 [K / 16], dk
  auto* qrow = reinterpret_cast<int8_t*>(scratch.p);
  auto* bs = reinterpret_cast<int16_t*>(qrow + K);
  float* dk = scratch.p + K / 4 + K / 32;
  for (int64_t b = b0; b < b1; ++b)
    for (int l = 0; l < 16; ++l) {
      const int64_t m = 16 * b + l;
      prepare_row<QT>(x + std::min(m, M - 1) * K, m < M, K, l, reinterpret_cast<int8_t*>(xp) + b * 16 * K,
                      xp + p.a + b * pera * 64, xp + p.b + b * per * 64, qrow, bs, dk);
    }
}

// One K-quant super-block's integer scales and offset pairs (vectorised: a tile decode is ~N·K / 256 of these).
template <int32_t QT>
inline void super_scales(const uint8_t* blk, int32_t* sc, int32_t* mp, float* dd) {
  if constexpr (QT == ::mk::kQ6_K) {  // sc int8 [16]; pairs (−32·sc_2p, −32·sc_2p+1) as int16
    const __m128i s8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192));
    _mm512_storeu_si512(sc, _mm512_cvtepi8_epi32(s8));
    const __m256i s16 = _mm256_cvtepi8_epi16(s8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(mp), _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(s16, 5)));
    dd[0] = quant::fp16_at(blk + 208), dd[1] = 0.0f;
  } else {  // sc_s and m_s 6-bit; pairs (m_2p, m_2p+1) as int16
    uint32_t scw[2], mnw[2];
    quant::k4_scale_bytes(blk + 4, scw, mnw);
    const __m128i s8 = _mm_set_epi32(0, 0, static_cast<int>(scw[1]), static_cast<int>(scw[0]));
    const __m128i m8 = _mm_set_epi32(0, 0, static_cast<int>(mnw[1]), static_cast<int>(mnw[0]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(sc), _mm256_cvtepu8_epi32(s8));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(mp), _mm_cvtepu8_epi16(m8));
    dd[0] = quant::fp16_at(blk), dd[1] = quant::fp16_at(blk + 2);
  }
}

template <int32_t QT>
void decode_tile(const uint8_t* w, int64_t K, int64_t n0, int64_t n1, uint8_t* tile) {
  constexpr int QK = quant::Geometry<QT>::QK, BYTES = quant::Geometry<QT>::BYTES;
  const int64_t R = n1 - n0, nblocks = K / QK;
  const TileParts p = tile_parts<QT>(R, K);
  for (int64_t r = 0; r < R; ++r) {
    const uint8_t* row = w + (n0 + r) * nblocks * BYTES;
    uint8_t* codes = tile + r * K;
    for (int64_t b = 0; b < nblocks; ++b) {
      const uint8_t* blk = row + b * BYTES;
      auto* out = reinterpret_cast<__m256i*>(codes + b * QK);
      if constexpr (kChunked<QT>) {
        quant::decode_codes<QT>(blk, [&](int, __m256i cv, float s0, float, float mn) {
          if constexpr (QT == ::mk::kQ8_0) cv = _mm256_xor_si256(cv, _mm256_set1_epi8(static_cast<char>(0x80)));
          _mm256_storeu_si256(out, cv);
          reinterpret_cast<float*>(tile + p.a)[r * (K / 32) + b] = s0;
          if constexpr (kOff<QT> == 0) reinterpret_cast<float*>(tile + p.b)[r * (K / 32) + b] = mn;
        });
      } else {
        if constexpr (QT == ::mk::kQ6_K) {
          quant::decode_codes<QT>(blk, [&](int c, __m256i cv, float, float, float) {
            _mm256_storeu_si256(out + c, _mm256_add_epi8(cv, _mm256_set1_epi8(32)));  // q ∈ 0..63
          });
        } else {
          quant::k4_codes<QT>(blk, [&](int c, __m256i cv) { _mm256_storeu_si256(out + c, cv); });
        }
        const int64_t i = r * nblocks + b;
        super_scales<QT>(blk, reinterpret_cast<int32_t*>(tile + p.a) + i * kSubs<QT>,
                         reinterpret_cast<int32_t*>(tile + p.b) + i * kPairs<QT>,
                         reinterpret_cast<float*>(tile + p.c) + i * 2);
      }
    }
  }
}

// acc[r][v] (lane l) = y[16·v + l, r] over the whole K, for NR rows of W (tile row 0 of them at r0) and NB
// blocks of x (block 0 of them at b0).
template <int32_t QT, int NR, int NB>
__attribute__((always_inline)) inline void micro(const uint8_t* xp, const XParts& xpp, int64_t b0, int64_t K,
                                                 const uint8_t* tile, const TileParts& tp, int64_t r0,
                                                 __m512 (&acc)[NR][NB]) {
  const int8_t* xq = reinterpret_cast<const int8_t*>(xp) + b0 * 16 * K;
  const uint8_t* codes = tile + r0 * K;
#pragma GCC unroll 16
  for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NB; ++v) acc[r][v] = _mm512_setzero_ps();
  // ai[r][v] += Σ over the k-quads [q0, q0 + J) of codes · q (exact)
  auto dots = [&]<int J>(int64_t q0, __m512i (&ai)[NR][NB]) {
#pragma GCC unroll 16
    for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NB; ++v) ai[r][v] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int j = 0; j < J; ++j) {
      const int64_t kq = q0 + j;
      __m512i xv[NB];
#pragma GCC unroll 4
      for (int v = 0; v < NB; ++v) xv[v] = _mm512_load_si512(xq + v * 16 * K + kq * 64);
#pragma GCC unroll 16
      for (int r = 0; r < NR; ++r) {
        int32_t c4;
        std::memcpy(&c4, codes + r * K + 4 * kq, 4);
        const __m512i wb = _mm512_set1_epi32(c4);
#pragma GCC unroll 4
        for (int v = 0; v < NB; ++v) ai[r][v] = _mm512_dpbusd_epi32(ai[r][v], wb, xv[v]);
      }
    }
  };
  if constexpr (kChunked<QT>) {
    // per chunk of 32: acc += (Σ c·q [− off · Σ q]) · dx · s  [+ o · dx · Σ q]
    const int64_t C = K / 32;
    const float* dx = reinterpret_cast<const float*>(xp + xpp.a) + b0 * C * 16;
    const uint8_t* xo = xp + xpp.b + b0 * C * 64;
    const float* s = reinterpret_cast<const float*>(tile + tp.a) + r0 * C;
    const float* o = reinterpret_cast<const float*>(tile + tp.b) + r0 * C;
    for (int64_t c = 0; c < C; ++c) {
      __m512i ai[NR][NB];
      dots.template operator()<8>(c * 8, ai);
      __m512 dxv[NB];
      __m512i xov[NB];
#pragma GCC unroll 4
      for (int v = 0; v < NB; ++v) {
        dxv[v] = _mm512_load_ps(dx + (v * C + c) * 16);
        xov[v] = _mm512_load_si512(xo + (v * C + c) * 64);
      }
#pragma GCC unroll 16
      for (int r = 0; r < NR; ++r) {
        const __m512 sv = _mm512_set1_ps(s[r * C + c]);
#pragma GCC unroll 4
        for (int v = 0; v < NB; ++v) {
          __m512i t = ai[r][v];
          if constexpr (kOff<QT> != 0) t = _mm512_sub_epi32(t, xov[v]);
          acc[r][v] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(t), dxv[v]), sv, acc[r][v]);
          if constexpr (kOff<QT> == 0)
            acc[r][v] = _mm512_fmadd_ps(_mm512_set1_ps(o[r * C + c]), _mm512_castsi512_ps(xov[v]), acc[r][v]);
        }
      }
    }
  } else {
    // per super-block: S = Σ_s sc_s · Σ c·q (int32), T = Σ_pairs off · Σ q (vpdpwssd); then
    //   Q6_K: acc += (S + T) · dk · d      (T: −32 · sc per 16)
    //   Q4_K / Q5_K: acc += S · dk · d − T · dk · dmin      (T: m per 32)
    constexpr int NS = kSubs<QT>, P = kPairs<QT>, J = 64 / NS;
    const int64_t KB = K / 256;
    const float* dk = reinterpret_cast<const float*>(xp + xpp.a) + b0 * KB * 16;
    const uint8_t* xs = xp + xpp.b + b0 * KB * P * 64;
    const int32_t* sc = reinterpret_cast<const int32_t*>(tile + tp.a) + r0 * KB * NS;
    const int32_t* mp = reinterpret_cast<const int32_t*>(tile + tp.b) + r0 * KB * P;
    const float* dd = reinterpret_cast<const float*>(tile + tp.c) + r0 * KB * 2;
    for (int64_t b = 0; b < KB; ++b) {
      __m512i sacc[NR][NB], ai[NR][NB];
#pragma GCC unroll 16
      for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
        for (int v = 0; v < NB; ++v) sacc[r][v] = _mm512_setzero_si512();
      for (int h = 0; h < NS; ++h) {
        dots.template operator()<J>(b * 64 + h * J, ai);
#pragma GCC unroll 16
        for (int r = 0; r < NR; ++r) {
          const __m512i scv = _mm512_set1_epi32(sc[(r * KB + b) * NS + h]);
#pragma GCC unroll 4
          for (int v = 0; v < NB; ++v) sacc[r][v] = _mm512_add_epi32(sacc[r][v], _mm512_mullo_epi32(ai[r][v], scv));
        }
      }
      __m512i (&t)[NR][NB] = QT == ::mk::kQ6_K ? sacc : ai;
      if constexpr (QT != ::mk::kQ6_K) {
#pragma GCC unroll 16
        for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
          for (int v = 0; v < NB; ++v) ai[r][v] = _mm512_setzero_si512();
      }
#pragma GCC unroll 8
      for (int q = 0; q < P; ++q) {
        __m512i xsv[NB];
#pragma GCC unroll 4
        for (int v = 0; v < NB; ++v) xsv[v] = _mm512_load_si512(xs + ((v * KB + b) * P + q) * 64);
#pragma GCC unroll 16
        for (int r = 0; r < NR; ++r) {
          const __m512i mv = _mm512_set1_epi32(mp[(r * KB + b) * P + q]);
#pragma GCC unroll 4
          for (int v = 0; v < NB; ++v) t[r][v] = _mm512_dpwssd_epi32(t[r][v], xsv[v], mv);
        }
      }
      __m512 dkv[NB];
#pragma GCC unroll 4
      for (int v = 0; v < NB; ++v) dkv[v] = _mm512_load_ps(dk + (v * KB + b) * 16);
#pragma GCC unroll 16
      for (int r = 0; r < NR; ++r) {
        const __m512 dv = _mm512_set1_ps(dd[(r * KB + b) * 2]);
#pragma GCC unroll 4
        for (int v = 0; v < NB; ++v) {
          acc[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sacc[r][v]), _mm512_mul_ps(dkv[v], dv), acc[r][v]);
          if constexpr (QT != ::mk::kQ6_K) {
            const __m512 mv = _mm512_set1_ps(dd[(r * KB + b) * 2 + 1]);
            acc[r][v] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(ai[r][v]), _mm512_mul_ps(dkv[v], mv), acc[r][v]);
          }
        }
      }
    }
  }
}

// The register tile of nr ≤ kRows rows of W (fewer only at the end of a tile) and NB blocks of x, stored to y
// (at row 16·b0, column r0).
template <int32_t QT, int NB, int NR = kRows>
void tile_rows(int nr, const uint8_t* xp, const XParts& xpp, int64_t M, int64_t b0, int64_t K, const uint8_t* tile,
               const TileParts& tp, int64_t r0, void* y, int64_t ldy, bool out_bf16) {
  if constexpr (NR > 1) {
    if (nr < NR) return tile_rows<QT, NB, NR - 1>(nr, xp, xpp, M, b0, K, tile, tp, r0, y, ldy, out_bf16);
  }
  __m512 acc[NR][NB];
  micro<QT, NR, NB>(xp, xpp, b0, K, tile, tp, r0, acc);
  alignas(64) float buf[NR][16];
  for (int v = 0; v < NB; ++v) {
    for (int r = 0; r < NR; ++r) _mm512_store_ps(buf[r], acc[r][v]);
    const int64_t m0 = 16 * (b0 + v), ml = std::min<int64_t>(16, M - m0);
    for (int64_t l = 0; l < ml; ++l)
      for (int r = 0; r < NR; ++r) {
        const int64_t at = (m0 + l) * ldy + r0 + r;
        if (out_bf16)
          static_cast<uint16_t*>(y)[at] = quant::bf16_bits(buf[r][l]);
        else
          static_cast<float*>(y)[at] = buf[r][l];
      }
  }
}

template <int32_t QT>
void gemm_tile(const uint8_t* xp, int64_t M, int64_t K, const uint8_t* tile, int64_t R, void* y, int64_t ldy,
               bool out_bf16, const uint8_t* next, int64_t next_bytes) {
  const XParts xpp = x_parts<QT>(M, K);
  const TileParts tp = tile_parts<QT>(R, K);
  const int64_t nb = (M + 15) / 16;
  // the next packed rows, an equal share of 64-byte lines per register tile
  const int64_t calls = (nb + kBlocks - 1) / kBlocks * ((R + kRows - 1) / kRows);
  const int64_t lines = next ? (next_bytes + 63) / 64 : 0, per_call = (lines + calls - 1) / calls;
  int64_t line = 0;
  for (int64_t b = 0; b < nb; b += kBlocks) {
    const bool full = b + kBlocks <= nb;
    for (int64_t r0 = 0; r0 < R; r0 += kRows) {
      for (const int64_t end = std::min(lines, line + per_call); line < end; ++line)
        _mm_prefetch(reinterpret_cast<const char*>(next + 64 * line), _MM_HINT_T1);
      const int nr = static_cast<int>(std::min<int64_t>(kRows, R - r0));
      if (full)
        tile_rows<QT, kBlocks>(nr, xp, xpp, M, b, K, tile, tp, r0, y, ldy, out_bf16);
      else
        for (int64_t bb = b; bb < nb; ++bb) tile_rows<QT, 1>(nr, xp, xpp, M, bb, K, tile, tp, r0, y, ldy, out_bf16);
    }
  }
}
#endif

}  // namespace

bool gemm8_supported(int32_t qtype) {
#if defined(MK_GEMM8)
  bool ok = false;
  ::mk::with_block_qtype(qtype, [&]<int32_t QT>() { ok = kFormat<QT>; });
  return ok;
#else
  (void)qtype;
  return false;
#endif
}

int64_t gemm8_x_bytes(int32_t qtype, int64_t M, int64_t K) {
#if defined(MK_GEMM8)
  int64_t n = 0;
  ::mk::with_block_qtype(qtype, [&]<int32_t QT>() {
    if constexpr (kFormat<QT>) n = x_parts<QT>(M, K).total;
  });
  return n;
#else
  (void)qtype, (void)M, (void)K;
  return 0;
#endif
}

void gemm8_prepare_x(int32_t qtype, const uint16_t* x, int64_t M, int64_t K, int64_t b0, int64_t b1, void* xp) {
#if defined(MK_GEMM8)
  ::mk::with_block_qtype(qtype, [&]<int32_t QT>() {
    if constexpr (kFormat<QT>) prepare_x<QT>(x, M, K, b0, b1, static_cast<uint8_t*>(xp));
  });
#else
  (void)qtype, (void)x, (void)M, (void)K, (void)b0, (void)b1, (void)xp;
#endif
}

int64_t gemm8_tile_bytes(int32_t qtype, int64_t R, int64_t K) {
#if defined(MK_GEMM8)
  int64_t n = 0;
  ::mk::with_block_qtype(qtype, [&]<int32_t QT>() {
    if constexpr (kFormat<QT>) n = tile_parts<QT>(R, K).total;
  });
  return n;
#else
  (void)qtype, (void)R, (void)K;
  return 0;
#endif
}

void gemm8_decode_tile(int32_t qtype, const void* w, int64_t K, int64_t n0, int64_t n1, void* tile) {
#if defined(MK_GEMM8)
  ::mk::with_block_qtype(qtype, [&]<int32_t QT>() {
    if constexpr (kFormat<QT>) decode_tile<QT>(static_cast<const uint8_t*>(w), K, n0, n1, static_cast<uint8_t*>(tile));
  });
#else
  (void)qtype, (void)w, (void)K, (void)n0, (void)n1, (void)tile;
#endif
}

void gemm8_tile(int32_t qtype, const void* xp, int64_t M, int64_t K, const void* tile, int64_t R, void* y,
                int64_t ldy, bool out_bf16, const void* next, int64_t next_bytes) {
#if defined(MK_GEMM8)
  ::mk::with_block_qtype(qtype, [&]<int32_t QT>() {
    if constexpr (kFormat<QT>)
      gemm_tile<QT>(static_cast<const uint8_t*>(xp), M, K, static_cast<const uint8_t*>(tile), R, y, ldy, out_bf16,
                    static_cast<const uint8_t*>(next), next_bytes);
  });
#else
  (void)qtype, (void)xp, (void)M, (void)K, (void)tile, (void)R, (void)y, (void)ldy, (void)out_bf16, (void)next,
      (void)next_bytes;
#endif
}

MK_ISA_END
