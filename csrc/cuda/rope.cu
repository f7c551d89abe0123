// cuda/rope.cu — registers the CUDA kernel of rotary_embedding.
#include "backend.h"
#include "../glue/rope.h"

#include <torch/library.h>

TORCH_LIBRARY_IMPL(mistral_kernels, CUDA, m) { m.impl("rotary_embedding", &mk::glue::rotary_embedding); }
