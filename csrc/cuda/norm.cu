// cuda/norm.cu — registers the CUDA kernels of the norm ops (MK_NORM_OPS, csrc/checks/norm.h; glue:
// csrc/glue/norm.h).
#include "backend.h"
#include "../glue/norm.h"

#include <torch/library.h>

TORCH_LIBRARY_IMPL(mistral_kernels, CUDA, m) { MK_NORM_OPS(MK_IMPL_GLUE) }
