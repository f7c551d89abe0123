// cuda/attention.cu — registers the CUDA kernels of the attention ops (MK_ATTENTION_OPS, csrc/checks/attention.h; glue:
// csrc/glue/attention.h).
#include "backend.h"
#include "../glue/attention.h"

#include <torch/library.h>

TORCH_LIBRARY_IMPL(mistral_kernels, CUDA, m) { MK_ATTENTION_OPS(MK_IMPL_GLUE) }
