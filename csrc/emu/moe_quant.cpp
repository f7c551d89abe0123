// emu/moe_quant.cpp — registers the CUDA kernels of moe_qgemm (MK_MOE_QUANT_OPS, csrc/checks/moe_quant.h; glue:
// csrc/glue/moe_quant.h) run by the SIMT emulator on CPU tensors, in namespace mistral_kernels_emu.
#include "backend.h"
#include "../glue/moe_quant.h"

#include <torch/library.h>

TORCH_LIBRARY_IMPL(mistral_kernels_emu, CPU, m) { MK_MOE_QUANT_OPS(MK_IMPL_GLUE) }
