// cpu/isa/gemv.h — the per-ISA decode matmul core (gemv.cpp): out[m·ldo + n] = Σ_k x[m·ldx + k] · w[n·K + k]
// for M ≤ kGemvMaxM rows of x and the output columns [n0, n1) of one thread. Used by skinny_linear
// (csrc/cpu/linear.cpp) and by the fused decode step (csrc/cpu/decode_step.h).
// Shapes: M rows of x (decode: batch ≤ 16), K in features, N out features; ldo / ldx row strides.
#pragma once

#include <cstdint>

#include "api.h"

namespace mk::cpu {
inline constexpr int64_t kGemvMaxM = 16;  // rows of x per call (skinny_linear's wrapper uses a GEMM above)
}

MK_ISA_DECLARE(void gemv_rows(Elem elem, void* out, int64_t ldo, const void* x, int64_t ldx, const void* w, int64_t K,
                              int64_t M, int64_t n0, int64_t n1))
