// cuda/rope.cu — registers the CUDA kernels of the rope ops (MK_ROPE_OPS, csrc/checks/rope.h; glue:
// csrc/glue/rope.h).
#include "backend.h"
#include "../glue/rope.h"

#include <torch/library.h>

TORCH_LIBRARY_IMPL(mistral_kernels, CUDA, m) { MK_ROPE_OPS(MK_IMPL_GLUE) }
