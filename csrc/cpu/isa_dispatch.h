// cpu/isa_dispatch.h — glue side of the per-ISA kernels (csrc/cpu/isa/api.h): the level in use and
// MK_ISA_CALL(kernel), the kernel's copy for that level. Baseline code only (csrc/cpu/*.cpp).
//
// The level is chosen once per process (isa_select.cpp): MK_CPU_ISA=avx512bf16|avx512|avx2|generic if
// set (an error if unknown or not supported by this CPU), else the best level the CPU supports (CPUID).
#pragma once

#include "isa/api.h"

namespace mk::cpu {

// The level in use; throws c10::Error (RuntimeError in Python) when MK_CPU_ISA names an unknown level or
// one this CPU lacks.
Isa active_isa();
const char* isa_name(Isa isa);

template <typename F>
inline F isa_pick(F avx512bf16, F avx512, F avx2, F generic) {
  switch (active_isa()) {
    case Isa::avx512bf16: return avx512bf16;
    case Isa::avx512: return avx512;
    case Isa::avx2: return avx2;
    default: return generic;
  }
}

}  // namespace mk::cpu

// MK_ISA_CALL(gemv_rows)(args...): the kernel declared by MK_ISA_DECLARE, for the active level.
#if MK_CPU_X86_ISAS
#define MK_ISA_CALL(fn)                                                                                     \
  ::mk::cpu::isa_pick(&::mk::cpu::isa_avx512bf16::fn, &::mk::cpu::isa_avx512::fn, &::mk::cpu::isa_avx2::fn, \
                      &::mk::cpu::isa_generic::fn)
#else
#define MK_ISA_CALL(fn) (static_cast<void>(::mk::cpu::active_isa()), &::mk::cpu::isa_generic::fn)
#endif
