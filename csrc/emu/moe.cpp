// emu/moe.cpp — registers the CUDA kernels of the moe ops (MK_MOE_OPS, csrc/checks/moe.h; glue:
// csrc/glue/moe.h) run by the SIMT emulator on CPU tensors, in namespace mistral_kernels_emu.
#include "backend.h"
#include "../glue/moe.h"

#include <torch/library.h>

TORCH_LIBRARY_IMPL(mistral_kernels_emu, CPU, m) { MK_MOE_OPS(MK_IMPL_GLUE) }
