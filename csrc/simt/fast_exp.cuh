// fast_exp.cuh — flush-to-zero fast exponentials for kernels (a portable.cuh-style wrapper: inline PTX
// under nvcc, the C library under the emulator).
//
//   ex2_ftz(x)   2^x as ex2.approx.ftz.f32: ONE MUFU.EX2. (exp2f / __expf compile to the non-ftz
//                ex2.approx.f32, which adds a range test and two multiplies around the MUFU to produce
//                subnormal results.) A result below 2^-126 is +0; -inf → +0, +inf → +inf, NaN → NaN.
//   exp_ftz(x)   e^x as ex2_ftz(x · log2 e): two instructions instead of __expf's five.
// Where this matters: the attention kernels' softmax, whose p = exp(s - max) ≤ 1 only loses terms below
// 2^-126 of the row's largest, far under every tolerance; a NaN still propagates (0·NaN = NaN too).
// The emulator computes std::exp2 and flushes the same way (it does not reproduce the ≤ 2 ulp of the
// hardware approximation: compare with tolerances, as for every approximate intrinsic).
#pragma once

#include "portable.cuh"

#if !defined(__CUDACC__)
#include <cmath>
#endif

namespace simt {

__device__ __forceinline__ float ex2_ftz(float x) {
#if defined(__CUDACC__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  const float y = std::exp2(x);
  return y < 1.17549435e-38f ? 0.f : y;  // FLT_MIN; NaN fails the comparison and passes through
#endif
}

__device__ __forceinline__ float exp_ftz(float x) { return ex2_ftz(x * 1.4426950408889634f); }

}  // namespace simt
