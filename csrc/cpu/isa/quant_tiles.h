// cpu/isa/quant_tiles.h — the prefill GEMM of qlinear for fp32 activations on one dequantized tile of W
// (quant_tiles.cpp; the glue, the tiling and the dequantization: csrc/cpu/quant.cpp). Shapes: M rows of x,
// K in features, R rows of the tile (output columns), Mp = M rounded up to 16.
//
//   y[m, j] = Σ_k x[m, k] · w[j, k]   for m < M, j < R;  w row-major fp32 [R, K] (a dequantized tile)
//
// x is first packed once per call (tile_pack_x) into blocks of 16 rows, k-major, so that one vector load
// gives x[16b .. 16b+15, k]:   xt[(b·K + k)·16 + l] = x[16b + l, k]   (rows m ≥ M are zeros), [Mp / 16, K, 16].
// The kernel broadcasts each weight of the tile against those vectors: W is read in place, never packed a
// second time (ATen's GEMM would copy the dequantized tile into its own panel layout first).
#pragma once

#include <cstdint>

#include "api.h"

// Whether this level has the kernel (AVX-512F). Without it the glue multiplies the tile with ATen's GEMM.
MK_ISA_DECLARE(bool tile_gemm_supported())
// Bytes of the packed x of [M, K] (Mp · K · 4, a multiple of 64).
MK_ISA_DECLARE(int64_t tile_x_bytes(int64_t M, int64_t K))
// Packs the 16-row blocks [b0, b1) of fp32 x [M, K] (row stride K) into xt (64-byte aligned; layout above).
MK_ISA_DECLARE(void tile_pack_x(const float* x, int64_t M, int64_t K, int64_t b0, int64_t b1, float* xt))
// y[m, j] (fp32, row stride ldy) for the tile w [R, K]: each output one fp32 FMA chain over k in order.
MK_ISA_DECLARE(void tile_gemm(const float* xt, int64_t M, int64_t K, const float* w, int64_t R, float* y,
                              int64_t ldy))
