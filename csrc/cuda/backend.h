// cuda/backend.h — what the shared glue (csrc/glue/*.h) needs from the real CUDA backend.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include <initializer_list>

#include "../abi.h"

namespace mk::inline MK_ABI::backend {

inline constexpr const char* kName = "cuda";
inline constexpr std::initializer_list<at::ScalarType> kFloatTypes = {at::kFloat, at::kHalf, at::kBFloat16};

inline void require_device(const char* op, const char* arg, const at::Tensor& t) {
  TORCH_CHECK(t.is_cuda(), op, ": ", arg, " must be a CUDA tensor, got device ", t.device());
}

// Makes t's device current for the scope and returns its current stream.
struct Context {
  c10::cuda::CUDAGuard guard;
  explicit Context(const at::Tensor& t) : guard(t.device()) {}
  cudaStream_t stream() const { return c10::cuda::getCurrentCUDAStream(); }
  // SMs of the current device (cached by ATen: no driver call, no sync), for launch planning.
  int sm_count() const { return at::cuda::getCurrentDeviceProperties()->multiProcessorCount; }
};

}  // namespace mk::inline MK_ABI::backend
