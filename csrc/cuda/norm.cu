// cuda/norm.cu — registers the CUDA kernels of rms_norm, fused_add_rms_norm, silu_and_mul.
#include "backend.h"
#include "../glue/norm.h"

#include <torch/library.h>

TORCH_LIBRARY_IMPL(mistral_kernels, CUDA, m) {
  m.impl("rms_norm", &mk::glue::rms_norm);
  m.impl("fused_add_rms_norm", &mk::glue::fused_add_rms_norm);
  m.impl("silu_and_mul", &mk::glue::silu_and_mul);
}
