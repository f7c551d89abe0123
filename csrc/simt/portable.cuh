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
//
// API of namespace simt (every function is warp-synchronous with the full mask: all 32 lanes call it):
//   launch(kernel, grid, block, smem_bytes, stream, args...)           -> cudaError_t
//   shfl(v, src_lane) shfl_xor(v, lane_mask) shfl_up(v, delta) shfl_down(v, delta)   any ≤ 8-byte T
//   ballot(pred) -> unsigned, all(pred) / any(pred) -> bool
//   warp_sum(v) warp_max(v) block_sum(v, scratch)                       reductions (fp32)
//   to_float(x) from_float<T>(f) pack_bf16x2(lo, hi) pack_half2(lo, hi)  conversions
//   dp4a(a, b, c)                                                        int8 dot product (4 lanes)
//   mma_m16n8k16_bf16(d, a, b, c) mma_m16n8k16_f16(d, a, b, c)          tensor cores (sm_80)
//   ldmatrix_x1/x2/x4(r, smem_row_ptr) and ..._trans                    shared → mma fragments (sm_75)
//   cp_async_ca<4|8|16>(smem, gmem) cp_async_cg(smem, gmem) cp_async_16(smem, gmem)
//   cp_async_16_zfill(smem, gmem, src_bytes) cp_async_commit() cp_async_wait<N>() cp_async_wait_all()
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

// On the GPU the wrappers take no source location (the emulator uses it for its reports).
#define SIMT_LOC_PARAM
#define SIMT_LOC_ARG

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

}  // namespace simt

#else  // host compiler: the SIMT emulator

#include "emu.h"

#endif

namespace simt {

// ---- warp shuffles and votes (full warp) ------------------------------------------------------------
// shfl: lane i gets v of lane src_lane; shfl_xor: of lane i ^ lane_mask; shfl_up: of lane i - delta
// (lanes < delta keep their own v); shfl_down: of lane i + delta (lanes ≥ 32 - delta keep their own).
template <typename T>
__device__ __forceinline__ T shfl(T v, int src_lane SIMT_LOC_PARAM) {
  return __shfl_sync(kFullMask, v, src_lane, 32 SIMT_LOC_ARG);
}
template <typename T>
__device__ __forceinline__ T shfl_xor(T v, int lane_mask SIMT_LOC_PARAM) {
  return __shfl_xor_sync(kFullMask, v, lane_mask, 32 SIMT_LOC_ARG);
}
template <typename T>
__device__ __forceinline__ T shfl_up(T v, unsigned delta SIMT_LOC_PARAM) {
  return __shfl_up_sync(kFullMask, v, delta, 32 SIMT_LOC_ARG);
}
template <typename T>
__device__ __forceinline__ T shfl_down(T v, unsigned delta SIMT_LOC_PARAM) {
  return __shfl_down_sync(kFullMask, v, delta, 32 SIMT_LOC_ARG);
}
__device__ __forceinline__ unsigned ballot(bool pred SIMT_LOC_PARAM) {
  return __ballot_sync(kFullMask, pred SIMT_LOC_ARG);
}
__device__ __forceinline__ bool all(bool pred SIMT_LOC_PARAM) { return __all_sync(kFullMask, pred SIMT_LOC_ARG) != 0; }
__device__ __forceinline__ bool any(bool pred SIMT_LOC_PARAM) { return __any_sync(kFullMask, pred SIMT_LOC_ARG) != 0; }

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

// ---- integer dot product (sm_61+) -------------------------------------------------------------------
// dp4a(a, b, c) = c + Σ_i a_i · b_i over the four signed bytes of a and b (dp4a.s32.s32; the emulator's is exact).
__device__ __forceinline__ int dp4a(int a, int b, int c) { return __dp4a(a, b, c); }

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

// Two floats → one 32-bit mma operand register: `lo` (the lower-indexed element) in bits 15:0.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
         static_cast<uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16;
}
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  return static_cast<uint32_t>(__half_as_ushort(__float2half_rn(lo))) |
         static_cast<uint32_t>(__half_as_ushort(__float2half_rn(hi))) << 16;
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

// ---- tensor cores: mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 -------------------
// d = a·b + c for one warp: A 16×16 (row-major), B 16×8 (column-major), C/D 16×8 fp32. Each lane holds
// fragments; with g = lane / 4 and t = lane % 4 (two 16-bit elements per register, lower index in the
// low half — build them with pack_bf16x2 / pack_half2 or load them with ldmatrix):
//   a[0] = A[g][2t..2t+1]    a[1] = A[g+8][2t..2t+1]    a[2] = A[g][2t+8..2t+9]    a[3] = A[g+8][2t+8..2t+9]
//   b[0] = B[2t..2t+1][g]    b[1] = B[2t+8..2t+9][g]
//   c[0] = C[g][2t]  c[1] = C[g][2t+1]  c[2] = C[g+8][2t]  c[3] = C[g+8][2t+1]        (d likewise)
// Example: lane 5 (g 1, t 1) holds A[1][2..3], A[9][2..3], A[1][10..11], A[9][10..11] and D[1][2..3],
// D[9][2..3]. `d` may be the same array as `c`.
__device__ __forceinline__ void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                                  const float (&c)[4] SIMT_LOC_PARAM) {
#if defined(__CUDACC__)
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
        "f"(c[3]));
#else
  emu::mma_m16n8k16(/*bf16=*/true, d, a, b, c SIMT_LOC_ARG);
#endif
}
__device__ __forceinline__ void mma_m16n8k16_f16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                                 const float (&c)[4] SIMT_LOC_PARAM) {
#if defined(__CUDACC__)
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
        "f"(c[3]));
#else
  emu::mma_m16n8k16(/*bf16=*/false, d, a, b, c SIMT_LOC_ARG);
#endif
}

// ---- ldmatrix.sync.aligned.m8n8.{x1,x2,x4}[.trans].shared.b16 ----------------------------------------
// Loads 1, 2 or 4 8×8 matrices of 16-bit elements from shared memory. `smem_row` is this lane's row
// address (16-byte aligned, 8 consecutive elements): lanes 8i..8i+7 give rows 0..7 of matrix i (lanes
// beyond 8·num are ignored but must still call). r[i] receives, with g = lane / 4, t = lane % 4:
//   plain:  M_i[g][2t], M_i[g][2t+1]        .trans: M_i[2t][g], M_i[2t+1][g]
// so an .x4 over the four 8×8 quadrants of a 16×16 A tile (lanes 0-7 rows 0-7 cols 0-7, lanes 8-15
// rows 8-15 cols 0-7, lanes 16-23 rows 0-7 cols 8-15, lanes 24-31 rows 8-15 cols 8-15) yields exactly
// mma's a[0..3], and .trans of a row-major K×N tile yields mma's b fragments.
#if defined(__CUDACC__)
#define SIMT_LDMATRIX(NAME, NUM, TRANS_SUFFIX, ...)                                                           \
  __device__ __forceinline__ void NAME(uint32_t (&r)[NUM], const void* smem_row) {                            \
    const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_row));                              \
    asm volatile("ldmatrix.sync.aligned.m8n8.x" #NUM TRANS_SUFFIX ".shared.b16 " __VA_ARGS__ ";\n" : SIMT_LDM_OUT##NUM \
                 : "r"(addr)                                                                                  \
                 : "memory");                                                                                 \
  }
#define SIMT_LDM_OUT1 "=r"(r[0])
#define SIMT_LDM_OUT2 "=r"(r[0]), "=r"(r[1])
#define SIMT_LDM_OUT4 "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
#else
#define SIMT_LDMATRIX(NAME, NUM, TRANS_SUFFIX, ...)                                         \
  __device__ __forceinline__ void NAME(uint32_t (&r)[NUM], const void* smem_row SIMT_LOC_PARAM) { \
    emu::ldmatrix(NUM, sizeof(TRANS_SUFFIX) > 1, r, smem_row SIMT_LOC_ARG);                 \
  }
#endif
SIMT_LDMATRIX(ldmatrix_x1, 1, "", "{%0}, [%1]")
SIMT_LDMATRIX(ldmatrix_x2, 2, "", "{%0,%1}, [%2]")
SIMT_LDMATRIX(ldmatrix_x4, 4, "", "{%0,%1,%2,%3}, [%4]")
SIMT_LDMATRIX(ldmatrix_x1_trans, 1, ".trans", "{%0}, [%1]")
SIMT_LDMATRIX(ldmatrix_x2_trans, 2, ".trans", "{%0,%1}, [%2]")
SIMT_LDMATRIX(ldmatrix_x4_trans, 4, ".trans", "{%0,%1,%2,%3}, [%4]")
#undef SIMT_LDMATRIX

// ---- cp.async: asynchronous global → shared copies (sm_80) -------------------------------------------
// cp_async_ca<B> (B = 4, 8, 16; cached in L1) and cp_async_cg / cp_async_16 (16 bytes, L2 only) issue a
// copy; cp_async_16_zfill copies src_bytes (0..16) and zero-fills the rest of the 16 (out-of-range
// tiles). cp_async_commit() closes the current group; cp_async_wait<N>() waits until at most N of the
// committed groups are pending; then __syncthreads() before other threads read the data. Addresses are
// aligned to the copy size. The emulator performs the copies at the wait, so a missing wait shows up.
template <int BYTES>
__device__ __forceinline__ void cp_async_ca(void* smem, const void* gmem SIMT_LOC_PARAM) {
  static_assert(BYTES == 4 || BYTES == 8 || BYTES == 16, "cp.async.ca copies 4, 8 or 16 bytes");
#if defined(__CUDACC__)
  const auto dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(dst), "l"(gmem), "n"(BYTES) : "memory");
#else
  emu::cp_async_issue(smem, gmem, BYTES, BYTES SIMT_LOC_ARG);
#endif
}
__device__ __forceinline__ void cp_async_cg(void* smem, const void* gmem SIMT_LOC_PARAM) {
#if defined(__CUDACC__)
  const auto dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem) : "memory");
#else
  emu::cp_async_issue(smem, gmem, 16, 16 SIMT_LOC_ARG);
#endif
}
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem SIMT_LOC_PARAM) {
  cp_async_cg(smem, gmem SIMT_LOC_ARG);
}
__device__ __forceinline__ void cp_async_16_zfill(void* smem, const void* gmem, unsigned src_bytes SIMT_LOC_PARAM) {
#if defined(__CUDACC__)
  const auto dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes) : "memory");
#else
  emu::cp_async_issue(smem, gmem, 16, src_bytes SIMT_LOC_ARG);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDACC__)
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#else
  emu::cp_async_commit();
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  static_assert(N >= 0 && N <= 7, "cp.async.wait_group takes 0..7");
#if defined(__CUDACC__)
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#else
  emu::cp_async_wait(N);
#endif
}
__device__ __forceinline__ void cp_async_wait_all() {
  cp_async_commit();
  cp_async_wait<0>();
}

}  // namespace simt
