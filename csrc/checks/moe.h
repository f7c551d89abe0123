// checks/moe.h — argument checks for topk_softmax, moe_permute, moe_unpermute, fused_moe, moe_expert_ffn.
// Shapes: T tokens, H hidden, I intermediate, E experts, k top-k, M = rows of expert_out (T·k from moe_permute).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <utility>

#include "common.h"

// The ops of this family (registered by every backend from this list; see common.h).
#define MK_MOE_OPS(X) X(topk_softmax) X(moe_permute) X(moe_unpermute) X(fused_moe) X(moe_expert_ffn)

namespace mk::inline MK_ABI::check {

// k is held one-per-lane by the CUDA router (one warp per token): every backend accepts 1 ≤ k ≤ min(E, 32).
inline constexpr int64_t kMaxTopK = 32;

// The most experts any backend accepts (the CUDA router and permute scan keep E values in shared memory;
// the CPU shares the bound, so a call never succeeds on one backend and fails on another).
inline constexpr int64_t kMaxExperts = 4096;

// fused_moe runs the router, permute, expert GEMMs and unpermute over at most kMoeChunkTokens tokens at a
// time, so its transient memory is O(chunk), not O(T): per chunk of C tokens, M = C·k rows,
//   permuted, y [M, H] + the expert intermediates (gate|up [M, 2I], act [M, I]) + logits [C, E] + indices,
// in x's dtype: Mixtral-8x7B (H 4096, I 14336, k 2) in bf16 ≈ C·k·(2H + 3I)·2 B ≈ 0.84 GB for C = 4096.
// A chunk of 4096 tokens still gives each of Mixtral's 8 experts ~1024 rows: full-height GEMM tiles.
inline constexpr int64_t kMoeChunkTokens = 4096;

// The chunk in tokens: kMoeChunkTokens, or MK_MOE_CHUNK_TOKENS (≥ 1; internal, for the tests that compare a
// tiny chunk with the unchunked reference). Read at every call: a getenv, no device work.
inline int64_t moe_chunk_tokens(const char* op) {
  const char* env = std::getenv("MK_MOE_CHUNK_TOKENS");
  if (env == nullptr || *env == '\0') return kMoeChunkTokens;
  char* end = nullptr;
  const long long v = std::strtoll(env, &end, 10);
  TORCH_CHECK(*end == '\0' && v >= 1, op, ": MK_MOE_CHUNK_TOKENS must be a positive integer (tokens per chunk), "
              "got '", env, "'");
  return static_cast<int64_t>(v);
}

inline void topk_range(const char* op, int64_t k, int64_t E) {
  TORCH_CHECK(E >= 1 && E <= kMaxExperts, op, ": the number of experts E must be in [1, ", kMaxExperts, "], got ", E);
  TORCH_CHECK(k >= 1 && k <= E && k <= kMaxTopK, op, ": top-k must satisfy 1 <= k <= min(E, ", kMaxTopK,
              ") with E = ", E, " experts, got k = ", k);
}

// weights fp32 [T, k], ids int32 [T, k]  ←  gating_logits [T, E] (float dtype)
inline void topk_softmax_args(const char* op, const at::Tensor& weights, const at::Tensor& ids,
                              const at::Tensor& logits, std::initializer_list<at::ScalarType> dtypes) {
  dtype_in(op, "gating_logits", logits, dtypes);
  dtype_is(op, "topk_weights", weights, at::kFloat);
  dtype_is(op, "topk_ids", ids, at::kInt);
  same_device(op, "topk_weights", weights, "gating_logits", logits);
  same_device(op, "topk_ids", ids, "gating_logits", logits);
  ndim(op, "gating_logits", logits, 2, "[T, E]");
  ndim(op, "topk_weights", weights, 2, "[T, k]");
  ndim(op, "topk_ids", ids, 2, "[T, k]");
  const int64_t T = logits.size(0), E = logits.size(1), k = weights.size(1);
  topk_range(op, k, E);
  size_eq(op, "topk_weights", weights, 0, T, "T = gating_logits.shape[0]");
  TORCH_CHECK(ids.sizes() == weights.sizes(), op, ": topk_ids must have the shape of topk_weights ",
              shape_str(weights), ", got ", shape_str(ids));
  contiguous(op, "gating_logits", logits);
  contiguous(op, "topk_weights", weights);
  contiguous(op, "topk_ids", ids);
  no_overlap(op, "topk_weights", weights, {{"topk_ids", &ids}, {"gating_logits", &logits}});
  no_overlap(op, "topk_ids", ids, {{"gating_logits", &logits}});
}

// permuted_x [T·k, H], expert_offsets int64 [E+1], inv_perm int32 [T, k]  ←  x [T, H], topk_ids int32 [T, k]
inline void moe_permute_args(const char* op, const at::Tensor& permuted_x, const at::Tensor& offsets,
                             const at::Tensor& inv_perm, const at::Tensor& x, const at::Tensor& ids,
                             std::initializer_list<at::ScalarType> dtypes) {
  dtype_in(op, "x", x, dtypes);
  same_dtype(op, "permuted_x", permuted_x, "x", x);
  dtype_is(op, "topk_ids", ids, at::kInt);
  dtype_is(op, "expert_offsets", offsets, at::kLong);
  dtype_is(op, "inv_perm", inv_perm, at::kInt);
  for (auto [name, t] : {std::pair<const char*, const at::Tensor*>{"permuted_x", &permuted_x},
                         {"expert_offsets", &offsets}, {"inv_perm", &inv_perm}, {"topk_ids", &ids}})
    same_device(op, name, *t, "x", x);
  ndim(op, "x", x, 2, "[T, H]");
  ndim(op, "topk_ids", ids, 2, "[T, k]");
  ndim(op, "permuted_x", permuted_x, 2, "[T*k, H]");
  ndim(op, "expert_offsets", offsets, 1, "[E+1]");
  ndim(op, "inv_perm", inv_perm, 2, "[T, k]");
  const int64_t T = x.size(0), H = x.size(1), k = ids.size(1), E = offsets.size(0) - 1;
  size_eq(op, "topk_ids", ids, 0, T, "T = x.shape[0]");
  topk_range(op, k, E);
  TORCH_CHECK(T * k <= INT32_MAX, op, ": T*k = ", T * k, " rows exceed the int32 range of inv_perm");
  size_eq(op, "permuted_x", permuted_x, 0, T * k, "T*k rows");
  size_eq(op, "permuted_x", permuted_x, 1, H, "H = x.shape[1]");
  TORCH_CHECK(inv_perm.sizes() == ids.sizes(), op, ": inv_perm must have the shape of topk_ids ", shape_str(ids),
              ", got ", shape_str(inv_perm));
  contiguous(op, "x", x);
  contiguous(op, "topk_ids", ids);
  contiguous(op, "permuted_x", permuted_x);
  contiguous(op, "expert_offsets", offsets);
  contiguous(op, "inv_perm", inv_perm);
  no_overlap(op, "permuted_x", permuted_x, {{"expert_offsets", &offsets}, {"inv_perm", &inv_perm}, {"x", &x},
                                            {"topk_ids", &ids}});
  no_overlap(op, "expert_offsets", offsets, {{"inv_perm", &inv_perm}, {"x", &x}, {"topk_ids", &ids}});
  no_overlap(op, "inv_perm", inv_perm, {{"x", &x}, {"topk_ids", &ids}});
}

// out [T, H]  ←  expert_out [M, H], topk_weights fp32 [T, k], inv_perm int32 [T, k] (values in [0, M))
inline void moe_unpermute_args(const char* op, const at::Tensor& out, const at::Tensor& expert_out,
                               const at::Tensor& weights, const at::Tensor& inv_perm,
                               std::initializer_list<at::ScalarType> dtypes) {
  dtype_in(op, "expert_out", expert_out, dtypes);
  same_dtype(op, "out", out, "expert_out", expert_out);
  dtype_is(op, "topk_weights", weights, at::kFloat);
  dtype_is(op, "inv_perm", inv_perm, at::kInt);
  same_device(op, "out", out, "expert_out", expert_out);
  same_device(op, "topk_weights", weights, "expert_out", expert_out);
  same_device(op, "inv_perm", inv_perm, "expert_out", expert_out);
  ndim(op, "expert_out", expert_out, 2, "[T*k, H]");
  ndim(op, "topk_weights", weights, 2, "[T, k]");
  ndim(op, "inv_perm", inv_perm, 2, "[T, k]");
  ndim(op, "out", out, 2, "[T, H]");
  TORCH_CHECK(inv_perm.sizes() == weights.sizes(), op, ": inv_perm must have the shape of topk_weights ",
              shape_str(weights), ", got ", shape_str(inv_perm));
  size_eq(op, "out", out, 0, weights.size(0), "T = topk_weights.shape[0]");
  size_eq(op, "out", out, 1, expert_out.size(1), "H = expert_out.shape[1]");
  contiguous(op, "expert_out", expert_out);
  contiguous(op, "topk_weights", weights);
  contiguous(op, "inv_perm", inv_perm);
  contiguous(op, "out", out);
  no_overlap(op, "out", out, {{"expert_out", &expert_out}, {"topk_weights", &weights}, {"inv_perm", &inv_perm}});
}

// Stacked SwiGLU expert weights w1, w3 [E, I, H] and w2 [E, H, I] for activations x [rows, H] named `x_name`:
// x's dtype and device, contiguous. E is the expected expert count (from the router or from w1 itself).
inline void expert_weights(const char* op, const char* x_name, const at::Tensor& x, const at::Tensor& w1,
                           const at::Tensor& w2, const at::Tensor& w3, int64_t E, const char* e_from) {
  for (auto [name, t] : {std::pair<const char*, const at::Tensor*>{"w1", &w1}, {"w2", &w2}, {"w3", &w3}}) {
    same_dtype(op, name, *t, x_name, x);
    same_device(op, name, *t, x_name, x);
    contiguous(op, name, *t);
  }
  ndim(op, "w1", w1, 3, "[E, I, H]");
  ndim(op, "w3", w3, 3, "[E, I, H]");
  ndim(op, "w2", w2, 3, "[E, H, I]");
  const int64_t H = x.size(1), I = w1.size(1);
  TORCH_CHECK(w1.size(0) == E && w1.size(2) == H, op, ": w1 must be [E, I, H] = [", E, ", I, ", H, "] (E from ",
              e_from, ", H from ", x_name, "), got ", shape_str(w1));
  TORCH_CHECK(w3.sizes() == w1.sizes(), op, ": w3 must have the shape of w1 ", shape_str(w1), ", got ",
              shape_str(w3));
  TORCH_CHECK(w2.size(0) == E && w2.size(1) == H && w2.size(2) == I, op, ": w2 must be [E, H, I] = [", E, ", ", H,
              ", ", I, "], got ", shape_str(w2));
}

// out [T, H]  ←  x [T, H], gate_weight [E, H], w1, w3 [E, I, H], w2 [E, H, I]; one dtype, contiguous.
inline void fused_moe_args(const char* op, const at::Tensor& out, const at::Tensor& x, const at::Tensor& gate,
                           const at::Tensor& w1, const at::Tensor& w2, const at::Tensor& w3, int64_t top_k,
                           std::initializer_list<at::ScalarType> dtypes) {
  dtype_in(op, "x", x, dtypes);
  for (auto [name, t] : {std::pair<const char*, const at::Tensor*>{"out", &out}, {"gate_weight", &gate}}) {
    same_dtype(op, name, *t, "x", x);
    same_device(op, name, *t, "x", x);
    contiguous(op, name, *t);
  }
  contiguous(op, "x", x);
  ndim(op, "x", x, 2, "[T, H]");
  ndim(op, "gate_weight", gate, 2, "[E, H]");
  const int64_t E = gate.size(0);
  size_eq(op, "gate_weight", gate, 1, x.size(1), "H = x.shape[1]");
  expert_weights(op, "x", x, w1, w2, w3, E, "gate_weight");
  TORCH_CHECK(out.sizes() == x.sizes(), op, ": out must have the shape of x ", shape_str(x), ", got ",
              shape_str(out));
  topk_range(op, top_k, E);
  TORCH_CHECK(x.size(0) * top_k <= INT32_MAX, op, ": T*top_k = ", x.size(0) * top_k,
              " rows exceed the int32 range of the permutation");
  no_overlap(op, "out", out, {{"x", &x}, {"gate_weight", &gate}, {"w1", &w1}, {"w2", &w2}, {"w3", &w3}});
}

// permuted_x [M, H] rows grouped by expert; expert_offsets int64 [>= G+1] (segment e = rows
// [offsets[e], offsets[e+1])); w1, w3 [G, I, H]; w2 [G, H, I]; out [M, H].
inline void expert_ffn_args(const char* op, const at::Tensor& out, const at::Tensor& x, const at::Tensor& offsets,
                            const at::Tensor& w1, const at::Tensor& w2, const at::Tensor& w3,
                            std::initializer_list<at::ScalarType> dtypes) {
  dtype_in(op, "permuted_x", x, dtypes);
  same_dtype(op, "out", out, "permuted_x", x);
  same_device(op, "out", out, "permuted_x", x);
  contiguous(op, "out", out);
  same_device(op, "expert_offsets", offsets, "permuted_x", x);
  dtype_is(op, "expert_offsets", offsets, at::kLong);
  contiguous(op, "expert_offsets", offsets);
  contiguous(op, "permuted_x", x);
  ndim(op, "permuted_x", x, 2, "[M, H]");
  ndim(op, "expert_offsets", offsets, 1, "[G + 1] (or longer)");
  ndim(op, "w1", w1, 3, "[G, I, H]");
  const int64_t G = w1.size(0);
  expert_weights(op, "permuted_x", x, w1, w2, w3, G, "w1");
  TORCH_CHECK(offsets.size(0) >= G + 1, op, ": expert_offsets needs at least G + 1 = ", G + 1,
              " entries (G = w1.shape[0] experts), got ", offsets.size(0));
  TORCH_CHECK(out.sizes() == x.sizes(), op, ": out must have the shape of permuted_x ", shape_str(x), ", got ",
              shape_str(out));
  TORCH_CHECK(x.size(0) <= INT32_MAX, op, ": permuted_x has more than INT32_MAX rows");
  no_overlap(op, "out", out, {{"permuted_x", &x}, {"expert_offsets", &offsets}, {"w1", &w1}, {"w2", &w2}, {"w3", &w3}});
  if (offsets.device().is_cpu()) {  // segment bounds: 0 <= offsets[0] <= ... <= offsets[G] <= M
    const int64_t* o = offsets.const_data_ptr<int64_t>();
    for (int64_t e = 0; e <= G; ++e)
      TORCH_CHECK(o[e] >= (e ? o[e - 1] : 0) && o[e] <= x.size(0), op, ": expert_offsets[", e, "]=", o[e],
                  " breaks 0 <= offsets[0] <= ... <= offsets[G] <= M = ", x.size(0));
  }
}

}  // namespace mk::inline MK_ABI::check
