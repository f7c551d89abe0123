// emu/quant.cpp — registers the CUDA kernels of the quantized-linear ops (MK_QUANT_OPS, csrc/checks/quant.h;
// glue: csrc/glue/quant.h) run by the SIMT emulator on CPU tensors, in namespace mistral_kernels_emu.
#include "backend.h"
#include "../glue/quant.h"

#include <torch/library.h>

TORCH_LIBRARY_IMPL(mistral_kernels_emu, CPU, m) { MK_QUANT_OPS(MK_IMPL_GLUE) }
