// cpu/common.h — helpers for the native CPU kernels: dtype dispatch (fp32, bf16), float conversion.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>

#include <bit>
#include <cstdint>
#include <initializer_list>

#include "../checks/common.h"

namespace mk::cpu {

inline constexpr std::initializer_list<at::ScalarType> kFloatTypes = {at::kFloat, at::kBFloat16};

inline void require_cpu(const char* op, const char* arg, const at::Tensor& t) {
  TORCH_CHECK(t.device().is_cpu(), op, ": ", arg, " must be a CPU tensor for the CPU kernel, got device ",
              t.device());
}

// Branch-free conversions the compiler vectorises (bf16 ↔ fp32 is a 16-bit shift; round to nearest even).
inline float to_f(float x) { return x; }
inline float to_f(c10::BFloat16 x) {
  return std::bit_cast<float>(static_cast<uint32_t>(x.x) << 16);
}
template <typename T> inline T from_f(float f);
template <> inline float from_f<float>(float f) { return f; }
template <> inline c10::BFloat16 from_f<c10::BFloat16>(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;  // round to nearest even
  const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
  return c10::BFloat16(static_cast<uint16_t>(nan ? 0x7fc0u : rounded), c10::BFloat16::from_bits());
}

}  // namespace mk::cpu

// MK_CPU_DISPATCH(dtype, "op", [&] { ... scalar_t ... }) over float and bfloat16.
#define MK_CPU_DISPATCH(TYPE, NAME, ...) \
  AT_DISPATCH_SWITCH(TYPE, NAME, AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__) AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__))
