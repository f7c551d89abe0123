// cpu/isa/quant_kernels.h — the CPU kernels of qlinear on quantized weights, framework-free (plain pointers;
// the ATen glue, argument checks and the prefill GEMM call are csrc/cpu/quant.cpp), compiled per ISA level
// through csrc/cpu/isa/quant.cpp (the AVX-512 / VNNI / BF16 paths run at the levels that have them). Formats and the scalar block
// decoding they follow: csrc/kernels/quant_blocks.h.
// Shape letters: M rows of x (tokens), K in features, N out features, QK elements per block, R packed row bytes.
//
// Decode, M ≤ 16 rows of x (GEMV): every path streams each packed row of W once and decodes its blocks in
// registers, parallel over N in the caller; bound: memory, N·R packed bytes per call / copy bandwidth
// (e.g. Q4_0 0.5625 bytes per weight, 3.6× fewer than bf16), as long as the decode keeps up with the stream
// (benchmarks/results/quant_cpu.md: the measured GB/s and % of the copy bandwidth).
//   gemv_rows<QT>       fp32 x: 32 weights → two fp32 vectors (bytes → int32 → fp32, scale and min by one FMA),
//                       FMA against x, up to 4 rows of x per pass. Exact up to fp32 summation order (the
//                       activations are not quantized). Also bf16 / fp16 x without the paths below.
//   gemv_rows_q8<QT>    bf16 x, AVX512-VNNI, Q4_0 / Q4_1 / Q8_0 / Q4_K / Q5_K: x quantized to int8 per 32 once
//                       per call, one vpdpbusd per 32 weights (see its section for the error bound).
//   gemv_rows_bf16<QT>  bf16 x, AVX512-BF16 (Q6_K; all but Q8_0 without VNNI): the codes as exact bf16 by a
//                       lookup, vdpbf16ps: exact up to fp32 summation order.
//   gemv_rows_i8        INT8_ROWWISE (int8 [N, K] + fp32 scales [N]): scale[n] · Σ_k q[n, k] · x[k] in fp32.
// Prefill, M > 16: dequant_rows<QT> writes W[n0..n1, K] as fp32 or bf16 rows, tiles for the GEMM of
//   csrc/cpu/quant.cpp; bound: that GEMM, 2·M·N·K FLOPs (the dequantization is N·K stores, O(1/M) of it).
// Portable path (no AVX-512): dequant_block<QT> (quant_blocks.h) into a buffer and a plain dot product.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>

#include "../../kernels/quant_blocks.h"
#include "target.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define MK_QUANT_AVX512 1
#include <immintrin.h>
#endif

MK_ISA_BEGIN
namespace quant {

using ::mk::dequant_block;
using ::mk::load_fp16;
using ::mk::QType;

// A heap buffer of n floats (operator new[]: no std template instantiated in a per-ISA object).
struct FloatBuf {
  float* p;
  explicit FloatBuf(int64_t n) : p(new float[n]) {}
  ~FloatBuf() { delete[] p; }
  FloatBuf(const FloatBuf&) = delete;
  FloatBuf& operator=(const FloatBuf&) = delete;
};

inline constexpr int kMaxMB = 4;  // rows of x per pass over a packed row (4 × 2 accumulators)

// bf16 bits of f, round to nearest even (NaN → 0x7fc0), as cpu/common.h from_f<BFloat16>.
inline uint16_t bf16_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// A result of the GEMV as fp32 (OUT = float) or bf16 bits (OUT = uint16_t).
template <typename OUT>
inline OUT out_cast(float v) {
  if constexpr (sizeof(OUT) == 4)
    return v;
  else
    return bf16_bits(v);
}

template <int32_t QT>
struct Geometry;
#define MK_QUANT_GEOMETRY(code, nm, qk, nb) \
  template <>                               \
  struct Geometry<code> {                   \
    static constexpr int QK = qk;           \
    static constexpr int BYTES = nb;        \
  };
MK_QTYPES(MK_QUANT_GEOMETRY)
#undef MK_QUANT_GEOMETRY

#if defined(MK_QUANT_AVX512)

inline float fp16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);  // F16C: exact, subnormals included
}

inline __m128i load16b(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
inline __m256i load32b(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
// 16 unsigned bytes → 16 fp32
inline __m512 u8_to_f32(__m128i v) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v)); }
inline __m512 i8_to_f32(__m128i v) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)); }

// Q4_K / Q5_K: the 8 scales d·sc_s and mins dmin·m_s of a block from its 12 packed bytes q (scale_min_k4 for all
// 8 sub-blocks at once: bytes 0-3 / 4-7 hold sc / m of s < 4 in their low 6 bits and the top 2 bits of s ≥ 4,
// bytes 8-11 the low 4 bits of s ≥ 4).
inline void k4_scales(const uint8_t* q, float d, float dmin, float (&dm)[16]) {
  uint32_t a[3];
  std::memcpy(a, q, 12);
  const uint32_t sc[2] = {a[0] & 0x3f3f3f3fu, (a[2] & 0x0f0f0f0fu) | (((a[0] >> 6) & 0x03030303u) << 4)};
  const uint32_t mn[2] = {a[1] & 0x3f3f3f3fu, ((a[2] >> 4) & 0x0f0f0f0fu) | (((a[1] >> 6) & 0x03030303u) << 4)};
  const __m128i v = _mm_set_epi32(static_cast<int>(mn[1]), static_cast<int>(mn[0]), static_cast<int>(sc[1]),
                                  static_cast<int>(sc[0]));
  const __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v));  // sc_0..7, m_0..7
  const __m512 r = _mm512_mul_ps(f, _mm512_insertf32x8(_mm512_set1_ps(d), _mm256_set1_ps(dmin), 1));
  _mm512_storeu_ps(dm, r);  // d·sc_0..7, then dmin·m_0..7
}

// Decode one block of format QT: calls f(c, w0, w1) for each chunk c of 32 weights (elements 32c .. 32c+15
// in w0, 32c+16 .. 32c+31 in w1), in order. Bit layouts: quant_blocks.h.
template <int32_t QT, typename F>
__attribute__((always_inline)) inline void decode_block(const uint8_t* blk, F&& f) {
  const __m128i lo4 = _mm_set1_epi8(0x0F);
  if constexpr (QT == ::mk::kQ4_0 || QT == ::mk::kQ4_1) {
    const float d = fp16_at(blk);
    const __m512 vd = _mm512_set1_ps(d);
    const __m512 vm = _mm512_set1_ps(QT == ::mk::kQ4_1 ? fp16_at(blk + 2) : -8.0f * d);
    const __m128i q = load16b(blk + (QT == ::mk::kQ4_1 ? 4 : 2));
    f(0, _mm512_fmadd_ps(u8_to_f32(_mm_and_si128(q, lo4)), vd, vm),
      _mm512_fmadd_ps(u8_to_f32(_mm_and_si128(_mm_srli_epi16(q, 4), lo4)), vd, vm));
  } else if constexpr (QT == ::mk::kQ8_0) {
    const __m512 vd = _mm512_set1_ps(fp16_at(blk));
    f(0, _mm512_mul_ps(i8_to_f32(load16b(blk + 2)), vd), _mm512_mul_ps(i8_to_f32(load16b(blk + 18)), vd));
  } else if constexpr (QT == ::mk::kQ4_K || QT == ::mk::kQ5_K) {
    const float d = fp16_at(blk), dmin = fp16_at(blk + 2);
    alignas(64) float dm[16];  // d·sc_s, then dmin·m_s
    k4_scales(blk + 4, d, dmin, dm);
    const uint8_t* qs = blk + (QT == ::mk::kQ5_K ? 48 : 16);
    [[maybe_unused]] __m128i qh0, qh1;
    if constexpr (QT == ::mk::kQ5_K) {
      qh0 = load16b(blk + 16);
      qh1 = load16b(blk + 32);
    }
#pragma GCC unroll 4
    for (int pair = 0; pair < 4; ++pair) {
      const __m128i b0 = load16b(qs + 32 * pair), b1 = load16b(qs + 32 * pair + 16);
#pragma GCC unroll 2
      for (int half = 0; half < 2; ++half) {
        const int s = 2 * pair + half;
        const __m512 vd = _mm512_set1_ps(dm[s]);
        const __m512 vm = _mm512_set1_ps(-dm[8 + s]);
        __m128i n0 = half ? _mm_and_si128(_mm_srli_epi16(b0, 4), lo4) : _mm_and_si128(b0, lo4);
        __m128i n1 = half ? _mm_and_si128(_mm_srli_epi16(b1, 4), lo4) : _mm_and_si128(b1, lo4);
        if constexpr (QT == ::mk::kQ5_K) {  // 5th bit: bit s of qh[l]
          const __m128i bit = _mm_set1_epi8(static_cast<char>(1 << s)), sixteen = _mm_set1_epi8(16);
          n0 = _mm_or_si128(n0, _mm_maskz_mov_epi8(_mm_test_epi8_mask(qh0, bit), sixteen));
          n1 = _mm_or_si128(n1, _mm_maskz_mov_epi8(_mm_test_epi8_mask(qh1, bit), sixteen));
        }
        f(s, _mm512_fmadd_ps(u8_to_f32(n0), vd, vm), _mm512_fmadd_ps(u8_to_f32(n1), vd, vm));
      }
    }
  } else if constexpr (QT == ::mk::kQ6_K) {
    const float d = fp16_at(blk + 208);
    const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
    const __m128i three = _mm_set1_epi8(3);
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = blk + 64 * h;
      const __m128i qh0 = load16b(blk + 128 + 32 * h), qh1 = load16b(blk + 128 + 32 * h + 16);
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {  // chunk 4h + j: ql + 32 (j & 1), nibble j / 2, qh bits 2j, 2j + 1
        const __m128i l0 = load16b(ql + 32 * (j & 1)), l1 = load16b(ql + 32 * (j & 1) + 16);
        const __m128i n0 = j >= 2 ? _mm_and_si128(_mm_srli_epi16(l0, 4), lo4) : _mm_and_si128(l0, lo4);
        const __m128i n1 = j >= 2 ? _mm_and_si128(_mm_srli_epi16(l1, 4), lo4) : _mm_and_si128(l1, lo4);
        const __m128i h0 = _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(qh0, 2 * j), three), 4);
        const __m128i h1 = _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(qh1, 2 * j), three), 4);
        const float s0 = d * static_cast<float>(sc[8 * h + 2 * j]), s1 = d * static_cast<float>(sc[8 * h + 2 * j + 1]);
        f(4 * h + j,
          _mm512_fmadd_ps(u8_to_f32(_mm_or_si128(n0, h0)), _mm512_set1_ps(s0), _mm512_set1_ps(-32.0f * s0)),
          _mm512_fmadd_ps(u8_to_f32(_mm_or_si128(n1, h1)), _mm512_set1_ps(s1), _mm512_set1_ps(-32.0f * s1)));
      }
    }
  }
}

// acc[m] (two vectors per row of x) += x[m, k0 ..] · decoded row, over the K / QK blocks of one packed row.
template <int32_t QT, int MB, typename OUT>
inline void dot_row(const uint8_t* row, int64_t nblocks, const float* x, int64_t ldx, OUT* y, int64_t ldy) {
  constexpr int QK = Geometry<QT>::QK, BYTES = Geometry<QT>::BYTES;
  __m512 acc0[MB], acc1[MB];
  for (int m = 0; m < MB; ++m) acc0[m] = acc1[m] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nblocks; ++b) {
    const float* xb = x + b * QK;
    _mm_prefetch(reinterpret_cast<const char*>(row + (b + 8) * BYTES), _MM_HINT_T0);
    decode_block<QT>(row + b * BYTES, [&](int c, __m512 w0, __m512 w1) {
      for (int m = 0; m < MB; ++m) {
        acc0[m] = _mm512_fmadd_ps(_mm512_loadu_ps(xb + m * ldx + 32 * c), w0, acc0[m]);
        acc1[m] = _mm512_fmadd_ps(_mm512_loadu_ps(xb + m * ldx + 32 * c + 16), w1, acc1[m]);
      }
    });
  }
  for (int m = 0; m < MB; ++m) y[m * ldy] = out_cast<OUT>(_mm512_reduce_add_ps(_mm512_add_ps(acc0[m], acc1[m])));
}

// Σ_k q[k] · x[m, k] for int8 q (INT8_ROWWISE), 32 at a time with a masked tail.
template <int MB, typename OUT>
inline void dot_row_i8(const int8_t* q, int64_t K, const float* x, int64_t ldx, float scale, OUT* y, int64_t ldy) {
  __m512 acc0[MB], acc1[MB];
  for (int m = 0; m < MB; ++m) acc0[m] = acc1[m] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    const __m512 w0 = i8_to_f32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + k)));
    const __m512 w1 = i8_to_f32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + k + 16)));
    for (int m = 0; m < MB; ++m) {
      acc0[m] = _mm512_fmadd_ps(_mm512_loadu_ps(x + m * ldx + k), w0, acc0[m]);
      acc1[m] = _mm512_fmadd_ps(_mm512_loadu_ps(x + m * ldx + k + 16), w1, acc1[m]);
    }
  }
  for (; k < K; k += 16) {
    const __mmask16 mk = K - k >= 16 ? __mmask16(0xffff) : __mmask16((1u << (K - k)) - 1);
    const __m512 w = i8_to_f32(_mm_maskz_loadu_epi8(mk, q + k));
    for (int m = 0; m < MB; ++m) acc0[m] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mk, x + m * ldx + k), w, acc0[m]);
  }
  for (int m = 0; m < MB; ++m)
    y[m * ldy] = out_cast<OUT>(scale * _mm512_reduce_add_ps(_mm512_add_ps(acc0[m], acc1[m])));
}

#if defined(__AVX512BF16__)
#define MK_QUANT_BF16_DOT 1
// ---- bf16 activations: the weights' integer codes as exact bf16, dot products by vdpbf16ps -------------------
// Every format but Q8_0 stores small integer codes q (4 to 6 bits) with a scale (and a min) per 16 or 32
// weights: w = s·q + mn. A 32-entry lookup (vpermw) turns 32 codes into their bf16 values (exact: |q| < 256),
// vdpbf16ps multiplies them by 32 bf16 activations with exact products and fp32 sums, and
//   Σ w·x = s · Σ q·x + mn · Σ x     (Σ x per 32 activations computed once per call: xsum).
// That is ~4 vector ops per 32 weights instead of ~8 for the fp32 decoding (1.7-2.5× the stream rate on one
// core, measured), and still exact up to fp32 rounding for bf16 x. Q8_0 and INT8_ROWWISE keep the fp32 path.

// The bf16 bits of the integer v (|v| < 256: exact), at compile time.
constexpr uint16_t bf16_of_int(int v) {
  if (v == 0) return 0;
  const uint16_t sign = v < 0 ? 0x8000 : 0;
  const int a = v < 0 ? -v : v;
  int e = 0;
  while ((a >> (e + 1)) != 0) ++e;
  return static_cast<uint16_t>(sign | ((127 + e) << 7) | ((a << (7 - e)) & 0x7F));
}
template <int LO, int COUNT>
struct IntTable {  // bf16(LO + i) for i in [0, COUNT)
  alignas(64) uint16_t v[COUNT];
  constexpr IntTable() : v{} {
    for (int i = 0; i < COUNT; ++i) v[i] = bf16_of_int(LO + i);
  }
};
inline constexpr IntTable<0, 32> kCodes0{};    // Q4_1, Q4_K, Q5_K: q
inline constexpr IntTable<-8, 32> kCodes8{};   // Q4_0: q - 8
inline constexpr IntTable<-32, 64> kCodes32{};  // Q6_K: q - 32

template <int32_t QT>
inline constexpr bool kHasMin = QT == ::mk::kQ4_1 || QT == ::mk::kQ4_K || QT == ::mk::kQ5_K;
template <int32_t QT>
inline constexpr bool kBf16Dot = QT != ::mk::kQ8_0;

inline __m512i load_table(const uint16_t* t) { return _mm512_load_si512(t); }

// Decode one block: f(c, w, scale, mn) per chunk c of 32 weights, w = the 32 codes as bf16 (in element order),
// scale: a vector (Q6_K: lanes 0-7 the scale of elements 0-15, lanes 8-15 that of 16-31; the lanes of
// vdpbf16ps's result follow the element pairs), mn the chunk's min term (0 without one).
template <int32_t QT, typename F>
__attribute__((always_inline)) inline void decode_block_bf16(const uint8_t* blk, F&& f) {
  const __m256i lo4 = _mm256_set1_epi8(0x0F);
  if constexpr (QT == ::mk::kQ4_0 || QT == ::mk::kQ4_1) {
    const __m512i table = load_table(QT == ::mk::kQ4_0 ? kCodes8.v : kCodes0.v);
    const float d = fp16_at(blk);
    const __m128i q = load16b(blk + (QT == ::mk::kQ4_1 ? 4 : 2));
    const __m256i nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), lo4);
    f(0, _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(nib), table), _mm512_set1_ps(d),
      QT == ::mk::kQ4_1 ? fp16_at(blk + 2) : 0.0f);
  } else if constexpr (QT == ::mk::kQ4_K || QT == ::mk::kQ5_K) {
    const __m512i table = load_table(kCodes0.v);
    const float d = fp16_at(blk), dmin = fp16_at(blk + 2);
    alignas(64) float dm[16];  // d·sc_s, then dmin·m_s
    k4_scales(blk + 4, d, dmin, dm);
    const uint8_t* qs = blk + (QT == ::mk::kQ5_K ? 48 : 16);
    [[maybe_unused]] __m256i qh;
    if constexpr (QT == ::mk::kQ5_K) qh = load32b(blk + 16);
#pragma GCC unroll 4
    for (int pair = 0; pair < 4; ++pair) {
      const __m256i b = load32b(qs + 32 * pair);
#pragma GCC unroll 2
      for (int half = 0; half < 2; ++half) {
        const int s = 2 * pair + half;
        __m256i nib = half ? _mm256_and_si256(_mm256_srli_epi16(b, 4), lo4) : _mm256_and_si256(b, lo4);
        if constexpr (QT == ::mk::kQ5_K)  // 5th bit: bit s of qh[l]
          nib = _mm256_mask_add_epi8(nib, _mm256_test_epi8_mask(qh, _mm256_set1_epi8(static_cast<char>(1 << s))),
                                     nib, _mm256_set1_epi8(16));
        f(s, _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(nib), table), _mm512_set1_ps(dm[s]), -dm[8 + s]);
      }
    }
  } else if constexpr (QT == ::mk::kQ6_K) {
    const __m512i t0 = load_table(kCodes32.v), t1 = load_table(kCodes32.v + 32);
    const float d = fp16_at(blk + 208);
    const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192);
    const __m256i three = _mm256_set1_epi8(3);
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m256i qh = load32b(blk + 128 + 32 * h);
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {  // chunk 4h + j: ql + 64h + 32 (j & 1), nibble j / 2, qh bits 2j, 2j + 1
        const __m256i l = load32b(blk + 64 * h + 32 * (j & 1));
        const __m256i nib = j >= 2 ? _mm256_and_si256(_mm256_srli_epi16(l, 4), lo4) : _mm256_and_si256(l, lo4);
        const __m256i hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j), three), 4);
        const __m512i idx = _mm512_cvtepu8_epi16(_mm256_or_si256(nib, hi));
        const __m512 vs = _mm512_insertf32x8(_mm512_set1_ps(d * static_cast<float>(sc[8 * h + 2 * j])),
                                             _mm256_set1_ps(d * static_cast<float>(sc[8 * h + 2 * j + 1])), 1);
        f(4 * h + j, _mm512_permutex2var_epi16(t0, idx, t1), vs, 0.0f);
      }
    }
  }
}

// y[m] = Σ_k x[m, k] · W[row, k] for MB rows of bf16 x (bits), through the codes' bf16 dot products.
// xsum [MB, K / 32]: Σ x per chunk of 32 (formats with a min); mins: scratch of K / 32 floats.
template <int32_t QT, int MB, typename OUT>
inline void dot_row_bf16(const uint8_t* row, int64_t nblocks, const uint16_t* x, int64_t ldx, const float* xsum,
                         float* mins, OUT* y, int64_t ldy) {
  constexpr int QK = Geometry<QT>::QK, BYTES = Geometry<QT>::BYTES, CH = QK / 32;
  const int64_t nchunks = nblocks * CH;
  __m512 acc[MB];
  for (int m = 0; m < MB; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nblocks; ++b) {
    const uint16_t* xb = x + b * QK;
    _mm_prefetch(reinterpret_cast<const char*>(row + (b + 8) * BYTES), _MM_HINT_T0);
    decode_block_bf16<QT>(row + b * BYTES, [&](int c, __m512i w, __m512 vs, float mn) {
      if constexpr (kHasMin<QT>) mins[b * CH + c] = mn;
      for (int m = 0; m < MB; ++m) {
        const __m512i xv = _mm512_loadu_si512(xb + m * ldx + 32 * c);
        const __m512 dp = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)xv, (__m512bh)w);
        acc[m] = _mm512_fmadd_ps(dp, vs, acc[m]);
      }
    });
  }
  for (int m = 0; m < MB; ++m) {
    float corr = 0.f;
    if constexpr (kHasMin<QT>) {  // Σ_c mn_c · xsum[m, c]
      __m512 cv = _mm512_setzero_ps();
      int64_t c = 0;
      for (; c + 16 <= nchunks; c += 16)
        cv = _mm512_fmadd_ps(_mm512_loadu_ps(mins + c), _mm512_loadu_ps(xsum + m * nchunks + c), cv);
      const __mmask16 tail = static_cast<__mmask16>((1u << (nchunks - c)) - 1);
      cv = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, mins + c),
                           _mm512_maskz_loadu_ps(tail, xsum + m * nchunks + c), cv);
      corr = _mm512_reduce_add_ps(cv);
    }
    y[m * ldy] = out_cast<OUT>(_mm512_reduce_add_ps(acc[m]) + corr);
  }
}

// y[M, n] for n in [n0, n1), bf16 x [M, K] (bits) with xsum [M, K / 32] (see dot_row_bf16).
template <int32_t QT, typename OUT>
void gemv_rows_bf16(const uint8_t* w, int64_t K, const uint16_t* x, const float* xsum, int64_t M, OUT* y,
                    int64_t ldy, int64_t n0, int64_t n1) {
  constexpr int QK = Geometry<QT>::QK, BYTES = Geometry<QT>::BYTES;
  const int64_t nblocks = K / QK, R = nblocks * BYTES, nchunks = K / 32;
  float mins_stack[512];
  FloatBuf mins_heap(nchunks > 512 ? nchunks : 0);
  float* mins = nchunks > 512 ? mins_heap.p : mins_stack;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * R;
    int64_t m = 0;
    auto pass = [&]<int MB>() {
      dot_row_bf16<QT, MB>(row, nblocks, x + m * K, K, xsum + m * nchunks, mins, y + m * ldy + n, ldy);
      m += MB;
    };
    while (M - m >= 16) pass.template operator()<16>();
    if (M - m >= 8) pass.template operator()<8>();
    if (M - m >= 4) pass.template operator()<4>();
    if (M - m >= 2) pass.template operator()<2>();
    if (M - m >= 1) pass.template operator()<1>();
  }
}

// Σ x per chunk of 32 of bf16 x [M, K] → xsum [M, K / 32] (fp32 sums).
inline void chunk_sums_bf16(const uint16_t* x, int64_t M, int64_t K, float* xsum) {
  for (int64_t i = 0; i < M * (K / 32); ++i) {
    const __m512i v = _mm512_loadu_si512(x + 32 * i);
    const __m512 lo = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    const __m512 hi = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
    xsum[i] = _mm512_reduce_add_ps(_mm512_add_ps(lo, hi));
  }
}
#endif  // __AVX512BF16__

#if defined(__AVX512VNNI__)
#define MK_QUANT_VNNI 1
// ---- activations quantized to int8 per 32 (vpdpbusd) ------------------------------------------------------
// x is quantized once per call, per chunk of 32: dx = max|x| / 127, q = round(x / dx) (|x - dx·q| ≤ dx / 2),
// xs = dx · Σ q. A weight chunk's codes c (unsigned bytes: Q4_0 / Q4_1 / Q4_K / Q5_K as stored, Q8_0 as c + 128)
// with scale s and offset mn (w = s·c + mn) then gives
//   Σ w·(dx·q) = s·dx · Σ c·q + mn · xs          (Σ c·q: one vpdpbusd per 32 weights, exact in int32)
// — ~5 single-width vector ops per 32 weights instead of ~7 double-width ones for the bf16 path (Zen 4
// runs 512-bit ops as two 256-bit halves). The only error is the activations' quantization:
// |y - Σ w·x| ≤ Σ_chunks (dx / 2) · Σ |w| plus fp32 rounding (tests/test_quant_linear.py checks that bound).

// Q6_K is not among them: its 6-bit codes make the quantization error of x weigh more, for a small gain
// (measured: 1.2× on one core at M = 1, none at M = 16); it takes the exact bf16 path.
template <int32_t QT>
inline constexpr bool kInt8Dot = QT == ::mk::kQ4_0 || QT == ::mk::kQ4_1 || QT == ::mk::kQ8_0 || QT == ::mk::kQ4_K ||
                                 QT == ::mk::kQ5_K;

// f(c, codes, s, mn) per chunk c of 32 weights: codes the 32 unsigned bytes c in element order, w = s·c + mn
// (s broadcast to a vector).
template <int32_t QT, typename F>
__attribute__((always_inline)) inline void decode_block_u8(const uint8_t* blk, F&& f) {
  const __m256i lo4 = _mm256_set1_epi8(0x0F);
  if constexpr (QT == ::mk::kQ4_0 || QT == ::mk::kQ4_1) {
    const float d = fp16_at(blk);
    const __m128i q = load16b(blk + (QT == ::mk::kQ4_1 ? 4 : 2));
    f(0, _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), lo4), _mm256_set1_ps(d),
      QT == ::mk::kQ4_1 ? fp16_at(blk + 2) : -8.0f * d);
  } else if constexpr (QT == ::mk::kQ8_0) {
    const float d = fp16_at(blk);
    f(0, _mm256_xor_si256(load32b(blk + 2), _mm256_set1_epi8(static_cast<char>(0x80))), _mm256_set1_ps(d),
      -128.0f * d);
  } else if constexpr (QT == ::mk::kQ4_K || QT == ::mk::kQ5_K) {
    const float d = fp16_at(blk), dmin = fp16_at(blk + 2);
    alignas(64) float dm[16];  // d·sc_s, then dmin·m_s
    k4_scales(blk + 4, d, dmin, dm);
    const uint8_t* qs = blk + (QT == ::mk::kQ5_K ? 48 : 16);
    [[maybe_unused]] __m256i qh;
    if constexpr (QT == ::mk::kQ5_K) qh = load32b(blk + 16);
#pragma GCC unroll 4
    for (int pair = 0; pair < 4; ++pair) {
      const __m256i b = load32b(qs + 32 * pair);
#pragma GCC unroll 2
      for (int half = 0; half < 2; ++half) {
        const int s = 2 * pair + half;
        __m256i nib = half ? _mm256_and_si256(_mm256_srli_epi16(b, 4), lo4) : _mm256_and_si256(b, lo4);
        if constexpr (QT == ::mk::kQ5_K)
          nib = _mm256_mask_add_epi8(nib, _mm256_test_epi8_mask(qh, _mm256_set1_epi8(static_cast<char>(1 << s))),
                                     nib, _mm256_set1_epi8(16));
        f(s, nib, _mm256_set1_ps(dm[s]), -dm[8 + s]);
      }
    }
  }
}

// y[m] ≈ Σ_k x[m, k] · W[row, k] for MB rows of quantized x: xq int8 [MB, K] (ld ldx), dx / xs [MB, K / 32]
// (ld nchunks); mins: scratch of K / 32 floats.
template <int32_t QT, int MB, typename OUT>
inline void dot_row_q8(const uint8_t* row, int64_t nblocks, const int8_t* xq, int64_t ldx, const float* dx,
                       const float* xs, int64_t nchunks, float* mins, OUT* y, int64_t ldy) {
  constexpr int QK = Geometry<QT>::QK, BYTES = Geometry<QT>::BYTES, CH = QK / 32;
  // two accumulators per row of x (even / odd chunks): the FMA chain would otherwise bind at M = 1
  __m256 acc[2][MB];
  for (int m = 0; m < MB; ++m) acc[0][m] = acc[1][m] = _mm256_setzero_ps();
  auto block = [&]<int P>(int64_t b) {  // P: the accumulator of the block's chunk 0
    _mm_prefetch(reinterpret_cast<const char*>(row + (b + 8) * BYTES), _MM_HINT_T0);
    decode_block_u8<QT>(row + b * BYTES, [&](int c, __m256i codes, __m256 s, float mn) {
      const int64_t g = b * CH + c;
      mins[g] = mn;
      __m256(&a)[MB] = acc[(P + c) & 1];
      for (int m = 0; m < MB; ++m) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + m * ldx + 32 * g));
        const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), codes, xv);
        a[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(s, _mm256_set1_ps(dx[m * nchunks + g])), a[m]);
      }
    });
  };
  int64_t b = 0;
  for (; b + 2 <= nblocks; b += 2) {
    block.template operator()<0>(b);
    block.template operator()<1>(b + 1);
  }
  if (b < nblocks) block.template operator()<0>(b);
  for (int m = 0; m < MB; ++m) acc[0][m] = _mm256_add_ps(acc[0][m], acc[1][m]);
  __m256(&acc0)[MB] = acc[0];
  for (int m = 0; m < MB; ++m) {
    __m512 cv = _mm512_setzero_ps();
    int64_t c = 0;
    for (; c + 16 <= nchunks; c += 16)
      cv = _mm512_fmadd_ps(_mm512_loadu_ps(mins + c), _mm512_loadu_ps(xs + m * nchunks + c), cv);
    const __mmask16 tail = static_cast<__mmask16>((1u << (nchunks - c)) - 1);
    cv = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, mins + c), _mm512_maskz_loadu_ps(tail, xs + m * nchunks + c), cv);
    const __m128 a = _mm_add_ps(_mm256_castps256_ps128(acc0[m]), _mm256_extractf128_ps(acc0[m], 1));
    const __m128 a2 = _mm_add_ps(a, _mm_movehl_ps(a, a));
    y[m * ldy] = out_cast<OUT>(_mm_cvtss_f32(_mm_add_ss(a2, _mm_movehdup_ps(a2))) + _mm512_reduce_add_ps(cv));
  }
}

// M = 1 and short rows: NB rows of W at a time (the x chunk and its scale loaded once for them, and their
// epilogues overlap): short rows (K = 576: 18 chunks) otherwise pay ~50 cycles of per-row epilogue each.
template <int32_t QT, int NB, typename OUT>
inline void dot_rows_q8_m1(const uint8_t* row, int64_t R, int64_t nblocks, const int8_t* xq, const float* dx,
                           const float* xs, int64_t nchunks, float* mins, OUT* y) {
  constexpr int QK = Geometry<QT>::QK, BYTES = Geometry<QT>::BYTES, CH = QK / 32;
  __m256 acc[2][NB];
  for (int r = 0; r < NB; ++r) acc[0][r] = acc[1][r] = _mm256_setzero_ps();
  auto block = [&]<int P>(int64_t b) {
#pragma GCC unroll 4
    for (int r = 0; r < NB; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(row + r * R + (b + 8) * BYTES), _MM_HINT_T0);
      decode_block_u8<QT>(row + r * R + b * BYTES, [&](int c, __m256i codes, __m256 s, float mn) {
        const int64_t g = b * CH + c;
        mins[r * nchunks + g] = mn;
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * g));
        const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), codes, xv);
        __m256& a = acc[(P + c) & 1][r];
        a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(s, _mm256_set1_ps(dx[g])), a);
      });
    }
  };
  int64_t b = 0;
  for (; b + 2 <= nblocks; b += 2) {
    block.template operator()<0>(b);
    block.template operator()<1>(b + 1);
  }
  if (b < nblocks) block.template operator()<0>(b);
  __m512 cv[NB];
  for (int r = 0; r < NB; ++r) cv[r] = _mm512_setzero_ps();
  int64_t c = 0;
  for (; c + 16 <= nchunks; c += 16) {
    const __m512 xv = _mm512_loadu_ps(xs + c);
    for (int r = 0; r < NB; ++r) cv[r] = _mm512_fmadd_ps(_mm512_loadu_ps(mins + r * nchunks + c), xv, cv[r]);
  }
  const __mmask16 tail = static_cast<__mmask16>((1u << (nchunks - c)) - 1);
  const __m512 xt = _mm512_maskz_loadu_ps(tail, xs + c);
  for (int r = 0; r < NB; ++r) {
    cv[r] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, mins + r * nchunks + c), xt, cv[r]);
    const __m256 a8 = _mm256_add_ps(_mm256_add_ps(acc[0][r], acc[1][r]),
                                    _mm256_add_ps(_mm512_castps512_ps256(cv[r]), _mm512_extractf32x8_ps(cv[r], 1)));
    const __m128 a = _mm_add_ps(_mm256_castps256_ps128(a8), _mm256_extractf128_ps(a8, 1));
    const __m128 a2 = _mm_add_ps(a, _mm_movehl_ps(a, a));
    y[r] = out_cast<OUT>(_mm_cvtss_f32(_mm_add_ss(a2, _mm_movehdup_ps(a2))));
  }
}

template <int32_t QT, typename OUT>
void gemv_rows_q8(const uint8_t* w, int64_t K, const int8_t* xq, const float* dx, const float* xs, int64_t M, OUT* y,
                  int64_t ldy, int64_t n0, int64_t n1) {
  constexpr int QK = Geometry<QT>::QK, BYTES = Geometry<QT>::BYTES;
  const int64_t nblocks = K / QK, R = nblocks * BYTES, nchunks = K / 32;
  constexpr int kNB = 4;  // rows of W per pass at M = 1
  FloatBuf mins_buf(kNB * nchunks);
  float* mins = mins_buf.p;
  int64_t n = n0;
  if (M == 1 && nchunks < 64) {  // short rows only: on long ones one stream per row measured as fast or faster
    for (; n + kNB <= n1; n += kNB)
      dot_rows_q8_m1<QT, kNB>(w + n * R, R, nblocks, xq, dx, xs, nchunks, mins, y + n);
  }
  for (; n < n1; ++n) {
    const uint8_t* row = w + n * R;
    int64_t m = 0;
    auto pass = [&]<int MB>() {
      dot_row_q8<QT, MB>(row, nblocks, xq + m * K, K, dx + m * nchunks, xs + m * nchunks, nchunks, mins,
                         y + m * ldy + n, ldy);
      m += MB;
    };
    while (M - m >= 8) pass.template operator()<8>();
    if (M - m >= 4) pass.template operator()<4>();
    if (M - m >= 2) pass.template operator()<2>();
    if (M - m >= 1) pass.template operator()<1>();
  }
}

// Quantize x [M, K] (fp32, or bf16 bits when BF16) per chunk of 32: xq int8 [M, K], dx and xs [M, K / 32].
template <bool BF16>
void quantize_x_q8(const void* x, int64_t M, int64_t K, int8_t* xq, float* dx, float* xs) {
  for (int64_t i = 0; i < M * (K / 32); ++i) {
    __m512 v0, v1;
    if constexpr (BF16) {
      const uint16_t* p = static_cast<const uint16_t*>(x) + 32 * i;
      const __m256i h0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
      const __m256i h1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16));
      v0 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h0), 16));
      v1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h1), 16));
    } else {
      const float* p = static_cast<const float*>(x) + 32 * i;
      v0 = _mm512_loadu_ps(p);
      v1 = _mm512_loadu_ps(p + 16);
    }
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    // a NaN or ±inf among the 32 (x · 0 is NaN only for those): dx = NaN, so the outputs of this row are NaN
    // as the fp32 matmul's would be (±inf there when no weight is 0; NaN here).
    const __m512 zero = _mm512_setzero_ps();
    const bool finite = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_mul_ps(v0, zero), _mm512_mul_ps(v1, zero))) == 0.0f;
    const float d = finite ? amax / 127.0f : std::numeric_limits<float>::quiet_NaN();
    const __m512 inv = _mm512_set1_ps(finite && amax > 0.0f ? 127.0f / amax : 0.0f);
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, inv));  // round to nearest even; |q| ≤ 127
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, inv));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(xq + 32 * i), _mm512_cvtsepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(xq + 32 * i + 16), _mm512_cvtsepi32_epi8(q1));
    dx[i] = d;
    xs[i] = d * static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)));
  }
}
#endif  // __AVX512VNNI__


#else  // portable

template <int32_t QT, int MB, typename OUT>
inline void dot_row(const uint8_t* row, int64_t nblocks, const float* x, int64_t ldx, OUT* y, int64_t ldy) {
  constexpr int QK = Geometry<QT>::QK, BYTES = Geometry<QT>::BYTES;
  float w[QK];
  float acc[MB][16] = {};
  for (int64_t b = 0; b < nblocks; ++b) {
    dequant_block<QT>(row + b * BYTES, w);
    for (int m = 0; m < MB; ++m) {
      const float* xb = x + m * ldx + b * QK;
      for (int j = 0; j < QK; j += 16)
        for (int l = 0; l < 16; ++l) acc[m][l] += xb[j + l] * w[j + l];
    }
  }
  for (int m = 0; m < MB; ++m) {
    float s = 0.f;
    for (int l = 0; l < 16; ++l) s += acc[m][l];
    y[m * ldy] = out_cast<OUT>(s);
  }
}

template <int MB, typename OUT>
inline void dot_row_i8(const int8_t* q, int64_t K, const float* x, int64_t ldx, float scale, OUT* y, int64_t ldy) {
  float acc[MB][16] = {};
  int64_t k = 0;
  for (; k + 16 <= K; k += 16)
    for (int m = 0; m < MB; ++m)
      for (int l = 0; l < 16; ++l) acc[m][l] += x[m * ldx + k + l] * static_cast<float>(q[k + l]);
  for (int m = 0; m < MB; ++m) {
    float s = 0.f;
    for (int l = 0; l < 16; ++l) s += acc[m][l];
    for (int64_t kk = k; kk < K; ++kk) s += x[m * ldx + kk] * static_cast<float>(q[kk]);
    y[m * ldy] = out_cast<OUT>(scale * s);
  }
}

#endif

// y[M, n] for n in [n0, n1): y has leading dimension ldy (N). x [M, K] fp32 contiguous.
template <int32_t QT, typename OUT>
void gemv_rows(const uint8_t* w, int64_t K, const float* x, int64_t M, OUT* y, int64_t ldy, int64_t n0,
               int64_t n1) {
  constexpr int QK = Geometry<QT>::QK, BYTES = Geometry<QT>::BYTES;
  const int64_t nblocks = K / QK, R = nblocks * BYTES;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * R;
    int64_t m = 0;
    for (; m + kMaxMB <= M; m += kMaxMB) dot_row<QT, kMaxMB>(row, nblocks, x + m * K, K, y + m * ldy + n, ldy);
    switch (M - m) {
      case 3: dot_row<QT, 3>(row, nblocks, x + m * K, K, y + m * ldy + n, ldy); break;
      case 2: dot_row<QT, 2>(row, nblocks, x + m * K, K, y + m * ldy + n, ldy); break;
      case 1: dot_row<QT, 1>(row, nblocks, x + m * K, K, y + m * ldy + n, ldy); break;
      default: break;
    }
  }
}

template <typename OUT>
void gemv_rows_i8(const int8_t* w, const float* scales, int64_t K, const float* x, int64_t M, OUT* y,
                         int64_t ldy, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const int8_t* row = w + n * K;
    int64_t m = 0;
    for (; m + kMaxMB <= M; m += kMaxMB) dot_row_i8<kMaxMB>(row, K, x + m * K, K, scales[n], y + m * ldy + n, ldy);
    switch (M - m) {
      case 3: dot_row_i8<3>(row, K, x + m * K, K, scales[n], y + m * ldy + n, ldy); break;
      case 2: dot_row_i8<2>(row, K, x + m * K, K, scales[n], y + m * ldy + n, ldy); break;
      case 1: dot_row_i8<1>(row, K, x + m * K, K, scales[n], y + m * ldy + n, ldy); break;
      default: break;
    }
  }
}

// Dequantize rows [n0, n1) of W into dst (row n at dst + (n - n0) · K), as fp32 (OUT = float) or bf16 bits
// (OUT = uint16_t, round to nearest even).
template <int32_t QT, typename OUT>
void dequant_rows(const uint8_t* w, int64_t K, int64_t n0, int64_t n1, OUT* dst) {
  constexpr int QK = Geometry<QT>::QK, BYTES = Geometry<QT>::BYTES;
  const int64_t nblocks = K / QK, R = nblocks * BYTES;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * R;
    OUT* d = dst + (n - n0) * K;
    for (int64_t b = 0; b < nblocks; ++b) {
#if defined(MK_QUANT_AVX512)
      OUT* db = d + b * QK;
      decode_block<QT>(row + b * BYTES, [&](int c, __m512 w0, __m512 w1) {
        if constexpr (sizeof(OUT) == 4) {
          _mm512_storeu_ps(db + 32 * c, w0);
          _mm512_storeu_ps(db + 32 * c + 16, w1);
        } else {
#if defined(__AVX512BF16__)
          _mm512_storeu_si512(db + 32 * c, (__m512i)_mm512_cvtne2ps_pbh(w1, w0));
#else
          alignas(64) float tmp[32];
          _mm512_store_ps(tmp, w0);
          _mm512_store_ps(tmp + 16, w1);
          for (int l = 0; l < 32; ++l) db[32 * c + l] = bf16_bits(tmp[l]);
#endif
        }
      });
#else
      float tmp[QK];
      dequant_block<QT>(row + b * BYTES, tmp);
      for (int l = 0; l < QK; ++l) {
        if constexpr (sizeof(OUT) == 4)
          d[b * QK + l] = tmp[l];
        else
          d[b * QK + l] = bf16_bits(tmp[l]);
      }
#endif
    }
  }
}

inline void dequant_rows_i8(const int8_t* w, const float* scales, int64_t K, int64_t n0, int64_t n1, float* dst) {
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t k = 0; k < K; ++k) dst[(n - n0) * K + k] = static_cast<float>(w[n * K + k]) * scales[n];
}
inline void dequant_rows_i8(const int8_t* w, const float* scales, int64_t K, int64_t n0, int64_t n1, uint16_t* dst) {
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t k = 0; k < K; ++k) dst[(n - n0) * K + k] = bf16_bits(static_cast<float>(w[n * K + k]) * scales[n]);
}

}  // namespace quant
MK_ISA_END
