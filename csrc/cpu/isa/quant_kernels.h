// cpu/isa/quant_kernels.h — the CPU kernels of qlinear on quantized weights, framework-free (plain pointers;
// the ATen glue, argument checks and the prefill GEMM call are csrc/cpu/quant.cpp), compiled per ISA level
// through csrc/cpu/isa/quant.cpp (the AVX-512 / VNNI / BF16 paths run at the levels that have them). Formats and the scalar block
// decoding they follow: csrc/kernels/quant_blocks.h.
// Shape letters: M rows of x (tokens), K in features, N out features, QK elements per block, R packed row bytes.
//
// Decode, M ≤ 16 rows of x (GEMV): every path streams each packed row of W once and decodes its blocks in
// registers, parallel over N in the caller; bound: memory, N·R packed bytes per call / read bandwidth
// (e.g. Q4_0 0.5625 bytes per weight, 3.6× fewer than bf16), as long as the decode keeps up with the stream
// (benchmarks/results/cpu_kernels.md: GB/s and % of the read bandwidth per level). Every SIMD path starts
// from one block decoder, decode_codes (quant_codes.h: a block → per chunk of 32 weights its codes as bytes,
// scales and offset; 256-bit, shared by the avx2, avx512 and avx512bf16 levels):
//   gemv_rows<QT>       fp32 x: the codes widened to fp32 and scaled (w = s·c + mn by one FMA, or looked up
//                       among the 16 values of 4-bit codes), FMA against x, up to 4 rows of x per pass.
//                       Exact up to fp32 summation order (the activations are not quantized). Also fp16 x and
//                       bf16 x without the paths below.
//   gemv_rows_q8<QT>    bf16 x, Q4_0 / Q4_1 / Q8_0 (quant_codes.h): x quantized to int8 per 32 once per call,
//                       the codes' integer dot products (vpmaddubsw + vpmaddwd with AVX2, per chunk; with
//                       AVX512-VNNI groups of 8 blocks in lanes by block, 4 vpdpbusd per 256 weights and row:
//                       quant_q8_lanes.h; see quant_codes.h for the error bound).
//   gemv_rows_q8k<QT>   bf16 x, Q4_K / Q5_K / Q6_K (quant_codes.h; portable copy below for the generic level):
//                       x quantized to int8 per 256, integer sums over each super-block.
//   gemv_rows_bf16<QT>  bf16 x, AVX512-BF16: the codes as exact bf16 by a lookup, vdpbf16ps: exact up to fp32
//                       summation order (no format takes it by default now: every one has an int8 path).
//   gemv_rows_i8        INT8_ROWWISE (int8 [N, K] + fp32 scales [N]): scale[n] · Σ_k q[n, k] · x[k] in fp32
//                       (a row with a non-finite scale: Σ_k x[k] · (q[n, k] · scale[n]), the dequantized product).
// Prefill, M > 16: dequant_rows<QT> writes W[n0..n1, K] as fp32 or bf16 rows, tiles for the GEMM of
//   csrc/cpu/quant.cpp; bound: that GEMM, 2·M·N·K FLOPs (the dequantization is N·K stores, O(1/M) of it).
// Portable path (generic level): dequant_block<QT> (quant_blocks.h) into a buffer and a plain dot product.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "../../kernels/quant_blocks.h"
#include "target.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define MK_QUANT_AVX512 1
#endif
#if defined(__AVX2__)
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
  explicit FloatBuf(int64_t n) : p(n > 0 ? new float[n] : nullptr) {}
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

#include "quant_codes.h"  // AVX2 and up: decode_codes, the int8-activation GEMV (gemv_rows_q8)

#if defined(MK_QUANT_AVX512)

inline __m512 i8_to_f32(__m128i v) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)); }

// 4-bit codes: looking the chunk's 16 possible weights s·c + mn up (vpermps; bit-identical, 2 instructions
// fewer per 16 weights) measured 10 % slower than converting and scaling each code on Zen 4: off.
template <int32_t QT>
inline constexpr bool kLookup16 = false;

// Decode one block of format QT: calls f(c, w0, w1) for each chunk c of 32 weights (elements 32c .. 32c+15
// in w0, 32c+16 .. 32c+31 in w1), in order: decode_codes (quant_codes.h), the codes widened to fp32.
template <int32_t QT, typename F>
__attribute__((always_inline)) inline void decode_block(const uint8_t* blk, F&& f) {
  if constexpr (QT == ::mk::kQ4_0 || QT == ::mk::kQ4_1) {  // one chunk: straight from 16-byte loads
    // (through decode_codes' 32-byte codes measured ~10 % slower at fp32 x on Zen 4)
    const __m128i lo4 = _mm_set1_epi8(0x0F);
    const float d = fp16_at(blk);
    const __m512 vd = _mm512_set1_ps(d);
    const __m512 vm = _mm512_set1_ps(QT == ::mk::kQ4_1 ? fp16_at(blk + 2) : -8.0f * d);
    const __m128i q = load16b(blk + (QT == ::mk::kQ4_1 ? 4 : 2));
    f(0, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(q, lo4))), vd, vm),
      _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(q, 4), lo4))), vd, vm));
    return;
  } else if constexpr (QT == ::mk::kQ8_0) {  // likewise (~7 % at fp32 x)
    const __m512 vd = _mm512_set1_ps(fp16_at(blk));
    f(0, _mm512_mul_ps(i8_to_f32(load16b(blk + 2)), vd), _mm512_mul_ps(i8_to_f32(load16b(blk + 18)), vd));
    return;
  }
  decode_codes<QT>(blk, [&](int c, __m256i codes, float s0, float s1, float mn) {
    const __m128i lo = _mm256_castsi256_si128(codes), hi = _mm256_extracti128_si256(codes, 1);
    if constexpr (kLookup16<QT>) {
      const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
      const __m512 t = _mm512_fmadd_ps(iota, _mm512_set1_ps(s0), _mm512_set1_ps(mn));
      f(c, _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(lo), t), _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(hi), t));
    } else if constexpr (kSignedCodes<QT>) {
      f(c, _mm512_mul_ps(i8_to_f32(lo), _mm512_set1_ps(s0)), _mm512_mul_ps(i8_to_f32(hi), _mm512_set1_ps(s1)));
    } else {
      const __m512 vm = _mm512_set1_ps(mn);
      f(c, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo)), _mm512_set1_ps(s0), vm),
        _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi)), _mm512_set1_ps(s1), vm));
    }
  });
}

// acc[m] += x[m, k0 ..] · decoded row, over the K / QK blocks of one packed row. Four accumulators per row of
// x (even / odd chunks × halves: at M = 1 one FMA chain per chunk would bind; 4 × 4 fit the 32 registers),
// so every output is summed in the same order whatever M.
template <int32_t QT, int MB, typename OUT>
inline void dot_row(const uint8_t* row, int64_t nblocks, const float* x, int64_t ldx, OUT* y, int64_t ldy) {
  constexpr int QK = Geometry<QT>::QK, BYTES = Geometry<QT>::BYTES;
  constexpr int NA = 4;
  __m512 acc[MB][NA];
  for (int m = 0; m < MB; ++m)
    for (int a = 0; a < NA; ++a) acc[m][a] = _mm512_setzero_ps();
  auto block = [&]<int P>(int64_t b) {  // P: the parity of the block's chunk 0
    const float* xb = x + b * QK;
    _mm_prefetch(reinterpret_cast<const char*>(row + (b + 8) * BYTES), _MM_HINT_T0);
    decode_block<QT>(row + b * BYTES, [&](int c, __m512 w0, __m512 w1) {
      const int a = 2 * ((P + c) & 1);
      for (int m = 0; m < MB; ++m) {
        acc[m][a] = _mm512_fmadd_ps(_mm512_loadu_ps(xb + m * ldx + 32 * c), w0, acc[m][a]);
        acc[m][a + 1] = _mm512_fmadd_ps(_mm512_loadu_ps(xb + m * ldx + 32 * c + 16), w1, acc[m][a + 1]);
      }
    });
  };
  int64_t b = 0;
  for (; b + 2 <= nblocks; b += 2) {
    block.template operator()<0>(b);
    block.template operator()<1>(b + 1);
  }
  if (b < nblocks) block.template operator()<0>(b);
  for (int m = 0; m < MB; ++m) {
    const __m512 t = _mm512_add_ps(_mm512_add_ps(acc[m][0], acc[m][1]), _mm512_add_ps(acc[m][2], acc[m][3]));
    y[m * ldy] = out_cast<OUT>(_mm512_reduce_add_ps(t));
  }
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
template <int LO, int COUNT, bool WRAP = false>
struct IntTable {  // bf16 of the integer LO + i at index i < COUNT; WRAP: of i's COUNT-bit two's complement value
  alignas(64) uint16_t v[COUNT];
  constexpr IntTable() : v{} {
    for (int i = 0; i < COUNT; ++i) v[i] = bf16_of_int(WRAP ? (i < COUNT / 2 ? i : i - COUNT) : LO + i);
  }
};
inline constexpr IntTable<0, 32> kCodes0{};           // Q4_1, Q4_K, Q5_K: q
inline constexpr IntTable<-8, 32> kCodes8{};          // Q4_0: q - 8
inline constexpr IntTable<0, 64, true> kCodes6s{};  // Q6_K: its signed codes q - 32, indexed by their low 6 bits
static_assert(kCodes6s.v[31] == bf16_of_int(31) && kCodes6s.v[32] == bf16_of_int(-32) && kCodes6s.v[63] == 0xbf80);

template <int32_t QT>
inline constexpr bool kHasMin = QT == ::mk::kQ4_1 || QT == ::mk::kQ4_K || QT == ::mk::kQ5_K;
template <int32_t QT>
inline constexpr bool kBf16Dot = QT != ::mk::kQ8_0;

inline __m512i load_table(const uint16_t* t) { return _mm512_load_si512(t); }

// Decode one block: f(c, w, scale, mn) per chunk c of 32 weights, w = the 32 codes as bf16 (in element order),
// scale: a vector (Q6_K: lanes 0-7 the scale of elements 0-15, lanes 8-15 that of 16-31; the lanes of
// vdpbf16ps's result follow the element pairs), mn the chunk's min term (0 without one). decode_codes
// (quant_codes.h), the codes looked up as bf16 (vpermw: the low 5 / 6 bits of each index).
template <int32_t QT, typename F>
__attribute__((always_inline)) inline void decode_block_bf16(const uint8_t* blk, F&& f) {
  const __m512i t0 = load_table(QT == ::mk::kQ4_0 ? kCodes8.v : QT == ::mk::kQ6_K ? kCodes6s.v : kCodes0.v);
  [[maybe_unused]] const __m512i t1 = load_table(kCodes6s.v + 32);
  decode_codes<QT>(blk, [&](int c, __m256i codes, float s0, float s1, float mn) {
    const __m512i idx = _mm512_cvtepu8_epi16(codes);
    if constexpr (QT == ::mk::kQ6_K) {
      f(c, _mm512_permutex2var_epi16(t0, idx, t1),
        _mm512_insertf32x8(_mm512_set1_ps(s0), _mm256_set1_ps(s1), 1), 0.0f);
    } else {
      f(c, _mm512_permutexvar_epi16(idx, t0), _mm512_set1_ps(s0), kHasMin<QT> ? mn : 0.0f);
    }
  });
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

#elif defined(MK_QUANT_CODES)  // AVX2 + FMA + F16C without AVX-512

// 8 codes (bytes 8i .. 8i + 7 of c) → 8 fp32; signed or unsigned.
template <bool SIGNED>
inline __m256 codes8_f32(__m128i c8) {
  return _mm256_cvtepi32_ps(SIGNED ? _mm256_cvtepi8_epi32(c8) : _mm256_cvtepu8_epi32(c8));
}

// acc[m][v] += x[m, k0 ..] · decoded row, over the K / QK blocks of one packed row: decode_codes, then per 8
// weights codes → fp32 and one FMA s·c + mn (the weight exactly as dequant_block rounds it), one FMA with x.
// Four accumulators per row of x at M = 1 (one per 8-weight vector of a chunk: the FMA chain would bind),
// two above (the rows of x interleave; 16 registers), so M = 1 sums in another order than M > 1.
template <int32_t QT, int MB, typename OUT>
inline void dot_row(const uint8_t* row, int64_t nblocks, const float* x, int64_t ldx, OUT* y, int64_t ldy) {
  constexpr int QK = Geometry<QT>::QK, BYTES = Geometry<QT>::BYTES;
  constexpr int NA = MB == 1 ? 4 : 2;
  __m256 acc[MB][NA];
  for (int m = 0; m < MB; ++m)
    for (int a = 0; a < NA; ++a) acc[m][a] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nblocks; ++b) {
    const float* xb = x + b * QK;
    _mm_prefetch(reinterpret_cast<const char*>(row + (b + 8) * BYTES), _MM_HINT_T0);
    decode_codes<QT>(row + b * BYTES, [&](int c, __m256i codes, float s0, float s1, float mn) {
      const __m128i lo = _mm256_castsi256_si128(codes), hi = _mm256_extracti128_si256(codes, 1);
      const __m128i c8[4] = {lo, _mm_unpackhi_epi64(lo, lo), hi, _mm_unpackhi_epi64(hi, hi)};
      const __m256 vs0 = _mm256_set1_ps(s0), vs1 = _mm256_set1_ps(s1), vm = _mm256_set1_ps(mn);
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) {
        const __m256 wv = _mm256_fmadd_ps(codes8_f32<kSignedCodes<QT>>(c8[v]), v < 2 ? vs0 : vs1, vm);
        for (int m = 0; m < MB; ++m)
          acc[m][v % NA] = _mm256_fmadd_ps(_mm256_loadu_ps(xb + m * ldx + 32 * c + 8 * v), wv, acc[m][v % NA]);
      }
    });
  }
  for (int m = 0; m < MB; ++m) {
    __m256 t = acc[m][0];
    for (int a = 1; a < NA; ++a) t = _mm256_add_ps(t, acc[m][a]);
    y[m * ldy] = out_cast<OUT>(hsum8(t));
  }
}

// Σ_k q[k] · x[m, k] for int8 q (INT8_ROWWISE), 16 at a time, scalar tail.
template <int MB, typename OUT>
inline void dot_row_i8(const int8_t* q, int64_t K, const float* x, int64_t ldx, float scale, OUT* y, int64_t ldy) {
  __m256 acc0[MB], acc1[MB];
  for (int m = 0; m < MB; ++m) acc0[m] = acc1[m] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + k));
    const __m256 w0 = codes8_f32<true>(c), w1 = codes8_f32<true>(_mm_unpackhi_epi64(c, c));
    for (int m = 0; m < MB; ++m) {
      acc0[m] = _mm256_fmadd_ps(_mm256_loadu_ps(x + m * ldx + k), w0, acc0[m]);
      acc1[m] = _mm256_fmadd_ps(_mm256_loadu_ps(x + m * ldx + k + 8), w1, acc1[m]);
    }
  }
  for (int m = 0; m < MB; ++m) {
    float s = hsum8(_mm256_add_ps(acc0[m], acc1[m]));
    for (int64_t kk = k; kk < K; ++kk) s += x[m * ldx + kk] * static_cast<float>(q[kk]);
    y[m * ldy] = out_cast<OUT>(scale * s);
  }
}

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

#if !defined(MK_QUANT_CODES)
// ---- portable K-quant int8 path (the generic level): quant_codes.h's per-256 scheme in plain C++ ----------------
// The same quantization of x (per 256, sums per 16) and the same integer sums per super-block; the compiler
// vectorises the 16-element integer loops where it can (NEON, SSE2). Every level gets the same integers.
template <int32_t QT>
inline constexpr bool kInt8K = QT == ::mk::kQ4_K || QT == ::mk::kQ5_K || QT == ::mk::kQ6_K;

// One super-block's unsigned codes c[256] (Q6_K: q + 32), the int scale per 16 elements sc[16] and the int
// correction weight per 16 mn[16] (Q4_K / Q5_K: the 6-bit min of the 32 it is in; Q6_K: the scale), d, dmin.
template <int32_t QT>
inline void codes_k(const uint8_t* blk, uint8_t* c, int32_t* sc, int32_t* mn, float& d, float& dmin) {
  if constexpr (QT == ::mk::kQ4_K || QT == ::mk::kQ5_K) {
    d = load_fp16(blk), dmin = load_fp16(blk + 2);
    const uint8_t* qh = blk + 16;
    const uint8_t* qs = blk + (QT == ::mk::kQ5_K ? 48 : 16);
    for (int s = 0; s < 8; ++s) {
      int a, m;
      ::mk::scale_min_k4(s, blk + 4, a, m);
      sc[2 * s] = sc[2 * s + 1] = a;
      mn[2 * s] = mn[2 * s + 1] = m;
      const int pair = s / 2, half = s % 2;
      for (int l = 0; l < 32; ++l) {
        int q = half ? qs[32 * pair + l] >> 4 : qs[32 * pair + l] & 15;
        if constexpr (QT == ::mk::kQ5_K) q |= ((qh[l] >> s) & 1) << 4;
        c[32 * s + l] = static_cast<uint8_t>(q);
      }
    }
  } else {
    d = load_fp16(blk + 208), dmin = 0.0f;
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = blk + 64 * h;
      const uint8_t* qh = blk + 128 + 32 * h;
      uint8_t* ch = c + 128 * h;
      for (int l = 0; l < 32; ++l) {
        ch[l] = static_cast<uint8_t>((ql[l] & 15) | (((qh[l] >> 0) & 3) << 4));
        ch[l + 32] = static_cast<uint8_t>((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4));
        ch[l + 64] = static_cast<uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
        ch[l + 96] = static_cast<uint8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
      }
    }
    const int8_t* s8 = reinterpret_cast<const int8_t*>(blk + 192);
    for (int j = 0; j < 16; ++j) sc[j] = mn[j] = s8[j];
  }
}

template <int32_t QT, int MB, typename OUT>
inline void dot_row_q8k(const uint8_t* row, int64_t nblocks, const int8_t* xq, int64_t K, const float* dk,
                        const int16_t* bs, OUT* y, int64_t ldy) {
  constexpr int BYTES = Geometry<QT>::BYTES;
  const int64_t KB = K / 256;
  float acc[MB] = {};
  uint8_t c[256];
  int32_t sc[16], mn[16];
  for (int64_t b = 0; b < nblocks; ++b) {
    float d, dmin;
    codes_k<QT>(row + b * BYTES, c, sc, mn, d, dmin);
    for (int m = 0; m < MB; ++m) {
      const int8_t* q = xq + m * K + 256 * b;
      const int16_t* bsm = bs + m * (K / 16) + 16 * b;
      int32_t sum = 0, corr = 0;
      for (int j = 0; j < 16; ++j) {
        int32_t t = 0;
        for (int l = 0; l < 16; ++l) t += static_cast<int32_t>(c[16 * j + l]) * q[16 * j + l];
        sum += sc[j] * t;
        corr += mn[j] * bsm[j];
      }
      const float dx = dk[m * KB + b];
      if constexpr (QT == ::mk::kQ6_K)
        acc[m] += d * dx * static_cast<float>(sum - 32 * corr);
      else
        acc[m] += d * dx * static_cast<float>(sum) - dmin * dx * static_cast<float>(corr);
    }
  }
  for (int m = 0; m < MB; ++m) y[m * ldy] = out_cast<OUT>(acc[m]);
}

template <int32_t QT, typename OUT>
void gemv_rows_q8k(const uint8_t* w, int64_t K, const int8_t* xq, const float* dk, const int16_t* bs, int64_t M,
                   OUT* y, int64_t ldy, int64_t n0, int64_t n1) {
  const int64_t nblocks = K / 256, R = nblocks * Geometry<QT>::BYTES, KB = K / 256, K16 = K / 16;
  for (int64_t n = n0; n < n1; ++n) {
    int64_t m = 0;
    for (; m + 4 <= M; m += 4)
      dot_row_q8k<QT, 4>(w + n * R, nblocks, xq + m * K, K, dk + m * KB, bs + m * K16, y + m * ldy + n, ldy);
    for (; m < M; ++m)
      dot_row_q8k<QT, 1>(w + n * R, nblocks, xq + m * K, K, dk + m * KB, bs + m * K16, y + m * ldy + n, ldy);
  }
}

// As quant_codes.h's quantize_x_q8k: per 256, dk = max|x| / 127 (NaN if any element is NaN or ±inf),
// q = nearest-even(x · fp32(127 / max|x|)), Σ q per 16.
inline void quantize_x_q8k(const uint16_t* x, int64_t M, int64_t K, int8_t* xq, float* dk, int16_t* bs) {
  for (int64_t i = 0; i < M * (K / 256); ++i) {
    const uint16_t* xb = x + 256 * i;
    float amax = 0.0f;
    bool finite = true;
    for (int l = 0; l < 256; ++l) {
      const float v = to_f(bf16{xb[l]});
      finite = finite && std::isfinite(v);
      amax = std::max(amax, std::fabs(v));
    }
    dk[i] = finite ? amax / 127.0f : std::numeric_limits<float>::quiet_NaN();
    const float inv = finite && amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int j = 0; j < 16; ++j) {
      int32_t sum = 0;
      for (int l = 0; l < 16; ++l) {
        const int q = static_cast<int>(std::nearbyint(to_f(bf16{xb[16 * j + l]}) * inv));  // nearest even
        xq[256 * i + 16 * j + l] = static_cast<int8_t>(q);
        sum += q;
      }
      bs[16 * i + j] = static_cast<int16_t>(sum);
    }
  }
}
#endif  // portable K-quant int8 path

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

// A row whose scale is Inf or NaN: Σ_k x[k] · (q[k] · scale), the dequantized weight's product as the reference
// and the CUDA kernels form it (docs/design.md, "Non-finite values"). Factoring the scale out (the fast path)
// would turn Σ q·x ≠ 0 into ±Inf where the dequantized row holds NaN (q = 0 → 0 · Inf) or ±Inf of both signs.
template <typename OUT>
void dot_row_i8_nonfinite(const int8_t* q, int64_t K, const float* x, int64_t M, float scale, OUT* y, int64_t ldy) {
  for (int64_t m = 0; m < M; ++m) {
    float s = 0.f;
    for (int64_t k = 0; k < K; ++k) s += x[m * K + k] * (static_cast<float>(q[k]) * scale);
    y[m * ldy] = out_cast<OUT>(s);
  }
}

template <typename OUT>
void gemv_rows_i8(const int8_t* w, const float* scales, int64_t K, const float* x, int64_t M, OUT* y,
                         int64_t ldy, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) {
    const int8_t* row = w + n * K;
    if (!std::isfinite(scales[n])) {
      dot_row_i8_nonfinite(row, K, x, M, scales[n], y + n, ldy);
      continue;
    }
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
