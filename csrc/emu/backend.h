// emu/backend.h — what the shared glue (csrc/glue/*.h) needs from the SIMT-emulated backend:
// CPU tensors, the kernels of csrc/kernels/*.cuh run by csrc/simt/emu.h.
#pragma once

// csrc/emu and csrc/cuda compile the same kernels, launchers and glue (inline functions and templates of
// namespace mk, with backend-specific bodies) into the same _C.so. Renaming the namespace in the emulated
// translation units keeps the two sets of symbols apart; otherwise the linker would merge same-named
// definitions of both backends into one (an ODR violation) or reject duplicate kernel stubs.
// Include this header first in every csrc/emu/*.cpp.
#define mk mk_emu

#include <ATen/core/Tensor.h>

#include <initializer_list>

#include "../simt/portable.cuh"

namespace mk::backend {

inline constexpr const char* kName = "emulated CUDA";
inline constexpr std::initializer_list<at::ScalarType> kFloatTypes = {at::kFloat, at::kHalf, at::kBFloat16};

inline void require_device(const char* op, const char* arg, const at::Tensor& t) {
  TORCH_CHECK(t.device().is_cpu(), op, ": ", arg, " must be a CPU tensor for the emulated CUDA kernels, got device ",
              t.device());
}

struct Context {
  explicit Context(const at::Tensor&) {}
  cudaStream_t stream() const { return nullptr; }
};

}  // namespace mk::backend
