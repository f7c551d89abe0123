// emu/norm.cpp — registers the CUDA kernels of the norm ops (MK_NORM_OPS, csrc/checks/norm.h; glue:
// csrc/glue/norm.h) run by the SIMT emulator on CPU tensors, in namespace mistral_kernels_emu.
#include "backend.h"
#include "../glue/norm.h"

#include <torch/library.h>

TORCH_LIBRARY_IMPL(mistral_kernels_emu, CPU, m) { MK_NORM_OPS(MK_IMPL_GLUE) }
