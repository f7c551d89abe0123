// registration.cpp — every op schema, once. The same schemas are registered in two namespaces:
//   mistral_kernels      CPU (csrc/cpu) and CUDA (csrc/cuda) implementations
//   mistral_kernels_emu  the CUDA kernels run on CPU tensors by the SIMT emulator (csrc/emu)
// `Tensor!` marks arguments the op writes. Ops write into caller-allocated outputs; the Python
// wrappers in mistral_kernels/ops/ allocate them and register the fake (meta) implementations.
// The implementations are registered per family from its op list MK_<FAMILY>_OPS (csrc/checks/<family>.h)
// by csrc/cpu/*.cpp, csrc/cuda/<family>.cu and csrc/emu/<family>.cpp.
#include <torch/library.h>

namespace {

constexpr const char* kSchemas[] = {
    // norm / activation / rope  (MK_NORM_OPS, MK_ROPE_OPS; csrc/kernels/{norm,activation,rope}.cuh,
    // csrc/cpu/{norm,rope}.cpp)
    "rms_norm(Tensor! out, Tensor x, Tensor weight, float eps) -> ()",
    "fused_add_rms_norm(Tensor! x, Tensor! residual, Tensor weight, float eps) -> ()",
    "silu_and_mul(Tensor! out, Tensor x) -> ()",
    "rotary_embedding(Tensor positions, Tensor! q, Tensor! k, Tensor cos_sin_cache, bool is_neox) -> ()",
    // rotary_embedding, then reshape_and_cache of the rotated k and v: one launch per layer instead of two
    // (csrc/kernels/rope_cache.cuh)
    "rotary_embedding_and_cache(Tensor positions, Tensor! q, Tensor! k, Tensor v, Tensor cos_sin_cache, "
    "bool is_neox, Tensor! k_cache, Tensor! v_cache, Tensor slot_mapping) -> ()",
    // paged KV cache + attention  (MK_ATTENTION_OPS; csrc/kernels/{kv_cache,paged_decode,paged_prefill,
    // paged_prefill_tc}.cuh, csrc/cpu/paged_attention.cpp). sliding_window <= 0: none; partition_size 0:
    // automatic split-K.
    "reshape_and_cache(Tensor k, Tensor v, Tensor! k_cache, Tensor! v_cache, Tensor slot_mapping) -> ()",
    "paged_decode_attention(Tensor! out, Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
    "Tensor seq_lens, float scale, int sliding_window, int partition_size) -> ()",
    "paged_prefill_attention(Tensor! out, Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
    "Tensor cu_seqlens_q, Tensor seq_lens, float scale, int sliding_window) -> ()",
    // top-k MoE  (MK_MOE_OPS; csrc/kernels/{moe_router,moe_permute,grouped_gemm}.cuh, csrc/cpu/moe.cpp)
    "topk_softmax(Tensor! topk_weights, Tensor! topk_ids, Tensor gating_logits, bool renormalize) -> ()",
    "moe_permute(Tensor! permuted_x, Tensor! expert_offsets, Tensor! inv_perm, Tensor x, Tensor topk_ids) -> ()",
    "moe_unpermute(Tensor! out, Tensor expert_out, Tensor topk_weights, Tensor inv_perm) -> ()",
    "fused_moe(Tensor! out, Tensor x, Tensor gate_weight, Tensor w1, Tensor w2, Tensor w3, int top_k, "
    "bool renormalize) -> ()",
    "moe_expert_ffn(Tensor! out, Tensor permuted_x, Tensor expert_offsets, Tensor w1, Tensor w2, Tensor w3) -> ()",
    // linear layers on quantized weights  (MK_QUANT_OPS; formats: csrc/kernels/quant_blocks.h). qtype: GGML's
    // code of a GGUF block format (qweight uint8 [N, K / QK * bytes], scales None) or 1000 = INT8_ROWWISE
    // (qweight int8 [N, K], scales fp32 [N]).
    "qlinear(Tensor! out, Tensor x, Tensor qweight, Tensor? scales, int qtype) -> ()",
    // MoE expert projections on packed expert stacks over rows grouped by expert  (MK_MOE_QUANT_OPS;
    // csrc/kernels/moe_qgemm.cuh, csrc/cpu/moe_quant.cpp): qweight [G, N, ·] as qlinear's per expert, offsets on
    // the device; up_qweight given: SwiGLU(x·Wᵀ, x·W3ᵀ) (w1 | w3 in one op).
    "moe_qgemm(Tensor! out, Tensor x, Tensor expert_offsets, Tensor qweight, Tensor? scales, int qtype, "
    "Tensor? up_qweight, Tensor? up_scales) -> ()",
};

// CPU-only helpers (no CUDA kernel by design: on GPUs the model uses cuBLAS through torch).
constexpr const char* kCpuOnlySchemas[] = {
    // out[M, N] = x[M, K] · W[N, K]ᵀ for M <= 16, streaming W once (csrc/cpu/linear.cpp)
    "skinny_linear(Tensor! out, Tensor x, Tensor weight) -> ()",
    // the dense decoder layers of one decode step in one call (csrc/cpu/decode_layers.cpp, decode_step.h);
    // qkv / wo / w13 / w2 hold each layer's matrix as parts: one dense tensor, or packed row groups whose
    // qlinear format codes (-1: dense) and INT8_ROWWISE scales are qtypes / scales (empty: all dense);
    // quantize_x: fp32 x takes the packed parts' int8-activation paths as bf16 x always does
    "decode_layers(Tensor(a!) x, Tensor(b!) residual, Tensor[] attn_norm, Tensor[] qkv, Tensor[] wo, "
    "Tensor[] ffn_norm, Tensor[] w13, Tensor[] w2, Tensor(c!)[] k_cache, Tensor(d!)[] v_cache, int[] windows, "
    "Tensor positions, Tensor slot_mapping, Tensor block_tables, Tensor seq_lens, Tensor cos_sin, int n_heads, "
    "float eps, float scale, bool is_neox, int[] qtypes, Tensor?[] scales, bool quantize_x=False) -> ()",
};

void define_all(torch::Library& m) {
  for (const char* schema : kSchemas) m.def(schema);
}

}  // namespace

TORCH_LIBRARY(mistral_kernels, m) {
  define_all(m);
  for (const char* schema : kCpuOnlySchemas) m.def(schema);
}
TORCH_LIBRARY(mistral_kernels_emu, m) { define_all(m); }
