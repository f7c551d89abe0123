// portable.cuh — the only header a kernel in csrc/kernels/ includes.
//
// Under nvcc (__CUDACC__) this is plain CUDA: `launch(...)` is a triple-chevron launch and the
// wrappers below compile to the PTX they name. Under g++ it pulls in the SIMT emulator (emu.h),
// which runs the very same kernel source on the CPU as cooperative fibers (see README.md here).
//
// Kernel-side contract (both compilers):
//   __global__ / __device__ / __forceinline__ / __shared__ / __launch_bounds__,
//   threadIdx / blockIdx / blockDim / gridDim, __syncthreads(), __syncwarp(),
//   __half, __nv_bfloat16 and their float conversions, float2/float4/uint2/uint4 (+ make_*),
//   the warp collectives and PTX wrappers in namespace simt below,
//   SIMT_DYN_SMEM(T, name) for `extern __shared__` dynamic shared memory.
// Launchers return cudaError_t and never throw.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <utility>

// Dynamic shared memory declared inside a kernel: SIMT_DYN_SMEM(float, smem);
#define SIMT_DYN_SMEM(T, name) extern __shared__ __align__(16) unsigned char name##_raw_[]; \
  T* name = reinterpret_cast<T*>(name##_raw_)

namespace simt {

// launch(kernel, grid, block, smem_bytes, stream, args...) == kernel<<<grid, block, smem, stream>>>(args...)
template <typename... KArgs, typename... Args>
inline cudaError_t launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem_bytes,
                          cudaStream_t stream, Args&&... args) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return cudaSuccess;  // empty problem
  if (smem_bytes > 48 * 1024) {
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(smem_bytes));
    if (err != cudaSuccess) return err;
  }
  kernel<<<grid, block, smem_bytes, stream>>>(std::forward<Args>(args)...);
  return cudaGetLastError();
}

constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float shfl_xor(float v, int lane_mask) {
  return __shfl_xor_sync(kFullMask, v, lane_mask);
}
__device__ __forceinline__ int shfl_xor(int v, int lane_mask) {
  return __shfl_xor_sync(kFullMask, v, lane_mask);
}
__device__ __forceinline__ float shfl(float v, int src_lane) { return __shfl_sync(kFullMask, v, src_lane); }
__device__ __forceinline__ int shfl(int v, int src_lane) { return __shfl_sync(kFullMask, v, src_lane); }
__device__ __forceinline__ unsigned ballot(bool pred) { return __ballot_sync(kFullMask, pred); }

}  // namespace simt

#else  // host compiler: the SIMT emulator

#include "emu.h"

#endif

namespace simt {

// Warp-level sum / max over all 32 lanes (butterfly; every lane gets the result).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v += shfl_xor(v, m);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, shfl_xor(v, m));
  return v;
}

// Scalar conversions used by templated kernels: to_float(x) / from_float<T>(f).
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_float(float f);
template <> __device__ __forceinline__ float from_float<float>(float f) { return f; }
template <> __device__ __forceinline__ __half from_float<__half>(float f) { return __float2half_rn(f); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float f) {
  return __float2bfloat16_rn(f);
}

// Block-wide sum for blockDim.x a multiple of 32 (≤ 1024). `scratch` is __shared__ float[32].
// Every thread returns the total. Contains __syncthreads(): call it from all threads.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : 0.f;
  return warp_sum(v);
}

}  // namespace simt
