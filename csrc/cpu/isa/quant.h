// cpu/isa/quant.h — the per-ISA entries of qlinear on quantized weights (kernels: quant_kernels.h; glue,
// checks and the prefill GEMM: csrc/cpu/quant.cpp). Shapes: M ≤ 16 rows of x (decode), K in features,
// N out features, C = K / 32 chunks of 32 activations.
#pragma once

#include <cstdint>

#include "api.h"

namespace mk::cpu {

// The decode path of a (format, x dtype) pair at a level: the activations quantized to int8 per 32 and
// integer dot products (bf16 x, 32-blocks), quantized per 256 with integer sums per super-block (int8k: bf16
// x, K-quants), the codes' exact bf16 dot products (AVX512-BF16, bf16 x), or fp32 decoding (x converted to
// fp32 by the glue; every format and dtype).
enum class QPath : int { int8 = 0, bf16 = 1, fp32 = 2, int8k = 3 };

// Plain arguments of one decode GEMV over the output columns [n0, n1).
struct QGemv {
  QPath path;
  int32_t qtype;        // GGUF block format code or INT8_ROWWISE (csrc/kernels/quant_blocks.h)
  const void* w;        // packed rows [N, R] (block formats) or int8 [N, K]
  const float* scales;  // INT8_ROWWISE: fp32 [N]; else null
  int64_t K, M;
  const float* xf;      // fp32 path: x [M, K] fp32
  const uint16_t* xb;   // bf16 path: x [M, K] bf16 bits
  const int8_t* xq;     // int8 path: x quantized [M, K]
  const float* s0;      // int8 path: dx [M, C]; int8k: dk [M, K / 256]; bf16 path: Σ x per chunk [M, C]
  const float* s1;      // int8 path: dx · Σ q [M, C]
  bool out_bf16;        // y as bf16 bits (else fp32)
  void* y;              // [M, ldy]
  int64_t ldy;
  const int16_t* bs = nullptr;  // int8k path: Σ q per 16 [M, K / 16]
};

}  // namespace mk::cpu

// The path this level runs for bf16 x and format qtype (QPath as int; fp32 for fp32 / fp16 x).
MK_ISA_DECLARE(int quant_bf16_path(int32_t qtype))
// Prepares bf16 x [M, K] for path: int8 → xq, s0 = dx, s1 = dx · Σ q; bf16 → s0 = Σ x per chunk.
MK_ISA_DECLARE(void quant_prepare_x(int path, const uint16_t* xb, int64_t M, int64_t K, int8_t* xq, float* s0,
                                    float* s1))
#define MK_QUANT_PREPARE_X8K 1  // (lets benchmarks/native/kernel_bench.cpp build against older trees too)
// Prepares bf16 x [M, K] (K a multiple of 256) for the int8k path: xq, dk [M, K / 256], bs [M, K / 16].
MK_ISA_DECLARE(void quant_prepare_x8k(const uint16_t* xb, int64_t M, int64_t K, int8_t* xq, float* dk, int16_t* bs))
MK_ISA_DECLARE(void quant_gemv(const QGemv& a, int64_t n0, int64_t n1))
// Rows [n0, n1) of W dequantized into dst (row n at dst + (n - n0)·K), fp32 or bf16 bits.
MK_ISA_DECLARE(void quant_dequant_rows(int32_t qtype, const void* w, const float* scales, int64_t K, int64_t n0,
                                       int64_t n1, bool bf16_out, void* dst))
