// llama_quantize.c — llama.cpp's own quantizer (llama_model_quantize, what llama-quantize runs) through libllama,
// for when only libllama is built (llama-quantize needs llama-common). FTYPE: llama.h's llama_ftype numbers,
// e.g. 15 = Q4_K_M, 17 = Q5_K_M, 7 = Q8_0, 2 = Q4_0.
//
//   cc -O1 benchmarks/native/llama_quantize.c -I$LLAMA/include -I$LLAMA/ggml/include -L$BUILD/bin -lllama \
//      -Wl,-rpath,$BUILD/bin -o llama_quantize
//   ./llama_quantize IN.gguf OUT.gguf FTYPE THREADS
#include <stdio.h>
#include <stdlib.h>

#include "llama.h"

int main(int argc, char** argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: %s IN OUT FTYPE THREADS\n", argv[0]);
    return 2;
  }
  llama_backend_init();
  struct llama_model_quantize_params p = llama_model_quantize_default_params();
  p.ftype = (enum llama_ftype)atoi(argv[3]);
  p.nthread = atoi(argv[4]);
  const uint32_t rc = llama_model_quantize(argv[1], argv[2], &p);
  llama_backend_free();
  return (int)rc;
}
