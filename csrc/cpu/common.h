// cpu/common.h — helpers for the native CPU kernels: dtype dispatch (fp32, bf16), float conversion.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>

#include <cstdint>
#include <cstring>
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
  const uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
template <typename T> inline T from_f(float f);
template <> inline float from_f<float>(float f) { return f; }
template <> inline c10::BFloat16 from_f<c10::BFloat16>(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return c10::BFloat16(0x7fc0, c10::BFloat16::from_bits());  // NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return c10::BFloat16(static_cast<uint16_t>(bits >> 16), c10::BFloat16::from_bits());
}

}  // namespace mk::cpu

// MK_CPU_DISPATCH(dtype, "op", [&] { ... scalar_t ... }) over float and bfloat16.
#define MK_CPU_DISPATCH(TYPE, NAME, ...) \
  AT_DISPATCH_SWITCH(TYPE, NAME, AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__) AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__))
