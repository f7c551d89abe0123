// emu/attention.cpp — registers the CUDA kernels of the attention ops (MK_ATTENTION_OPS, csrc/checks/attention.h; glue:
// csrc/glue/attention.h) run by the SIMT emulator on CPU tensors, in namespace mistral_kernels_emu.
#include "backend.h"
#include "../glue/attention.h"

#include <torch/library.h>

TORCH_LIBRARY_IMPL(mistral_kernels_emu, CPU, m) { MK_ATTENTION_OPS(MK_IMPL_GLUE) }
