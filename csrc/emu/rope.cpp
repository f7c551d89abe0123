// emu/rope.cpp — the CUDA kernel of rotary_embedding run by the SIMT emulator on CPU tensors.
#include "backend.h"
#include "../glue/rope.h"

#include <torch/library.h>

TORCH_LIBRARY_IMPL(mistral_kernels_emu, CPU, m) { m.impl("rotary_embedding", &mk::glue::rotary_embedding); }
