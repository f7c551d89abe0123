// llama_logits.c — llama.cpp's next-token logits along a token sequence, decoded one token at a time (its
// decode path, M = 1), through its C API (libllama): the peer run of benchmarks/quant_accuracy.py.
//
//   cc -O2 benchmarks/native/llama_logits.c -I$LLAMA/include -I$LLAMA/ggml/include -L$BUILD/bin -lllama \
//      -Wl,-rpath,$BUILD/bin -o llama_logits
//   ./llama_logits MODEL.gguf THREADS IDS.i32 OUT.f32
//     IDS.i32  the token ids, int32 little-endian, T of them
//     OUT.f32  written: float32 [T, V], row t = the logits after ids[0 .. t]
#include <stdio.h>
#include <stdlib.h>

#include "llama.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s MODEL THREADS IDS.i32 OUT.f32\n", argv[0]);
    return 2;
  }
  FILE* f = fopen(argv[3], "rb");
  if (!f) return 1;
  fseek(f, 0, SEEK_END);
  const long T = ftell(f) / 4;
  fseek(f, 0, SEEK_SET);
  int* ids = malloc(T * sizeof(int));
  if (fread(ids, 4, T, f) != (size_t)T) return 1;
  fclose(f);
  llama_backend_init();
  struct llama_model* model = llama_model_load_from_file(argv[1], llama_model_default_params());
  if (!model) return 1;
  struct llama_context_params cp = llama_context_default_params();
  cp.n_ctx = (uint32_t)(T + 16);
  cp.n_threads = cp.n_threads_batch = atoi(argv[2]);
  struct llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) return 1;
  const int V = llama_vocab_n_tokens(llama_model_get_vocab(model));
  struct llama_batch b = llama_batch_init(1, 0, 1);
  FILE* out = fopen(argv[4], "wb");
  if (!out) return 1;
  for (long t = 0; t < T; ++t) {
    b.n_tokens = 1;
    b.token[0] = ids[t], b.pos[0] = (int)t, b.n_seq_id[0] = 1, b.seq_id[0][0] = 0, b.logits[0] = 1;
    if (llama_decode(ctx, b)) return 1;
    fwrite(llama_get_logits_ith(ctx, 0), sizeof(float), V, out);
  }
  fclose(out);
  llama_batch_free(b);
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  free(ids);
  return 0;
}
