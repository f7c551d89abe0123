// cpu/quant_kernels.h — the CPU kernels of qlinear on quantized weights, framework-free (plain pointers; the
// ATen glue, argument checks and the prefill GEMM call are csrc/cpu/quant.cpp). Formats and the scalar block
// decoding they follow: csrc/kernels/quant_blocks.h.
// Shape letters: M rows of x (tokens), K in features, N out features, QK elements per block, R packed row bytes.
//
// gemv_rows<QT>   y[M, n0..n1) = x[M, K] · W[n0..n1, K]ᵀ for decode-sized M (≤ 16), x and y fp32.
//     Streams each packed row of W once from memory and decodes its blocks in registers: AVX-512 (F + BW + VL)
//     unpacks 32 weights at a time to two fp32 vectors (nibbles / bytes → int32 → fp32, scale and min applied
//     by one FMA) and FMAs them against fp32 activations, up to 4 rows of x per pass (M > 4 re-reads the
//     packed row from L1, not from memory). The activations are not quantized, so the result equals the
//     fp32 matmul of gguf's dequantized weight up to fp32 summation order.
//     Bound: memory, N·R packed bytes per call (e.g. Q4_0 4.5 bits per weight) / copy bandwidth; the decode
//     costs ~3 vector ops per 16 weights, below the stream rate of one core for M ≤ 4 (benchmarks/
//     results/quant_cpu.md has the measured GB/s and % of copy bandwidth).
// dequant_rows<QT> W[n0..n1, K] → fp32 or bf16 rows (the prefill path: tiles of W for a GEMM). Bound: the
//     GEMM that follows, 2·M·N·K FLOPs; the dequantization is N·K stores, O(1/M) of the work.
// Portable path (no AVX-512): dequant_block<QT> into a 256-float buffer and a plain dot product.
// INT8_ROWWISE (int8 [N, K] + fp32 scales [N]) has its own loops: W[n, k] = q[n, k] · scale[n], applied as
// scale[n] · Σ_k q[n, k] · x[k].
#pragma once

#include <cstdint>
#include <cstring>

#include "../kernels/quant_blocks.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define MK_QUANT_AVX512 1
#include <immintrin.h>
#endif

namespace mk::cpu::quant {

using ::mk::dequant_block;
using ::mk::load_fp16;
using ::mk::QType;

inline constexpr int kMaxMB = 4;  // rows of x per pass over a packed row (4 × 2 accumulators)

// bf16 bits of f, round to nearest even (NaN → 0x7fc0), as cpu/common.h from_f<BFloat16>.
inline uint16_t bf16_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
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
// 16 unsigned bytes → 16 fp32
inline __m512 u8_to_f32(__m128i v) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v)); }
inline __m512 i8_to_f32(__m128i v) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)); }

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
    const uint8_t* sc = blk + 4;
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
        int isc, imn;
        ::mk::scale_min_k4(s, sc, isc, imn);
        const __m512 vd = _mm512_set1_ps(d * static_cast<float>(isc));
        const __m512 vm = _mm512_set1_ps(-dmin * static_cast<float>(imn));
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
template <int32_t QT, int MB>
inline void dot_row(const uint8_t* row, int64_t nblocks, const float* x, int64_t ldx, float* y, int64_t ldy) {
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
  for (int m = 0; m < MB; ++m) y[m * ldy] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[m], acc1[m]));
}

// Σ_k q[k] · x[m, k] for int8 q (INT8_ROWWISE), 32 at a time with a masked tail.
template <int MB>
inline void dot_row_i8(const int8_t* q, int64_t K, const float* x, int64_t ldx, float scale, float* y, int64_t ldy) {
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
  for (int m = 0; m < MB; ++m) y[m * ldy] = scale * _mm512_reduce_add_ps(_mm512_add_ps(acc0[m], acc1[m]));
}

#else  // portable

template <int32_t QT, int MB>
inline void dot_row(const uint8_t* row, int64_t nblocks, const float* x, int64_t ldx, float* y, int64_t ldy) {
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
    y[m * ldy] = s;
  }
}

template <int MB>
inline void dot_row_i8(const int8_t* q, int64_t K, const float* x, int64_t ldx, float scale, float* y, int64_t ldy) {
  float acc[MB][16] = {};
  int64_t k = 0;
  for (; k + 16 <= K; k += 16)
    for (int m = 0; m < MB; ++m)
      for (int l = 0; l < 16; ++l) acc[m][l] += x[m * ldx + k + l] * static_cast<float>(q[k + l]);
  for (int m = 0; m < MB; ++m) {
    float s = 0.f;
    for (int l = 0; l < 16; ++l) s += acc[m][l];
    for (int64_t kk = k; kk < K; ++kk) s += x[m * ldx + kk] * static_cast<float>(q[kk]);
    y[m * ldy] = scale * s;
  }
}

#endif

// y[M, n] for n in [n0, n1): y has leading dimension ldy (N). x [M, K] fp32 contiguous.
template <int32_t QT>
void gemv_rows(const uint8_t* w, int64_t K, const float* x, int64_t M, float* y, int64_t ldy, int64_t n0,
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

inline void gemv_rows_i8(const int8_t* w, const float* scales, int64_t K, const float* x, int64_t M, float* y,
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

}  // namespace mk::cpu::quant
