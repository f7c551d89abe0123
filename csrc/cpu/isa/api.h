// cpu/isa/api.h — the interface between the torch glue of the CPU ops (csrc/cpu/*.cpp, compiled for
// baseline x86-64) and the framework-free hot loops (csrc/cpu/isa/*.cpp, compiled once per ISA level).
// Framework-free and without inline functions: it is included on both sides (docs/kernels.md, "CPU ISA
// levels").
//
// Every csrc/cpu/isa/*.cpp is compiled four times on x86-64, with MK_ISA_NS = isa_avx512bf16,
// isa_avx512, isa_avx2, isa_generic and that level's -m flags (CMakeLists.txt); its functions live in
// namespace mk::cpu::MK_ISA_NS, so the four copies never merge. A kernel is declared once for every level
// with MK_ISA_DECLARE (in the header next to its .cpp) and called from the glue through MK_ISA_CALL
// (csrc/cpu/isa_dispatch.h), which picks the level chosen at run time (CPUID, or MK_CPU_ISA).
// Other architectures compile the generic level only.
#pragma once

#include <cstdint>

namespace mk::cpu {

// The ISA levels, best first; MK_CPU_ISAS lists their names (MK_CPU_ISA values, `mistral-kernels info`).
//   avx512bf16  AVX-512 F/BW/VL/DQ + AVX512_BF16 + AVX512_VNNI + FMA + F16C  (vdpbf16ps, vpdpbusd)
//   avx512      AVX-512 F/BW/VL/DQ + FMA + F16C
//   avx2        AVX2 + FMA + F16C
//   generic     the compiler's baseline (x86-64: SSE2), portable C++ only: what other CPUs run
enum class Isa : int { avx512bf16 = 0, avx512 = 1, avx2 = 2, generic = 3 };
#define MK_CPU_ISAS(X) X(avx512bf16) X(avx512) X(avx2) X(generic)

// Element type of the type-erased tensors passed to the kernels: float, bfloat16, float16 (the glue maps
// at::ScalarType; the kernels compute in fp32 for all three).
enum class Elem : int { f32 = 0, bf16 = 1, f16 = 2 };

}  // namespace mk::cpu

// MK_ISA_DECLARE(void f(int a, float* b)) declares f in the namespace of every ISA level.
#define MK_ISA_DECLARE(...)                     \
  namespace mk::cpu::isa_avx512bf16 {           \
  __VA_ARGS__;                                  \
  }                                             \
  namespace mk::cpu::isa_avx512 {               \
  __VA_ARGS__;                                  \
  }                                             \
  namespace mk::cpu::isa_avx2 {                 \
  __VA_ARGS__;                                  \
  }                                             \
  namespace mk::cpu::isa_generic {              \
  __VA_ARGS__;                                  \
  }
