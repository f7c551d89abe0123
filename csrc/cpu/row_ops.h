// cpu/row_ops.h — the per-row element rules of the CPU norm, activation and RoPE kernels, written once for
// the per-op kernels (norm.cpp, rope.cpp) and the fused decode step (decode_layers.cpp). Framework-free
// (raw pointers; T = float or c10::BFloat16). Same rounding as the CUDA kernels (csrc/kernels/norm.cuh,
// rope.cuh): the fused residual sum is rounded to T once, stored, and that stored value is normalised.
// Shapes: H hidden, I intermediate, D head_dim, R rot_dim (half = R/2 rotated pairs per head).
#pragma once

#include <cmath>
#include <cstdint>

#include "common.h"
#include "vec_math.h"
#include "vec_math_avx512.h"

namespace mk::cpu::rowops {

// sum[i] = round(x[i] + res[i]) (when res != nullptr; sum may alias res), then
// out[i] = round(src[i] · inv_rms(src) · w[i]) with src = sum (or x when res == nullptr). out may alias x.
template <typename T>
inline void add_rms_norm(T* out, T* sum, const T* x, const T* res, const T* w, int64_t H, float eps) {
  const T* src = x;
  if (res != nullptr) {
    for (int64_t i = 0; i < H; ++i) sum[i] = from_f<T>(to_f(x[i]) + to_f(res[i]));
    src = sum;  // normalise the stored (rounded) sum; the row is still in L1/L2
  }
  const float ss = sum_squares(src, H);
  const float inv_rms = 1.f / std::sqrt(ss / static_cast<float>(H) + eps);
  for (int64_t i = 0; i < H; ++i) out[i] = from_f<T>(to_f(src[i]) * inv_rms * to_f(w[i]));
}

// o[i] = round(silu(a[i]) · b[i]) for i in [0, n).
template <typename T>
inline void silu_mul(T* o, const T* a, const T* b, int64_t n) {
  int64_t i = 0;
#if MK_CPU_AVX512
  for (; i + 16 <= n; i += 16)
    avx512::store16(o + i, _mm512_mul_ps(avx512::silu16(avx512::load16(a + i)), avx512::load16(b + i)));
#endif
  for (; i < n; ++i) o[i] = from_f<T>(silu_f(to_f(a[i])) * to_f(b[i]));
}

// Rotates the first R dims of `heads` heads (stride D) in place by one position's cos [half], sin [half].
template <typename T, bool NEOX>
inline void rotate_heads(T* base, int64_t heads, int64_t D, int64_t half, const float* cos, const float* sin) {
  for (int64_t h = 0; h < heads; ++h) {
    T* p = base + h * D;
    for (int64_t i = 0; i < half; ++i) {
      const int64_t i1 = NEOX ? i : 2 * i, i2 = NEOX ? i + half : 2 * i + 1;
      const float x1 = to_f(p[i1]), x2 = to_f(p[i2]);
      p[i1] = from_f<T>(x1 * cos[i] - x2 * sin[i]);
      p[i2] = from_f<T>(x2 * cos[i] + x1 * sin[i]);
    }
  }
}

}  // namespace mk::cpu::rowops
