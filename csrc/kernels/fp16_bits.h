// fp16_bits.h — IEEE binary16 bits → float, written once for every build: the quantized formats' fp16 scales
// (quant_blocks.h: CUDA kernels, CPU kernels, checks) and the SIMT emulator's __half (csrc/simt/emu_fp16.h).
// Framework-free and include-free (but abi.h): plain C++ under g++, __host__ __device__ under nvcc.
#pragma once

#include <cstdint>

#include "../abi.h"

#if defined(__CUDACC__)
#define MK_FP16_HD __host__ __device__ __forceinline__
#else
#define MK_FP16_HD inline
#endif

namespace mk::inline MK_ABI {

// Exact for every input: normals rebias the exponent (15 → 127), subnormals are man · 2^-24 (exact in
// float), ±0 keep their sign, inf / NaN keep their payload. Worked example: 0x3C00 → 1.0f; 0x0001 → 2^-24.
MK_FP16_HD float fp16_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
  if (exp == 0) {  // ±0 and subnormals
    const float v = static_cast<float>(man) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  const uint32_t bits = sign | (exp == 0x1Fu ? 0x7F800000u : (exp + 112u) << 23) | (man << 13);
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  __builtin_memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

}  // namespace mk::inline MK_ABI
