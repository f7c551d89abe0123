// emu.h — the SIMT emulator: runs CUDA kernel source, compiled by a host C++20 compiler, on the CPU.
// Included by portable.cuh when __CUDACC__ is not defined; kernels never include it directly.
//
// Each block's threads run as cooperative fibers on one OS thread (emu_block.cpp); __shared__ variables
// become `static thread_local`, so the threads of a block share them while blocks running on other OS
// threads have their own copies. See README.md for what is emulated exactly and what is not.
//
//   emu_types.h    dim3, cudaError_t, cudaStream_t, float2 … uint4
//   emu_fp16.h     __half, __nv_bfloat16 (bit-exact conversions)
//   emu_math.h     math intrinsics, bit intrinsics, atomics, fences
//   emu_runtime.h  threadIdx/blockIdx/blockDim/gridDim, __syncthreads, collective mailbox, run_grid
//   emu_warp.h     shuffles, votes, __syncwarp, mma.sync / ldmatrix emulation
#pragma once

// CUDA's host_defines.h (pulled in by cuda_bf16.h / cuda_fp16.h even in host code) defines __shared__
// and friends as empty. Were it included before us, shared arrays would silently become per-thread:
// undefine everything, then define the emulator's meaning.
#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __constant__
#undef __forceinline__
#undef __noinline__
#undef __launch_bounds__
#undef __align__

#define __global__
#define __device__
#define __host__
#define __shared__ static thread_local
#define __constant__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include "emu_fp16.h"
#include "emu_math.h"
#include "emu_runtime.h"
#include "emu_types.h"
#include "emu_warp.h"

// Dynamic shared memory (the `extern __shared__` array): SIMT_DYN_SMEM(float, smem); → float* smem.
#define SIMT_DYN_SMEM(T, name) T* name = reinterpret_cast<T*>(::simt::emu::dynamic_smem())

namespace simt {
// `emulated`: an inline namespace, so that this launch() and the nvcc one (same template arguments, in
// the same binary when both backends are built) have different symbol names.
inline namespace emulated {

// launch(kernel, grid, block, smem_bytes, stream, args...): the arguments are converted to the kernel's
// parameter types and copied once, like a real launch; every thread then receives its own copy.
// Returns cudaSuccess, a configuration error, or cudaErrorLaunchFailure with a DEADLOCK / fault report
// (read it with cudaGetErrorString). Runs synchronously; `stream` is ignored.
template <typename... KArgs, typename... Args>
inline cudaError_t launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
                          Args&&... args) {
  static_assert(sizeof...(KArgs) == sizeof...(Args), "simt::launch: argument count differs from the kernel's");
  (void)stream;
  using Params = std::tuple<std::decay_t<KArgs>...>;
  struct Closure {
    void (*kernel)(KArgs...);
    Params params;
  };
  const Closure closure{kernel, Params(std::forward<Args>(args)...)};
  const auto thunk = [](const void* p) {
    const Closure& c = *static_cast<const Closure*>(p);
    std::apply(c.kernel, c.params);
  };
  return emu::run_grid({grid, block, smem_bytes, +thunk, &closure, reinterpret_cast<const void*>(kernel)});
}

}  // namespace emulated

constexpr unsigned kFullMask = 0xffffffffu;

}  // namespace simt

// Source location of a wrapper's caller, so emulator reports point into the kernel (portable.cuh).
#define SIMT_LOC_PARAM , ::simt::emu::SrcLoc simt_loc_ = ::simt::emu::SrcLoc::current()
#define SIMT_LOC_ARG , simt_loc_
