// cuda/moe.cu — registers the CUDA kernels of the moe ops (MK_MOE_OPS, csrc/checks/moe.h; glue:
// csrc/glue/moe.h).
#include "backend.h"
#include "../glue/moe.h"

#include <torch/library.h>

TORCH_LIBRARY_IMPL(mistral_kernels, CUDA, m) { MK_MOE_OPS(MK_IMPL_GLUE) }
