// emu/rope.cpp — registers the CUDA kernels of the rope ops (MK_ROPE_OPS, csrc/checks/rope.h; glue:
// csrc/glue/rope.h) run by the SIMT emulator on CPU tensors, in namespace mistral_kernels_emu.
#include "backend.h"
#include "../glue/rope.h"

#include <torch/library.h>

TORCH_LIBRARY_IMPL(mistral_kernels_emu, CPU, m) { MK_ROPE_OPS(MK_IMPL_GLUE) }
