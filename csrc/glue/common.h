// glue/common.h — torch ↔ kernel plumbing shared by the CUDA (csrc/cuda) and emulated (csrc/emu)
// backends. Include the backend's backend.h first; it provides mk::backend::{Context, require_device,
// kFloatTypes}. glue/<family>.h defines one function per op of MK_<FAMILY>_OPS (checks/<family>.h),
// named after it: mk::glue::rms_norm, ...
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>

#include "../checks/common.h"
#include "../simt/portable.cuh"

namespace mk::inline MK_ABI::glue {

// at:: scalar type → the type the kernels are instantiated with.
template <typename S> struct KernelType;
template <> struct KernelType<float> { using type = float; };
template <> struct KernelType<c10::Half> { using type = __half; };
template <> struct KernelType<c10::BFloat16> { using type = __nv_bfloat16; };
template <typename S> using kernel_t = typename KernelType<S>::type;

template <typename S>
inline kernel_t<S>* kptr(const at::Tensor& t) {
  return reinterpret_cast<kernel_t<S>*>(t.data_ptr());
}

// t itself when its data starts on an `align`-byte boundary, else a copy (the allocator's: aligned). For the
// kernels' vector loads: packed weight rows need 4 bytes (quant_blocks.h, kUnitAlign), the tile GEMMs' x copies
// 16. Loaders keep packed weights aligned (GGUF aligns tensor data to 32 bytes) and activations are fresh
// allocations, so the copy — made at every call — is for views at odd offsets only.
inline at::Tensor aligned_or_copy(const at::Tensor& t, uintptr_t align) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % align == 0 ? t : t.clone();
}

inline void check_launch(cudaError_t err, const char* op) {
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA kernel launch failed: ", cudaGetErrorString(err));
}

}  // namespace mk::inline MK_ABI::glue

// One line of TORCH_LIBRARY_IMPL(<library>, <key>, m): registers mk::glue::<name> for op <name>.
// Expand an op list with it: TORCH_LIBRARY_IMPL(mistral_kernels, CUDA, m) { MK_NORM_OPS(MK_IMPL_GLUE) }
#define MK_IMPL_GLUE(name) m.impl(#name, &mk::glue::name);

// MK_DISPATCH_FLOAT(dtype, "op", [&] { ... scalar_t ... }) over float, half, bfloat16.
#define MK_DISPATCH_FLOAT(TYPE, NAME, ...)                       \
  AT_DISPATCH_SWITCH(TYPE, NAME,                                 \
                     AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__)   \
                     AT_DISPATCH_CASE(at::kHalf, __VA_ARGS__)    \
                     AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__))
