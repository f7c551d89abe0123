// emu_fp16.h — __half and __nv_bfloat16 for the SIMT emulator, bit-exact with cuda_fp16.h /
// cuda_bf16.h: float → 16-bit conversions round to nearest even, overflow goes to ±inf, NaN becomes the
// canonical 0x7fff (as CUDA's host code does); binary16 → float is csrc/kernels/fp16_bits.h (exact, shared
// with the quantized formats' scales). Arithmetic goes through float and rounds once, which is
// exact for + − × ÷ of 16-bit operands (float has more than 2p+2 significand bits).
// The CUDA headers are deliberately not used: a CPU-only user has no toolkit.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "../kernels/fp16_bits.h"
#include "emu_types.h"

namespace simt::emu {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// float → binary16, round to nearest even. Worked example: 1 + 2^-11 (exactly half an ulp of half
// precision above 1) has rem == 0x1000 and an even kept mantissa, so it rounds down to 0x3c00.
inline uint16_t float_to_half_bits(float f) {
  const uint32_t x = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7fff;                 // NaN
  if (a < 0x38800000u) {                              // below 2^-14: zero or subnormal (unit 2^-24)
    const float scaled = bits_float(a) * 16777216.0f;  // exact: × 2^24
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));  // may round up to 0x0400 (min normal)
  }
  if (a >= 0x47800000u) return sign | 0x7c00;         // ≥ 2^16: inf (also for inf itself)
  uint32_t h = ((a >> 23) - 112u) << 10 | ((a & 0x7fffffu) >> 13);
  const uint32_t rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // carry may reach 0x7c00 = inf: correct
  return sign | static_cast<uint16_t>(h);
}

// float → bfloat16, round to nearest even: add 0x7fff plus the lowest kept bit, truncate.
inline uint16_t float_to_bf16_bits(float f) {
  const uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fff;  // NaN
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
inline float bf16_bits_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

// Shared operator set of the two 16-bit float types (CRTP): arithmetic via float, one rounding.
template <typename T>
struct Float16Ops {
  friend T operator+(T a, T b) { return T(float(a) + float(b)); }
  friend T operator-(T a, T b) { return T(float(a) - float(b)); }
  friend T operator*(T a, T b) { return T(float(a) * float(b)); }
  friend T operator/(T a, T b) { return T(float(a) / float(b)); }
  friend T operator-(T a) { return T::from_bits(static_cast<uint16_t>(a.__x ^ 0x8000u)); }
  friend T& operator+=(T& a, T b) { return a = a + b; }
  friend T& operator-=(T& a, T b) { return a = a - b; }
  friend T& operator*=(T& a, T b) { return a = a * b; }
  friend T& operator/=(T& a, T b) { return a = a / b; }
  friend bool operator==(T a, T b) { return float(a) == float(b); }
  friend bool operator!=(T a, T b) { return float(a) != float(b); }
  friend bool operator<(T a, T b) { return float(a) < float(b); }
  friend bool operator<=(T a, T b) { return float(a) <= float(b); }
  friend bool operator>(T a, T b) { return float(a) > float(b); }
  friend bool operator>=(T a, T b) { return float(a) >= float(b); }
};

}  // namespace simt::emu

// 16-bit storage `__x`, like the CUDA types; implicit conversions to and from float as in CUDA.
struct __half : simt::emu::Float16Ops<__half> {
  uint16_t __x;
  __half() = default;
  __half(float f) : __x(simt::emu::float_to_half_bits(f)) {}
  operator float() const { return ::mk::fp16_bits_to_float(__x); }  // csrc/kernels/fp16_bits.h
  static __half from_bits(uint16_t b) {
    __half h;
    h.__x = b;
    return h;
  }
};
struct __nv_bfloat16 : simt::emu::Float16Ops<__nv_bfloat16> {
  uint16_t __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f) : __x(simt::emu::float_to_bf16_bits(f)) {}
  operator float() const { return simt::emu::bf16_bits_to_float(__x); }
  static __nv_bfloat16 from_bits(uint16_t b) {
    __nv_bfloat16 h;
    h.__x = b;
    return h;
  }
};
static_assert(sizeof(__half) == 2 && sizeof(__nv_bfloat16) == 2, "16-bit storage");

struct alignas(4) __half2 {
  __half x, y;
};
struct alignas(4) __nv_bfloat162 {
  __nv_bfloat16 x, y;
};

inline float __half2float(__half h) { return float(h); }
inline __half __float2half_rn(float f) { return __half(f); }
inline __half __float2half(float f) { return __half(f); }
inline float __bfloat162float(__nv_bfloat16 b) { return float(b); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __half __ushort_as_half(unsigned short u) { return __half::from_bits(u); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return __nv_bfloat16::from_bits(u); }

inline __half2 __floats2half2_rn(float a, float b) { return {__half(a), __half(b)}; }
inline __half2 __float22half2_rn(float2 v) { return {__half(v.x), __half(v.y)}; }
inline float2 __half22float2(__half2 h) { return {float(h.x), float(h.y)}; }
inline __half2 __halves2half2(__half a, __half b) { return {a, b}; }
inline float __low2float(__half2 h) { return float(h.x); }
inline float __high2float(__half2 h) { return float(h.y); }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__nv_bfloat16(a), __nv_bfloat16(b)}; }
inline __nv_bfloat162 __float22bfloat162_rn(float2 v) { return {__nv_bfloat16(v.x), __nv_bfloat16(v.y)}; }
inline float2 __bfloat1622float2(__nv_bfloat162 b) { return {float(b.x), float(b.y)}; }
inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) { return {a, b}; }
inline float __low2float(__nv_bfloat162 b) { return float(b.x); }
inline float __high2float(__nv_bfloat162 b) { return float(b.y); }
