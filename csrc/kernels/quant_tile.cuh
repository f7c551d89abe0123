// quant_tile.cuh — the W-tile decode of the tile GEMM (quant_gemm.cuh, and the grouped moe_qgemm.cuh):
// a thread's 32 weights of one 64-wide K tile of one weight row, in two steps so the loads of tile kt+1 are
// in flight while the tensor cores work on tile kt:
//   qtile_fetch<QT>   the packed bytes into registers: 16 bytes of quants per run (4-byte loads; 2-byte
//                     aligned formats through an aligned word pair and one 64-bit shift), the block's fp16
//                     scale fields and the super-block's packed 6-bit scales as whole words;
//   qtile_decode<QT>  registers → two runs of 16 floats: scales decoded once per thread per tile (not per
//                     unit of 8 weights), the quants as byte-parallel word operations (nibble masks, Q5_K /
//                     Q6_K high bits, the Q8_0 sign flip: one instruction per 4 weights), then per weight one
//                     byte → float (an OR into 2^23's bits, exact) and one FFMA / FFMA-free subtraction + FMUL.
// The values equal dequant_unit's (quant_blocks.h) bit for bit: the same fp32 products in the same order.
//
// Shapes: a K tile t of 64 weights of a row (t = 0 … ceil(K / 64) - 1), thread half hh = 0 / 1 (two threads
// per row: 64 rows × 2 = the GEMM's 128 threads). Runs A and B are 16 consecutive tile elements each:
//   Q4_0 / Q4_1  block 2t + hh (32 weights): low nibbles → A at 32·hh, high → B at 32·hh + 16
//   Q8_0         block 2t + hh: qs[0..15] → A at 32·hh, qs[16..31] → B at 32·hh + 16
//   Q4_K / Q5_K  super-block t / 4, pair p = t % 4: qs[32p + 16hh …] low nibbles (sub-block 2p) → A at 16·hh,
//                high (sub-block 2p + 1) → B at 32 + 16·hh (Q5_K: bits 2p / 2p + 1 of qh[16hh …])
//   Q6_K         super-block t / 4, half h = (t / 2) % 2, nibble nib = t % 2: l = 16hh + j, ql[64h + l] → A at
//                16·hh, ql[64h + 32 + l] → B at 32 + 16·hh, with qh[32h + l] bits 4nib, 4nib + 2; scales
//                8h + 4nib + hh (A) and + 2 (B)
// Blocks past K (the second half of the last tile when K is an odd multiple of 32) decode to ±0.
// Worked example (Q4_0, t = 0, hh = 1): block 1 at row + 18: d = fp16 at row + 18, quants row + 20 … + 35;
// qs[0] = 0x9F → A[0] = tile element 32 = d·(15 - 8), B[0] = tile element 48 = d·(9 - 8).
#pragma once

#include <cstdint>

#include "../simt/portable.cuh"
#include "common.cuh"
#include "quant_blocks.h"

namespace mk::inline MK_ABI {

// Float of byte J of w, exact: unsigned (0 … 255) or signed (the byte as int8). On the GPU one PRMT (the byte
// alone, zero- or sign-filled: selector nibbles 4 = a zero byte, 8 | J = byte J's sign) and one I2FP.
template <int J, bool SIGNED>
MK_HD float qtile_byte(uint32_t w) {
#if defined(__CUDA_ARCH__)
  if constexpr (SIGNED) {  // prmt's sign mode (the msb of a selector nibble), which __byte_perm masks off
    constexpr uint32_t sel = J | (8u | J) << 4 | (8u | J) << 8 | (8u | J) << 12;
    uint32_t v;
    asm("prmt.b32 %0, %1, 0, %2;" : "=r"(v) : "r"(w), "n"(sel));
    return static_cast<float>(static_cast<int32_t>(v));
  } else {
    return static_cast<float>(__byte_perm(w, 0u, 0x4440u + J));
  }
#else
  const uint32_t b = (w >> (8 * J)) & 255u;
  return SIGNED ? static_cast<float>(static_cast<int8_t>(b)) : static_cast<float>(b);
#endif
}

// 16 bytes at p as 4 little-endian words: p 4-byte aligned (A4) or 2-byte aligned (on the GPU: the four
// aligned words from p rounded down, when p is not 4-aligned one 2-byte load of p[14..15], joined by a
// 64-bit shift; nothing outside p[-2 … 15] is read).
template <bool A4>
MK_HD void qtile_load16(const uint8_t* p, uint32_t (&v)[4]) {
#if defined(__CUDA_ARCH__)
  if constexpr (A4) {
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = load_u32(p + 4 * i);
  } else {
    const uint32_t off = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(p)) & 2u, sh = 8u * off;
    const uint32_t* b = reinterpret_cast<const uint32_t*>(p - off);  // derived from p: stays a global load
    uint32_t w[5];
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = b[i];
    w[4] = sh != 0 ? load_u16(p + 14) : 0u;  // p[14], p[15] alone: no byte past p[15] is read
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = static_cast<uint32_t>((static_cast<uint64_t>(w[i + 1]) << 32 | w[i]) >> sh);
  }
#else
  for (int i = 0; i < 4; ++i)
    v[i] = static_cast<uint32_t>(p[4 * i]) | static_cast<uint32_t>(p[4 * i + 1]) << 8 |
           static_cast<uint32_t>(p[4 * i + 2]) << 16 | static_cast<uint32_t>(p[4 * i + 3]) << 24;
#endif
}

// The registers one thread holds between fetch and decode (each format fills the fields it uses).
struct QTileRaw {
  uint32_t a[4], b[4], hi[4];  // quants of run A, of run B (Q8_0, Q6_K), high bits (Q5_K, Q6_K)
  uint32_t f0, f1;            // fp16 fields (d | dmin << 16, or d | m << 16), Q6_K: d and its two int8 scales
  uint32_t sw[3];             // Q4_K / Q5_K: the 12 packed scale bytes
};

// Alignment the GEMM launchers require of qweight's first byte for every block format (the 2-byte aligned
// formats' word loads reach 2 bytes below a run: inside the block, or the row's previous block).
inline constexpr int kQTileAlign = 4;

template <int32_t QT>
inline constexpr bool kQTileFormat = QT == kQ4_0 || QT == kQ4_1 || QT == kQ8_0 || QT == kQ4_K || QT == kQ5_K ||
                                     QT == kQ6_K;

// Tile elements of runs A and B (table above).
template <int32_t QT>
MK_HD int qtile_run_a(int hh) {
  return QT == kQ4_K || QT == kQ5_K || QT == kQ6_K ? 16 * hh : 32 * hh;
}
template <int32_t QT>
MK_HD int qtile_run_b(int hh) {
  return QT == kQ4_K || QT == kQ5_K || QT == kQ6_K ? 32 + 16 * hh : 32 * hh + 16;
}

// Loads of tile t, half hh of the packed row `row` (a valid row: the caller clamps rows past N to row N-1, whose
// outputs it never stores) with K weights. A block past K (block formats of 32) loads the tile's first block
// again with its scale fields zeroed, so it decodes to ±0 (the quants are finite integers): no branch.
template <int32_t QT>
__device__ __forceinline__ void qtile_fetch(const uint8_t* row, int t, int hh, int64_t K, QTileRaw& r) {
  constexpr QFormat f = qformat(QT);
  if constexpr (f.block == 32) {
    const bool in_k = static_cast<int64_t>(2 * t + hh) * 32 < K;
    const uint8_t* blk = row + static_cast<int64_t>(in_k ? 2 * t + hh : 2 * t) * f.bytes;
    if constexpr (QT == kQ4_1) {
      r.f0 = load_u32(blk);
      qtile_load16<true>(blk + 4, r.a);
    } else {
      r.f0 = load_u16(blk);
      qtile_load16<false>(blk + 2, r.a);
      if constexpr (QT == kQ8_0) qtile_load16<false>(blk + 18, r.b);
    }
    r.f0 = in_k ? r.f0 : 0u;
  } else {
    const uint8_t* blk = row + static_cast<int64_t>(t >> 2) * f.bytes;
    if constexpr (QT == kQ4_K || QT == kQ5_K) {
      const int p = t & 3;
      r.f0 = load_u32(blk);
      r.sw[0] = load_u32(blk + 4), r.sw[1] = load_u32(blk + 8), r.sw[2] = load_u32(blk + 12);
      qtile_load16<true>(blk + (QT == kQ5_K ? 48 : 16) + 32 * p + 16 * hh, r.a);
      if constexpr (QT == kQ5_K) qtile_load16<true>(blk + 16 + 16 * hh, r.hi);
    } else {  // Q6_K
      const int h = (t >> 1) & 1, nib = t & 1;
      const uint8_t* sc = blk + 192 + 8 * h + 4 * nib + hh;
      r.f0 = load_u16(blk + 208);
      r.f1 = static_cast<uint32_t>(sc[0]) | static_cast<uint32_t>(sc[2]) << 8;
      qtile_load16<false>(blk + 64 * h + 16 * hh, r.a);
      qtile_load16<false>(blk + 64 * h + 32 + 16 * hh, r.b);
      qtile_load16<false>(blk + 128 + 32 * h + 16 * hh, r.hi);
    }
  }
}

// Q4_K / Q5_K: the 6-bit scales (byte 0: sub-block 2p, byte 1: 2p + 1) and mins of pair p from the three
// packed words (scale_min_k4 on registers, both sub-blocks at once, no branch): with i = 8·(2p % 4),
// p < 2: sc = q[s] & 63, m = q[s + 4] & 63; p ≥ 2: sc = (q[s + 4] & 15) | (q[s - 4] >> 6) << 4,
// m = (q[s + 4] >> 4) | (q[s] >> 6) << 4 — q[s - 4], q[s], q[s + 4] being bytes i / 8 of words 0, 1, 2.
MK_HD void qtile_scales_k4(int p, const uint32_t (&w)[3], uint32_t& sc, uint32_t& m) {
  const int i = 16 * (p & 1);
  const uint32_t a0 = w[0] >> i, a1 = w[1] >> i, a2 = w[2] >> i;
  const bool hi = p >= 2;
  sc = hi ? (a2 & 0x0F0Fu) | ((a0 >> 2) & 0x3030u) : a0 & 0x3F3Fu;
  m = hi ? ((a2 >> 4) & 0x0F0Fu) | ((a1 >> 2) & 0x3030u) : a1 & 0x3F3Fu;
}

// Registers of tile t → ya (run A), yb (run B).
template <int32_t QT>
__device__ __forceinline__ void qtile_decode(const QTileRaw& r, int t, float (&ya)[16], float (&yb)[16]) {
  if constexpr (QT == kQ8_0 || QT == kQ6_K) {  // y = s · q, q a signed byte
    float sa, sb;
    uint32_t qa[4], qb[4];
    if constexpr (QT == kQ8_0) {
      sa = sb = fp16_to_float(static_cast<uint16_t>(r.f0));
#pragma unroll
      for (int i = 0; i < 4; ++i) qa[i] = r.a[i], qb[i] = r.b[i];
    } else {
      // q − 32 for a 6-bit q is the 6-bit two's complement of q ^ 32; shifted left by 2 it is the int8 4·(q − 32),
      // and s / 4 (exact: a power of two) times it is s·(q − 32) rounded once, as dequant_unit's product
      const float d = fp16_to_float(static_cast<uint16_t>(r.f0));
      sa = d * static_cast<float>(static_cast<int8_t>(r.f1 & 255u)) * 0.25f;
      sb = d * static_cast<float>(static_cast<int8_t>(r.f1 >> 8)) * 0.25f;
      const int nib = 4 * (t & 1);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        qa[i] = ((((r.a[i] >> nib) & 0x0F0F0F0Fu) | ((r.hi[i] >> nib) & 0x03030303u) << 4) ^ 0x20202020u) << 2;
        qb[i] = ((((r.b[i] >> nib) & 0x0F0F0F0Fu) | ((r.hi[i] >> (nib + 2)) & 0x03030303u) << 4) ^ 0x20202020u) << 2;
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      ya[4 * i + 0] = sa * qtile_byte<0, true>(qa[i]), yb[4 * i + 0] = sb * qtile_byte<0, true>(qb[i]);
      ya[4 * i + 1] = sa * qtile_byte<1, true>(qa[i]), yb[4 * i + 1] = sb * qtile_byte<1, true>(qb[i]);
      ya[4 * i + 2] = sa * qtile_byte<2, true>(qa[i]), yb[4 * i + 2] = sb * qtile_byte<2, true>(qb[i]);
      ya[4 * i + 3] = sa * qtile_byte<3, true>(qa[i]), yb[4 * i + 3] = sb * qtile_byte<3, true>(qb[i]);
    }
  } else {  // 4-bit formats: y = fma(s, q, o)
    float sa, oa, sb, ob;
    uint32_t ha[4] = {0, 0, 0, 0}, hb[4] = {0, 0, 0, 0};
    if constexpr (QT == kQ4_0 || QT == kQ4_1) {
      const float d = fp16_to_float(static_cast<uint16_t>(r.f0));
      sa = sb = d;
      oa = ob = QT == kQ4_1 ? fp16_to_float(static_cast<uint16_t>(r.f0 >> 16)) : -8.0f * d;
    } else {  // Q4_K / Q5_K: sub-blocks 2p (A) and 2p + 1 (B)
      const int p = t & 3;
      const float d = fp16_to_float(static_cast<uint16_t>(r.f0)), dmin = fp16_to_float(static_cast<uint16_t>(r.f0 >> 16));
      uint32_t sc, mn;
      qtile_scales_k4(p, r.sw, sc, mn);
      sa = d * qtile_byte<0, false>(sc), oa = -(dmin * qtile_byte<0, false>(mn));
      sb = d * qtile_byte<1, false>(sc), ob = -(dmin * qtile_byte<1, false>(mn));
      if constexpr (QT == kQ5_K) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          ha[i] = ((r.hi[i] >> (2 * p)) & 0x01010101u) << 4;
          hb[i] = ((r.hi[i] >> (2 * p + 1)) & 0x01010101u) << 4;
        }
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t lo = (r.a[i] & 0x0F0F0F0Fu) | ha[i], hi = ((r.a[i] >> 4) & 0x0F0F0F0Fu) | hb[i];
      ya[4 * i + 0] = fmaf(sa, qtile_byte<0, false>(lo), oa), yb[4 * i + 0] = fmaf(sb, qtile_byte<0, false>(hi), ob);
      ya[4 * i + 1] = fmaf(sa, qtile_byte<1, false>(lo), oa), yb[4 * i + 1] = fmaf(sb, qtile_byte<1, false>(hi), ob);
      ya[4 * i + 2] = fmaf(sa, qtile_byte<2, false>(lo), oa), yb[4 * i + 2] = fmaf(sb, qtile_byte<2, false>(hi), ob);
      ya[4 * i + 3] = fmaf(sa, qtile_byte<3, false>(lo), oa), yb[4 * i + 3] = fmaf(sb, qtile_byte<3, false>(hi), ob);
    }
  }
}

}  // namespace mk::inline MK_ABI
