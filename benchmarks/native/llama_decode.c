// llama_decode.c — llama.cpp's prompt / decode / batched-decode speed through its C API (libllama), the
// measurements of llama-bench (pp, tg) and llama-batched-bench (B sequences decoding together), for when
// only libllama is built (the tools need llama-common: ~40 more files). Random token ids, no sampling.
//
//   cc -O2 benchmarks/native/llama_decode.c -I$LLAMA/include -I$LLAMA/ggml/include -L$BUILD/bin -lllama \
//      -Wl,-rpath,$BUILD/bin -o llama_decode
//   ./llama_decode MODEL.gguf THREADS PROMPT GEN BATCHES [ROUNDS]
//     PROMPT   pp: tokens of one prompt batch (tok/s = PROMPT / its time)
//     GEN      tg: tokens decoded one at a time after PROMPT tokens of context (as llama-bench -p 0 -n GEN -d P)
//     BATCHES  comma list of B: B sequences, each PROMPT tokens of context, then GEN steps of B tokens
//              (aggregate tok/s = B · GEN / time, as llama-batched-bench's S_TG)
// Prints one line per measurement: "pp P tok/s", "tg B=1 tok/s", "tg B=b tok/s".
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llama.h"

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

static void fill(struct llama_batch* b, int n, int seqs, int pos0, int vocab, unsigned* rng) {
  b->n_tokens = 0;
  for (int s = 0; s < seqs; ++s)
    for (int i = 0; i < n; ++i) {
      const int k = b->n_tokens++;
      *rng = *rng * 1664525u + 1013904223u;
      b->token[k] = (int)(*rng >> 8) % vocab;
      b->pos[k] = pos0 + i;
      b->n_seq_id[k] = 1;
      b->seq_id[k][0] = s;
      b->logits[k] = i == n - 1;  // logits of each sequence's last token, as generation needs
    }
}

int main(int argc, char** argv) {
  if (argc < 6) {
    fprintf(stderr, "usage: %s MODEL THREADS PROMPT GEN BATCHES [ROUNDS]\n", argv[0]);
    return 2;
  }
  const int threads = atoi(argv[2]), P = atoi(argv[3]), G = atoi(argv[4]);
  const int rounds = argc > 6 ? atoi(argv[6]) : 1;
  int batches[16], nb = 0, bmax = 1;
  for (char* t = strtok(argv[5], ","); t && nb < 16; t = strtok(NULL, ",")) {
    batches[nb] = atoi(t);
    if (batches[nb] > bmax) bmax = batches[nb];
    ++nb;
  }
  llama_backend_init();
  struct llama_model_params mp = llama_model_default_params();
  struct llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) return 1;
  struct llama_context_params cp = llama_context_default_params();
  cp.n_ctx = (uint32_t)(bmax * (P + G) + 64);
  cp.n_batch = cp.n_ubatch = (uint32_t)(bmax * P > 512 ? bmax * P : 512);
  cp.n_seq_max = (uint32_t)bmax;
  cp.n_threads = cp.n_threads_batch = threads;
  struct llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) return 1;
  const int vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  struct llama_batch b = llama_batch_init(bmax * (P > 1 ? P : 1), 0, bmax);
  unsigned rng = 1;
  for (int r = 0; r < rounds; ++r) {
    // pp
    llama_memory_clear(llama_get_memory(ctx), true);
    fill(&b, P, 1, 0, vocab, &rng);
    double t0 = now();
    if (llama_decode(ctx, b)) return 1;
    llama_synchronize(ctx);
    printf("pp %d %.3f tok/s\n", P, P / (now() - t0));
    // tg at batch B (B = 1: llama-bench's tg with -d P)
    for (int i = -1; i < nb; ++i) {
      const int B = i < 0 ? 1 : batches[i];
      if (i >= 0 && B == 1) continue;
      llama_memory_clear(llama_get_memory(ctx), true);
      fill(&b, P, B, 0, vocab, &rng);
      if (llama_decode(ctx, b)) return 1;
      llama_synchronize(ctx);
      t0 = now();
      for (int g = 0; g < G; ++g) {
        fill(&b, 1, B, P + g, vocab, &rng);
        if (llama_decode(ctx, b)) return 1;
        llama_synchronize(ctx);
      }
      printf("tg B=%d %.3f tok/s\n", B, (double)B * G / (now() - t0));
      fflush(stdout);
    }
  }
  llama_batch_free(b);
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
