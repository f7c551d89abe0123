// cpu/isa/rope.h — the per-ISA loop of rotary_embedding (csrc/cpu/rope.cpp). Shapes: tokens [t0, t1), Hq / Hkv
// heads, D head_dim, R rot_dim; q / k rows of token t at q + t·qs, k + t·ks; cos_sin [P][R] fp32 (cos | sin).
// Layouts and the rotation formula: csrc/kernels/rope.cuh.
#pragma once

#include <cstdint>

#include "api.h"

MK_ISA_DECLARE(void rope_tokens(Elem elem, bool neox, const int64_t* pos, void* q, void* k, const float* cos_sin,
                                int64_t t0, int64_t t1, int64_t qs, int64_t ks, int64_t Hq, int64_t Hkv, int64_t D,
                                int64_t R))
