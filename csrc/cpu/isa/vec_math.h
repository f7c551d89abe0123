// cpu/isa/vec_math.h — scalar code shaped so that g++ -O3 vectorises it (AVX2 / AVX-512):
// a polynomial expf (no libm call, so the loop around it vectorises) and a sum of squares with
// 16 independent partial sums (a single accumulator is a serial dependency chain under strict FP).
#pragma once

#include <bit>
#include <cstdint>

#include "target.h"

MK_ISA_BEGIN

// exp(x) for fp32, max relative error ~2e-7 on [-87, 88]; saturates to 0 / +inf outside; NaN → NaN.
// x = n·ln2 + r with |r| ≤ ln2/2, exp(r) by a degree-6 Taylor/minimax polynomial, 2^n by exponent bits.
inline float exp_f(float x) {
  const float xc = x < -87.3f ? -87.3f : (x > 88.7f ? 88.7f : x);
  // round(xc·log2 e) by the 1.5·2^23 trick (vectorises, unlike floorf), capped so 2^n stays finite
  float n = (xc * 1.44269504088896341f + 12582912.f) - 12582912.f;
  n = n > 127.f ? 127.f : n;
  const float r = xc - n * 0.693359375f + n * 2.12194440e-4f;  // Cody–Waite split of ln 2
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const float scale = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  float y = p * scale;
  y = x < -87.3f ? 0.f : y;
  y = x > 88.7f ? __builtin_inff() : y;
  return x != x ? x : y;
}

inline float silu_f(float g) { return g / (1.f + exp_f(-g)); }

// Σ x[i]² in fp32 with 16 lanes of partial sums, combined in a fixed order (deterministic).
template <typename T>
inline float sum_squares(const T* x, int64_t n) {
  constexpr int L = 16;
  float acc[L] = {};
  int64_t i = 0;
  for (; i + L <= n; i += L)
    for (int j = 0; j < L; ++j) {
      const float f = to_f(x[i + j]);
      acc[j] += f * f;
    }
  float s = 0.f;
  for (int j = 0; j < L; ++j) s += acc[j];
  for (; i < n; ++i) {
    const float f = to_f(x[i]);
    s += f * f;
  }
  return s;
}

MK_ISA_END
