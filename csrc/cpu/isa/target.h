// cpu/isa/target.h — the first include of every per-ISA kernel file (csrc/cpu/isa/*.cpp): the namespace of
// the level being compiled, the 16-bit element types and their fp32 conversions.
//
// Rules for code under csrc/cpu/isa (the ODR hazard of multi-ISA builds: an inline function or template
// compiled with -mavx512f in one object and emitted as a weak symbol may be the copy the linker keeps for
// baseline callers, which then die of SIGILL on an older CPU):
//   - no torch / c10 headers, no std containers or other out-of-line std templates: raw pointers, small
//     structs, <cmath>, <cstdint>, <algorithm>'s min / max / clamp / fill (always inlined);
//   - everything between MK_ISA_BEGIN and MK_ISA_END (namespace mk::cpu::MK_ISA_NS), and the shared
//     csrc/kernels headers get MK_ABI = abi_cpu_<level> (CMakeLists.txt), so no symbol of one level can
//     stand in for another's. The build checks this: cmake/check_isa_symbols.py fails when an object of a
//     level defines a weak symbol outside that level's namespaces.
#pragma once

#if !defined(MK_ISA_NS)
#error "csrc/cpu/isa sources are compiled once per ISA level with -DMK_ISA_NS=isa_<level> (CMakeLists.txt)"
#endif

#include <bit>
#include <cstdint>

#include "api.h"

#define MK_ISA_BEGIN namespace mk::cpu::MK_ISA_NS {
#define MK_ISA_END }

MK_ISA_BEGIN

// bfloat16 / float16 as their bits (the layout of c10::BFloat16 / c10::Half, which the glue passes).
struct bf16 {
  uint16_t x;
};
struct f16 {
  uint16_t x;
};

// Branch-free conversions the compiler vectorises. bf16: a 16-bit shift, round to nearest even, NaN → 0x7fc0.
inline float to_f(float x) { return x; }
inline float to_f(bf16 h) { return std::bit_cast<float>(static_cast<uint32_t>(h.x) << 16); }

// float16 → fp32, exact: the exponent is rebiased by one multiply by 2^112 (normals and subnormals alike),
// Inf / NaN (exponent 31) get the fp32 exponent 255 with the mantissa kept.
inline float to_f(f16 h) {
  const uint32_t em = h.x & 0x7fffu;
  const uint32_t sign = static_cast<uint32_t>(h.x & 0x8000u) << 16;
  uint32_t bits = std::bit_cast<uint32_t>(std::bit_cast<float>(em << 13) * 0x1p112f);
  bits = em >= 0x7c00u ? (bits | 0x7f800000u) : bits;
  return std::bit_cast<float>(bits | sign);
}

template <typename T> inline T from_f(float f);
template <> inline float from_f<float>(float f) { return f; }
template <> inline bf16 from_f<bf16>(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;  // round to nearest even
  const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
  return bf16{static_cast<uint16_t>(nan ? 0x7fc0u : rounded)};
}
// fp32 → float16, round to nearest even: |f| ≥ 65520 → Inf, NaN → quiet NaN (sign kept), |f| < 2^-14 →
// subnormal by adding 0.5 (the float addition rounds the dropped bits), otherwise rebias the exponent and
// round the 13 dropped mantissa bits. All three are computed and one is selected (no branches).
template <> inline f16 from_f<f16>(float f) {
  const uint32_t all = std::bit_cast<uint32_t>(f);
  const uint32_t sign = all & 0x80000000u, a = all ^ sign;
  const uint32_t big = a > 0x7f800000u ? 0x7e00u : 0x7c00u;
  const uint32_t sub = std::bit_cast<uint32_t>(std::bit_cast<float>(a) + 0.5f) - 0x3f000000u;
  const uint32_t norm = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;  // 0xc8000000 = (15 - 127) << 23
  const uint32_t h = a >= 0x47800000u ? big : (a < 0x38800000u ? sub : norm);
  return f16{static_cast<uint16_t>(h | (sign >> 16))};
}

MK_ISA_END
