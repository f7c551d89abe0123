// emu/norm.cpp — the CUDA kernels of rms_norm, fused_add_rms_norm, silu_and_mul, run by the SIMT
// emulator on CPU tensors (namespace mistral_kernels_emu).
#include "backend.h"
#include "../glue/norm.h"

#include <torch/library.h>

TORCH_LIBRARY_IMPL(mistral_kernels_emu, CPU, m) {
  m.impl("rms_norm", &mk::glue::rms_norm);
  m.impl("fused_add_rms_norm", &mk::glue::fused_add_rms_norm);
  m.impl("silu_and_mul", &mk::glue::silu_and_mul);
}
