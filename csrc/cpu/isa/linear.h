// cpu/isa/linear.h — the per-ISA GEMV of skinny_linear (csrc/cpu/linear.cpp): out[M, N] = x[M, K] · W[N, K]ᵀ
// for the output columns [n0, n1), M ≤ kLinearMaxM, all rows contiguous.
#pragma once

#include <cstdint>

#include "api.h"

namespace mk::cpu {
inline constexpr int64_t kLinearMaxM = 16;  // rows of x per call (the Python wrapper uses a GEMM above)
}

MK_ISA_DECLARE(void linear_cols(Elem elem, void* out, const void* x, const void* w, int64_t M, int64_t N, int64_t K,
                                int64_t n0, int64_t n1))
