// emu/moe.cpp — the CUDA kernels of topk_softmax, moe_permute, moe_unpermute, fused_moe, run by the SIMT
// emulator on CPU tensors (namespace mistral_kernels_emu).
#include "backend.h"
#include "../glue/moe.h"

#include <torch/library.h>

TORCH_LIBRARY_IMPL(mistral_kernels_emu, CPU, m) {
  m.impl("topk_softmax", &mk::glue::topk_softmax);
  m.impl("moe_permute", &mk::glue::moe_permute);
  m.impl("moe_unpermute", &mk::glue::moe_unpermute);
  m.impl("fused_moe", &mk::glue::fused_moe);
  m.impl("moe_expert_ffn", &mk::glue::moe_expert_ffn);
}
