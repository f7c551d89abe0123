// cpu/isa/quant_gemm8.h — the prefill GEMM of qlinear for bf16 x on quantized W with int8 activations
// (quant_gemm8.cpp; the glue and the tiling: csrc/cpu/quant.cpp). AVX512-VNNI levels, the 32-block formats and
// the K-quants (gemm8_supported); the other levels and formats take the dequantized-tile GEMM (quant_tiles.h).
// Shape letters: M rows of x, K in features, R rows of a tile of W (output columns), Mp = M rounded up to 16,
// KB = K / 256 super-blocks, NS sub-blocks per super-block (8; Q6_K 16), P = NS / 2.
//
//   y[m, n0 + r] ≈ Σ_k x[m, k] · W[n0 + r, k]       m < M, r < R
//
// x is quantized once per call as the GEMV quantizes it (quant_codes.h): per 32 for the 32-blocks (Q4_0, Q4_1,
// Q8_0), per 256 for the K-quants (Q4_K, Q5_K, Q6_K); a weight is an unsigned byte code c (Q8_0: c + 128,
// Q6_K: q ∈ 0..63) with a scale and an offset, and every Σ c·q is an exact int32 sum of vpdpbusd (64 byte
// products per instruction, twice the multiply-adds of vdpbf16ps). Per row of x and of W:
//   32-blocks, per chunk of 32:  += dx · d · (Σ c·q − off · Σ q)      off = 8 (Q4_0), 128 (Q8_0), fixed: in integers
//                                += dx · d · Σ c·q + m · dx · Σ q     (Q4_1: its own offset m)
//   K-quants, per super-block:   S = Σ_s sc_s · Σ_s c·q  (integer sub-block scales, vpmulld, exact)
//                                Q4_K / Q5_K  += dk · d · S − dk · dmin · Σ_s m_s · Σ_s q
//                                Q6_K         += dk · d · (S − Σ_s 32 · sc_s · Σ_s q)
//     the offset sums in integers too (vpdpwssd on int16 pairs: the W side's m_s or −32·sc_s, the x side's Σ q).
// The only error is the activations' quantization, as the GEMV's (|x − dx·q| ≤ dx / 2), plus fp32 rounding of
// the per-chunk (per-block) products and of the sum.
//
// Lanes hold rows of x. The prepared x (gemm8_prepare_x) is, per block of 16 rows b:
//   xq  [Mp/16][K/4][16][4] int8   xq[b][j][l][i] = q[16b + l, 4j + i]     (64 bytes per k-quad j)
//   32-blocks:  dx [Mp/16][K/32][16] fp32,  xo [Mp/16][K/32][16]: int32 off · Σ q (Q4_0, Q8_0), fp32 dx · Σ q (Q4_1)
//   K-quants:   dk [Mp/16][KB][16] fp32,    xs [Mp/16][KB][P][16]: int16 pairs (Σ q of sub-blocks 2p, 2p + 1)
// (rows m ≥ M are zeros). So one 64-byte load gives 16 rows' 4 activations, and a vpdpbusd with 4 codes of one
// row of W broadcast to every lane adds 16 rows' partial sums. Worked example: K = 64, row m = 18 of x: b = 1,
// l = 2; its activations 8..11 are bytes xq[1][2][2][0..3] = offset 1·16·64 + 2·64 + 2·4 = 1160.
// A tile of W (gemm8_decode_tile) holds codes [R][K] uint8 (row-major), then the 32-blocks' d [R][K/32] fp32
// (and Q4_1's m [R][K/32]), or the K-quants' sc [R][KB][NS] int32, offset pairs [R][KB][P] (int16 pairs: m_s,
// or −32·sc_s) and (d, dmin) [R][KB][2] fp32.
// Each output is one fp32 chain over the chunks (super-blocks) in order, in the lane of its row: a row's
// result does not depend on M, on the rows beside it or on its lane.
#pragma once

#include <cstdint>

#include "api.h"

// Whether this level has the kernel for format qtype.
MK_ISA_DECLARE(bool gemm8_supported(int32_t qtype))
// Bytes of the prepared x of [M, K] for format qtype (a multiple of 64).
MK_ISA_DECLARE(int64_t gemm8_x_bytes(int32_t qtype, int64_t M, int64_t K))
// Prepares the 16-row blocks [b0, b1) of bf16 x [M, K] (bits, row stride K) into xp (64-byte aligned).
MK_ISA_DECLARE(void gemm8_prepare_x(int32_t qtype, const uint16_t* x, int64_t M, int64_t K, int64_t b0, int64_t b1,
                                    void* xp))
// Bytes of a decoded tile of R rows.
MK_ISA_DECLARE(int64_t gemm8_tile_bytes(int32_t qtype, int64_t R, int64_t K))
// Rows [n0, n1) of the packed W [N, K / QK · bytes] decoded into tile (64-byte aligned; R = n1 - n0 rows).
MK_ISA_DECLARE(void gemm8_decode_tile(int32_t qtype, const void* w, int64_t K, int64_t n0, int64_t n1, void* tile))
// y[m, r] for m < M, r < R (row stride ldy; fp32, or bf16 bits when out_bf16) from the prepared x and a tile;
// meanwhile prefetches [next, next + next_bytes) (the packed rows the caller decodes next; null: none) into
// the L2, spread over the multiplication, so that the next decode does not wait for memory.
MK_ISA_DECLARE(void gemm8_tile(int32_t qtype, const void* xp, int64_t M, int64_t K, const void* tile, int64_t R,
                               void* y, int64_t ldy, bool out_bf16, const void* next, int64_t next_bytes))
