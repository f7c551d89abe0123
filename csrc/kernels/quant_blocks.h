// quant_blocks.h — the quantized weight formats, written once: their codes, block geometry and the scalar
// decoding of one block. Framework-free: plain C++ under g++ (csrc/cpu, csrc/checks, the emulator) and
// __host__ __device__ under nvcc. The SIMD / warp kernels (csrc/cpu/quant*.cpp, csrc/kernels/quant*.cuh)
// decode the same bytes faster; tests check them against the `gguf` package's dequantization.
//
// A quantized weight W [N, K] is stored row by row: row n is K / QK blocks of `bytes` bytes each (GGUF's
// layout: a GGUF tensor of ne = [K, N] is exactly this), so qweight is uint8 [N, K / QK · bytes].
// Exception: kInt8Rowwise (our int8 weight-only format) is int8 [N, K] plus fp32 scales [N]:
// W[n, k] = qweight[n, k] · scales[n].
//
// Block layouts (GGML's, little-endian; d / dmin are IEEE fp16, QK elements per block):
//   Q4_0  QK 32,  18 B: d, qs[16]               y[j] = d·((qs[j] & 15) - 8),  y[j+16] = d·((qs[j] >> 4) - 8)
//   Q4_1  QK 32,  20 B: d, m, qs[16]            y[j] = d·(qs[j] & 15) + m,    y[j+16] = d·(qs[j] >> 4) + m
//   Q8_0  QK 32,  34 B: d, int8 qs[32]          y[j] = d·qs[j]
//   Q4_K  QK 256, 144 B: d, dmin, scales[12], qs[128]
//         8 sub-blocks of 32 with 6-bit scale sc_s and min m_s (packed in `scales`, see scale_min_k4);
//         sub-blocks 2i, 2i+1 share qs[32i .. 32i+31]: low nibbles → 2i, high nibbles → 2i+1;
//         y = d·sc_s·q - dmin·m_s
//   Q5_K  QK 256, 176 B: d, dmin, scales[12], qh[32], qs[128]
//         as Q4_K with a 5th bit: sub-block s takes bit s of qh[l] for its element l (l = 0..31)
//   Q6_K  QK 256, 210 B: ql[128], qh[64], int8 scales[16], d (fp16 at the end)
//         16 sub-blocks of 16, y = d·scales[s]·(q - 32), q = 4 low bits from ql | 2 high bits from qh;
//         for half h (128 elements: ql + 64h, qh + 32h, scales + 8h) and l = 0..31:
//           q(l)      = (ql[l]      & 15) | ((qh[l] >> 0) & 3) << 4     scale index  l/16
//           q(l + 32) = (ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4     scale index  l/16 + 2
//           q(l + 64) = (ql[l]      >> 4) | ((qh[l] >> 4) & 3) << 4     scale index  l/16 + 4
//           q(l + 96) = (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4     scale index  l/16 + 6
//
// Worked example (Q4_0): bytes 00 3C | 9F ... → d = fp16 0x3C00 = 1.0; qs[0] = 0x9F → y[0] = (0xF - 8) = 7,
// y[16] = (0x9 - 8) = 1.
#pragma once

#include <cstdint>

#include "common.cuh"
#include "fp16_bits.h"

namespace mk::inline MK_ABI {

// Format codes: GGML's type numbers for the GGUF block formats; kInt8Rowwise is the project's own.
enum QType : int32_t {
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ8_0 = 8,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kInt8Rowwise = 1000,
};

// The formats with native kernels, as X(code, name, QK, bytes per block).
#define MK_QTYPES(X)        \
  X(kQ4_0, "Q4_0", 32, 18)  \
  X(kQ4_1, "Q4_1", 32, 20)  \
  X(kQ8_0, "Q8_0", 32, 34)  \
  X(kQ4_K, "Q4_K", 256, 144) \
  X(kQ5_K, "Q5_K", 256, 176) \
  X(kQ6_K, "Q6_K", 256, 210) \
  X(kInt8Rowwise, "INT8_ROWWISE", 1, 1)

struct QFormat {
  int32_t qtype;     // QType code, 0 when unknown
  const char* name;  // e.g. "Q4_K"
  int block;         // QK: elements per block
  int bytes;         // bytes per block
};

// The geometry of `qtype`, or {0, "unknown", 0, 0} for a code without native kernels.
MK_HD constexpr QFormat qformat(int32_t qtype) {
#define MK_QFORMAT_CASE(code, nm, qk, nb) \
  if (qtype == code) return QFormat{code, nm, qk, nb};
  MK_QTYPES(MK_QFORMAT_CASE)
#undef MK_QFORMAT_CASE
  return QFormat{0, "unknown", 0, 0};
}

// IEEE fp16 bits → float, exact for every input: on the GPU the hardware conversion (cvt.f32.f16, one
// instruction), elsewhere fp16_bits_to_float (fp16_bits.h).
MK_HD float fp16_to_float(uint16_t h) {
#if defined(__CUDA_ARCH__)
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
#else
  return fp16_bits_to_float(h);
#endif
}

// The fp16 at p (on the GPU one 2-byte load: every fp16 field of a block at kUnitAlign is 2-byte aligned).
MK_HD float load_fp16(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return fp16_to_float(*reinterpret_cast<const uint16_t*>(p));
#else
  return fp16_to_float(static_cast<uint16_t>(p[0] | (static_cast<uint16_t>(p[1]) << 8)));
#endif
}

// Q4_K / Q5_K: 6-bit scale and min of sub-block s (0..7) from the 12 packed bytes q.
// s < 4: sc = q[s] & 63, m = q[s + 4] & 63; s ≥ 4: the low 4 bits come from q[s + 4] (sc: low nibble, m: high
// nibble) and the top 2 bits from the top bits of q[s - 4] (sc) and q[s] (m).
MK_HD void scale_min_k4(int s, const uint8_t* q, int& sc, int& m) {
  if (s < 4) {
    sc = q[s] & 63;
    m = q[s + 4] & 63;
  } else {
    sc = (q[s + 4] & 0xF) | ((q[s - 4] >> 6) << 4);
    m = (q[s + 4] >> 4) | ((q[s] >> 6) << 4);
  }
}

// Decode one block of format QT at `blk` into y[0 .. QK-1] (scalar; the reference the fast kernels follow).
template <int32_t QT>
MK_HD void dequant_block(const uint8_t* blk, float* y) {
  if constexpr (QT == kQ4_0 || QT == kQ4_1) {
    const float d = load_fp16(blk);
    const float m = QT == kQ4_1 ? load_fp16(blk + 2) : -8.0f * d;
    const uint8_t* qs = blk + (QT == kQ4_1 ? 4 : 2);
    for (int j = 0; j < 16; ++j) {
      y[j] = d * static_cast<float>(qs[j] & 15) + m;
      y[j + 16] = d * static_cast<float>(qs[j] >> 4) + m;
    }
  } else if constexpr (QT == kQ8_0) {
    const float d = load_fp16(blk);
    const int8_t* qs = reinterpret_cast<const int8_t*>(blk + 2);
    for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(qs[j]);
  } else if constexpr (QT == kQ4_K || QT == kQ5_K) {
    const float d = load_fp16(blk);
    const float dmin = load_fp16(blk + 2);
    const uint8_t* scales = blk + 4;
    const uint8_t* qh = blk + 16;                        // Q5_K only
    const uint8_t* qs = blk + (QT == kQ5_K ? 48 : 16);
    for (int pair = 0; pair < 4; ++pair) {               // sub-blocks 2·pair (low nibbles), 2·pair + 1 (high)
      for (int half = 0; half < 2; ++half) {
        const int s = 2 * pair + half;
        int sc, mn;
        scale_min_k4(s, scales, sc, mn);
        const float ds = d * static_cast<float>(sc), ms = dmin * static_cast<float>(mn);
        for (int l = 0; l < 32; ++l) {
          int q = half ? qs[32 * pair + l] >> 4 : qs[32 * pair + l] & 15;
          if constexpr (QT == kQ5_K) q |= ((qh[l] >> s) & 1) << 4;
          y[32 * s + l] = ds * static_cast<float>(q) - ms;
        }
      }
    }
  } else if constexpr (QT == kQ6_K) {
    const float d = load_fp16(blk + 208);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = blk + 64 * h;
      const uint8_t* qh = blk + 128 + 32 * h;
      const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192) + 8 * h;
      float* yh = y + 128 * h;
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 15) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        yh[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
        yh[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        yh[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        yh[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
    }
  }
}

// ---- units: 8 weights decoded together (the CUDA kernels, csrc/kernels/quant_gemv.cuh / quant_gemm.cuh) ----
// A row of K weights is K / 8 units (INT8_ROWWISE: ceil(K / 8)); unit U of a row lies in block U / kUnits<QT>
// as that block's unit u = U % kUnits<QT>. A unit is two groups of 4 consecutive weights, y[0..3] at block
// elements unit_elem<QT>(u, 0) + 0..3 and y[4..7] at unit_elem<QT>(u, 1) + 0..3; both groups of a unit lie
// in the same 64-element range of K (range U / 8), so a 64-wide K tile holds exactly units 8t … 8t + 7.
//   Q4_0 / Q4_1  u 0..3:  qs[4u .. 4u+3], low nibbles → 4u + j, high nibbles → 16 + 4u + j
//   Q8_0         u 0..3:  qs[8u .. 8u+7] → 8u + j, 8u + 4 + j
//   Q4_K / Q5_K  u 0..31: pair p = u / 8, l0 = 4·(u % 8): qs[32p + l0 .. +3], low nibbles → sub-block 2p,
//                         element 64p + l0 + j; high nibbles → sub-block 2p + 1, element 64p + 32 + l0 + j
//                         (Q5_K: bits 2p / 2p + 1 of qh[l0 + j])
//   Q6_K         u 0..31: half h = u / 16, nib = (u / 8) % 2, l0 = 4·(u % 8): ql[64h + l0 + j] and
//                         ql[64h + 32 + l0 + j], low nibbles (nib 0: q1 / q2 of the layout above) or high
//                         (nib 1: q3 / q4), with qh[32h + l0 + j] bits 4·nib + 0..1 / 4·nib + 2..3 →
//                         elements 128h + 64·nib + l0 + j and 128h + 64·nib + 32 + l0 + j
//   INT8_ROWWISE u 0:     8 consecutive int8 (the caller applies the row scale)
// Values are bit-identical to dequant_block (same products, same order; an FMA rounds d·q + m once, as the
// exact d·q plus m does).
template <int32_t QT>
inline constexpr int kUnits = QT == kQ4_K || QT == kQ5_K || QT == kQ6_K ? 32 : QT == kInt8Rowwise ? 1 : 4;

template <int32_t QT>
MK_HD int unit_elem(int u, int g) {
  if constexpr (QT == kQ4_0 || QT == kQ4_1) return 4 * u + 16 * g;
  else if constexpr (QT == kQ8_0 || QT == kInt8Rowwise) return 8 * u + 4 * g;
  else return 64 * (u / 8) + 32 * g + 4 * (u % 8);  // Q4_K / Q5_K: 64p; Q6_K: 128h + 64·nib = 64·(u / 8)
}

// Small non-negative integer (< 2^23) → float, exact: one OR and one subtraction on the GPU (the I2F
// conversion runs at a quarter of the FMA rate on sm_80 / sm_90).
MK_HD float small_u2f(uint32_t q) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(0x4B000000u | q) - 8388608.0f;
#else
  return static_cast<float>(q);
#endif
}

// 16 / 32-bit little-endian loads at an address aligned to their size (see kUnitAlign).
MK_HD uint32_t load_u16(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }
MK_HD uint32_t load_u32(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }
// Four bytes at a 2-byte aligned address.
MK_HD uint32_t load_u32_a2(const uint8_t* p) { return load_u16(p) | load_u16(p + 2) << 16; }

// Alignment the unit loads need of a block's address: 4 where every block starts at a multiple of 4
// (Q4_1 20 B, Q4_K 144 B, Q5_K 176 B), else 2 (Q4_0 18 B, Q8_0 34 B, Q6_K 210 B). A packed row is a whole
// number of blocks, so a qweight whose first byte is 4-aligned serves every row.
template <int32_t QT>
inline constexpr int kUnitAlign = QT == kQ4_1 || QT == kQ4_K || QT == kQ5_K ? 4 : 2;

// Decodes unit u (0 … kUnits<QT> - 1) of the GGUF block at `blk` into y[0..7] (layout above).
template <int32_t QT>
MK_HD void dequant_unit(const uint8_t* blk, int u, float (&y)[8]) {
  if constexpr (QT == kQ4_0 || QT == kQ4_1) {
    const float d = load_fp16(blk);
    const float m = QT == kQ4_1 ? load_fp16(blk + 2) : -8.0f * d;
    const uint32_t w = QT == kQ4_1 ? load_u32(blk + 4 + 4 * u) : load_u32_a2(blk + 2 + 4 * u);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      y[j] = fmaf(d, small_u2f((w >> (8 * j)) & 15u), m);
      y[j + 4] = fmaf(d, small_u2f((w >> (8 * j + 4)) & 15u), m);
    }
  } else if constexpr (QT == kQ8_0) {
    const float d = load_fp16(blk);
    const uint32_t w0 = load_u32_a2(blk + 2 + 8 * u), w1 = load_u32_a2(blk + 6 + 8 * u);
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // (b ^ 0x80) - 128 = the int8 value b
      y[j] = d * (small_u2f(((w0 >> (8 * j)) & 255u) ^ 128u) - 128.0f);
      y[j + 4] = d * (small_u2f(((w1 >> (8 * j)) & 255u) ^ 128u) - 128.0f);
    }
  } else if constexpr (QT == kQ4_K || QT == kQ5_K) {
    const int p = u / 8, l0 = 4 * (u % 8);
    const float d = load_fp16(blk), dmin = load_fp16(blk + 2);
    int sc0, m0, sc1, m1;
    scale_min_k4(2 * p, blk + 4, sc0, m0);
    scale_min_k4(2 * p + 1, blk + 4, sc1, m1);
    const float ds0 = d * static_cast<float>(sc0), ms0 = dmin * static_cast<float>(m0);
    const float ds1 = d * static_cast<float>(sc1), ms1 = dmin * static_cast<float>(m1);
    const uint32_t w = load_u32(blk + (QT == kQ5_K ? 48 : 16) + 32 * p + l0);
    uint32_t h0 = 0, h1 = 0;
    if constexpr (QT == kQ5_K) {
      const uint32_t qh = load_u32(blk + 16 + l0);  // qh[l0 .. l0+3]
      h0 = (qh >> (2 * p)) & 0x01010101u;           // bit 2p of each byte, at bit 0 of the byte
      h1 = (qh >> (2 * p + 1)) & 0x01010101u;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t q0 = ((w >> (8 * j)) & 15u) | ((h0 >> (8 * j)) & 1u) << 4;
      const uint32_t q1 = ((w >> (8 * j + 4)) & 15u) | ((h1 >> (8 * j)) & 1u) << 4;
      y[j] = fmaf(ds0, small_u2f(q0), -ms0);
      y[j + 4] = fmaf(ds1, small_u2f(q1), -ms1);
    }
  } else if constexpr (QT == kQ6_K) {
    const int h = u / 16, nib = (u / 8) % 2, l0 = 4 * (u % 8);
    const float d = load_fp16(blk + 208);
    const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192) + 8 * h + l0 / 16 + 4 * nib;
    const float s0 = d * static_cast<float>(sc[0]), s1 = d * static_cast<float>(sc[2]);
    const uint32_t a = load_u32_a2(blk + 64 * h + l0), b = load_u32_a2(blk + 64 * h + 32 + l0);
    const uint32_t qh = load_u32_a2(blk + 128 + 32 * h + l0) >> (4 * nib);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t q0 = ((a >> (8 * j + 4 * nib)) & 15u) | ((qh >> (8 * j)) & 3u) << 4;
      const uint32_t q1 = ((b >> (8 * j + 4 * nib)) & 15u) | ((qh >> (8 * j + 2)) & 3u) << 4;
      y[j] = s0 * (small_u2f(q0) - 32.0f);
      y[j + 4] = s1 * (small_u2f(q1) - 32.0f);
    }
  }
}

// Call f.template operator()<QT>() with the compile-time code of `qtype` (a GGUF block format); false when
// `qtype` has no block kernel (kInt8Rowwise is handled by its callers, it has no blocks).
template <typename F>
bool with_block_qtype(int32_t qtype, F&& f) {
  switch (qtype) {
    case kQ4_0: f.template operator()<kQ4_0>(); return true;
    case kQ4_1: f.template operator()<kQ4_1>(); return true;
    case kQ8_0: f.template operator()<kQ8_0>(); return true;
    case kQ4_K: f.template operator()<kQ4_K>(); return true;
    case kQ5_K: f.template operator()<kQ5_K>(); return true;
    case kQ6_K: f.template operator()<kQ6_K>(); return true;
    default: return false;
  }
}

}  // namespace mk::inline MK_ABI
