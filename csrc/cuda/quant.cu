// cuda/quant.cu — registers the CUDA kernels of the quantized-linear ops (MK_QUANT_OPS, csrc/checks/quant.h;
// glue: csrc/glue/quant.h).
#include "backend.h"
#include "../glue/quant.h"

#include <torch/library.h>

TORCH_LIBRARY_IMPL(mistral_kernels, CUDA, m) { MK_QUANT_OPS(MK_IMPL_GLUE) }
