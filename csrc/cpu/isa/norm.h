// cpu/isa/norm.h — the per-ISA row loops of rms_norm, fused_add_rms_norm, silu_and_mul (csrc/cpu/norm.cpp)
// and the SwiGLU of the MoE experts (csrc/cpu/moe.cpp, moe_quant.cpp). Shapes: rows [r0, r1), H hidden, I intermediate.
#pragma once

#include <cstdint>

#include "api.h"

// out[r] = x[r] · w / rms(x[r]); with residual ≠ null (fused add): residual[r] = x[r] + residual[r] rounded
// to the dtype, and out[r] is the normalised stored sum (out may alias x). Rows of H contiguous elements.
MK_ISA_DECLARE(void rms_norm_rows(Elem elem, void* out, void* residual, const void* x, const void* w, int64_t r0,
                                  int64_t r1, int64_t H, float eps))
// out[r·ldo + i] = silu(gate[r·ld + i]) · up[r·ld + i] for i < I, rows [r0, r1), fp32 math.
MK_ISA_DECLARE(void silu_mul_rows(Elem elem, void* out, int64_t ldo, const void* gate, const void* up, int64_t ld,
                                  int64_t r0, int64_t r1, int64_t I))
// One row of the fused decode step (csrc/cpu/decode_step.h): with res ≠ null, sum[i] = round(x[i] + res[i])
// (sum may alias res) and src = sum, else src = x; out[i] = round(src[i] · w[i] / rms(src)). out may alias x.
MK_ISA_DECLARE(void add_rms_norm_row(Elem elem, void* out, void* sum, const void* x, const void* res, const void* w,
                                     int64_t H, float eps))
