// cuda/attention.cu — registers the CUDA kernels of reshape_and_cache, paged_decode_attention and
// paged_prefill_attention (glue: csrc/glue/attention.h).
#include "backend.h"
#include "../glue/attention.h"

#include <torch/library.h>

TORCH_LIBRARY_IMPL(mistral_kernels, CUDA, m) {
  m.impl("reshape_and_cache", &mk::glue::reshape_and_cache);
  m.impl("paged_decode_attention", &mk::glue::paged_decode_attention);
  m.impl("paged_prefill_attention", &mk::glue::paged_prefill_attention);
}
