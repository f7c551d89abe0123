// common.cuh — small helpers shared by the kernels: aligned vectors for 16-byte loads, ceil_div.
#pragma once

#include "../simt/portable.cuh"

namespace mk {

// N elements of T loaded/stored as one aligned access (16 bytes: float×4, half/bf16×8).
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

template <typename T>
constexpr int kVec16 = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte access

__host__ __device__ __forceinline__ int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// True when `p` can be accessed with 16-byte vectors.
__host__ __device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

}  // namespace mk
