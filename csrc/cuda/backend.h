// cuda/backend.h — what the shared glue (csrc/glue/*.h) needs from the real CUDA backend.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include <array>
#include <atomic>
#include <initializer_list>

#include "../abi.h"

namespace mk::inline MK_ABI::backend {

inline constexpr const char* kName = "cuda";
inline constexpr std::initializer_list<at::ScalarType> kFloatTypes = {at::kFloat, at::kHalf, at::kBFloat16};

inline void require_device(const char* op, const char* arg, const at::Tensor& t) {
  TORCH_CHECK(t.defined(), op, ": ", arg, " is undefined (None); pass a tensor");
  TORCH_CHECK(t.is_cuda(), op, ": ", arg, " must be a CUDA tensor, got device ", t.device());
}

// Makes t's device current for the scope and returns its current stream.
struct Context {
  c10::cuda::CUDAGuard guard;
  explicit Context(const at::Tensor& t) : guard(t.device()) {}
  cudaStream_t stream() const { return c10::cuda::getCurrentCUDAStream(); }
  // SMs of the current device, for launch planning.
  int sm_count() const { return attribute(cudaDevAttrMultiProcessorCount, 0); }
  // Most dynamic shared memory one block may opt in to (sm_80: 163 KiB; sm_86 / sm_89: 99 KiB).
  int max_smem_per_block() const { return attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, 1); }

 private:
  // A device attribute of the current device: a driver query (no stream work, no sync; allowed while a
  // graph captures), cached per (device, slot).
  static int attribute(cudaDeviceAttr attr, int slot) {
    static std::array<std::atomic<int>, 2 * 64> cache{};
    const int dev = c10::cuda::current_device();
    const int i = 2 * dev + slot;
    if (i < static_cast<int>(cache.size()))
      if (const int n = cache[i].load(std::memory_order_relaxed); n > 0) return n;
    int n = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&n, attr, dev));
    if (i < static_cast<int>(cache.size())) cache[i].store(n, std::memory_order_relaxed);
    return n;
  }
};

}  // namespace mk::inline MK_ABI::backend
