// emu/backend.h — what the shared glue (csrc/glue/*.h) needs from the SIMT-emulated backend:
// CPU tensors, the kernels of csrc/kernels/*.cuh run by csrc/simt/emu.h. The emulated and the CUDA
// builds of the same kernels and glue live side by side in _C.so, apart by their inline namespace
// (csrc/abi.h: mk::abi_emu here, mk::abi_cuda there).
#pragma once

#include <ATen/core/Tensor.h>

#include <initializer_list>

#include "../abi.h"
#include "../simt/portable.cuh"

namespace mk::inline MK_ABI::backend {

inline constexpr const char* kName = "emulated CUDA";
inline constexpr std::initializer_list<at::ScalarType> kFloatTypes = {at::kFloat, at::kHalf, at::kBFloat16};

inline void require_device(const char* op, const char* arg, const at::Tensor& t) {
  TORCH_CHECK(t.defined(), op, ": ", arg, " is undefined (None); pass a tensor");
  TORCH_CHECK(t.device().is_cpu(), op, ": ", arg, " must be a CPU tensor for the emulated CUDA kernels, got device ",
              t.device());
}

// Launch planning sees an H100's 132 SMs, so the emulated tests run the grid shapes an H100 gets; the
// shared-memory limit is the emulator's (sm_80's 163 KiB, csrc/simt/emu_launch.cpp).
inline constexpr int kEmulatedSmCount = 132;
inline constexpr int kEmulatedMaxSmem = 163 * 1024;

struct Context {
  explicit Context(const at::Tensor&) {}
  cudaStream_t stream() const { return nullptr; }
  int sm_count() const { return kEmulatedSmCount; }
  int max_smem_per_block() const { return kEmulatedMaxSmem; }
};

}  // namespace mk::inline MK_ABI::backend
