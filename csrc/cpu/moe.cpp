// cpu/moe.cpp — native CPU top-k MoE (MK_MOE_OPS; fp32, bf16, fp16): topk_softmax, moe_permute, moe_unpermute,
// fused_moe, moe_expert_ffn.
// Shapes: T tokens, H hidden, I intermediate, E experts, k top-k, M = T·k permuted rows.
//
// Index layout (the same on every backend; worked example in python/mistral_kernels/ops/moe.py):
//   expert_offsets[e] .. expert_offsets[e+1]  rows of expert e in permuted_x, tokens in increasing order;
//   inv_perm[t, j]                            the row of permuted_x holding x[t] for its j-th expert.
// Everything is deterministic: the permutation is built by one serial counting-sort pass (O(T·k) integer
// work); the row copies, the router and the weighted sums are parallel over tokens / rows.
//
// fused_moe = per chunk of ≤ kMoeChunkTokens tokens (csrc/checks/moe.h: transient memory O(chunk)):
// router GEMM → topk_softmax → moe_permute → per non-empty expert segment:
//   gate = A·w1[e]ᵀ, up = A·w3[e]ᵀ, act = silu(gate)·up, y = act·w2[e]ᵀ → moe_unpermute,
// the projections by skinny_linear (≤ 16 rows: decode) or ATen's GEMM (prefill).
// Experts with no token cost nothing (decode T = 1 touches exactly k experts). Intermediates are stored in
// the input dtype (router logits, gate, up, act, expert outputs), softmax and the final weighted sum in fp32.
#include <ATen/Functions.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <cmath>
#include <vector>

#include "../checks/moe.h"
#include "../kernels/common.cuh"
#include "common.h"
#include "isa/norm.h"
#include "isa_dispatch.h"

namespace mk::cpu {
namespace {

// ---- router ----------------------------------------------------------------------------------------
// Per token: p = softmax(logits) in fp32; k rounds of argmax (ties → lower expert id, the chosen one is
// excluded afterwards); weights = p[chosen] / Σ p[chosen] when renormalize.
template <typename T>
void topk_softmax_rows(const T* logits, float* weights, int32_t* ids, int64_t T_, int64_t E, int64_t k,
                       bool renormalize) {
  // work per token: the softmax over E, then k argmax passes over E
  at::parallel_for(0, T_, parallel_grain(E * (k + 1)), [&](int64_t t0, int64_t t1) {
    std::vector<float> p(E);
    std::vector<char> used(E);
    for (int64_t t = t0; t < t1; ++t) {
      const T* l = logits + t * E;
      float m = -INFINITY;
      for (int64_t e = 0; e < E; ++e) m = std::max(m, to_f(l[e]));
      float s = 0.f;
      for (int64_t e = 0; e < E; ++e) {
        p[e] = std::exp(to_f(l[e]) - m);
        s += p[e];
      }
      const float inv_s = 1.f / s;
      for (int64_t e = 0; e < E; ++e) p[e] *= inv_s;
      std::fill(used.begin(), used.end(), 0);
      float chosen = 0.f;
      for (int64_t j = 0; j < k; ++j) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; ++e)  // strict '>': ties keep the lower id; NaN ranks last (common.cuh)
          if (!used[e] && (best < 0 || router_rank(p[e]) > router_rank(p[best]))) best = e;
        used[best] = 1;
        weights[t * k + j] = p[best];
        ids[t * k + j] = static_cast<int32_t>(best);
        chosen += p[best];
      }
      if (renormalize) {
        const float inv = 1.f / chosen;
        for (int64_t j = 0; j < k; ++j) weights[t * k + j] *= inv;
      }
    }
  });
}

void topk_softmax(at::Tensor& weights, at::Tensor& ids, const at::Tensor& logits, bool renormalize) {
  constexpr const char* op = "topk_softmax";
  require_cpu(op, "gating_logits", logits);
  check::topk_softmax_args(op, weights, ids, logits, kFloatTypes);
  MK_CPU_DISPATCH(logits.scalar_type(), op, [&] {
    topk_softmax_rows(logits.const_data_ptr<scalar_t>(), weights.data_ptr<float>(), ids.data_ptr<int32_t>(),
                      logits.size(0), logits.size(1), weights.size(1), renormalize);
  });
}

// ---- permute / unpermute -----------------------------------------------------------------------------
// Counting sort of the flat entries f = t·k + j by expert, stable in f (hence in t).
void build_permutation(const int32_t* ids, int64_t n, int64_t E, int64_t* offsets, int32_t* inv_perm) {
  std::vector<int64_t> cursor(E + 1, 0);
  for (int64_t f = 0; f < n; ++f) ++cursor[ids[f] + 1];
  for (int64_t e = 0; e < E; ++e) cursor[e + 1] += cursor[e];
  std::copy(cursor.begin(), cursor.end(), offsets);
  for (int64_t f = 0; f < n; ++f) inv_perm[f] = static_cast<int32_t>(cursor[ids[f]]++);
}

// permuted[inv_perm[f]] = x[f / k]
void gather_rows(char* permuted, const char* x, const int32_t* inv_perm, int64_t n, int64_t k, int64_t row_bytes) {
  at::parallel_for(0, n, parallel_grain(row_bytes), [&](int64_t f0, int64_t f1) {  // work: bytes copied
    for (int64_t f = f0; f < f1; ++f)
      std::memcpy(permuted + static_cast<int64_t>(inv_perm[f]) * row_bytes, x + (f / k) * row_bytes, row_bytes);
  });
}

void moe_permute(at::Tensor& permuted_x, at::Tensor& expert_offsets, at::Tensor& inv_perm, const at::Tensor& x,
                 const at::Tensor& topk_ids) {
  constexpr const char* op = "moe_permute";
  require_cpu(op, "x", x);
  check::moe_permute_args(op, permuted_x, expert_offsets, inv_perm, x, topk_ids, kFloatTypes);
  const int64_t E = expert_offsets.size(0) - 1, k = topk_ids.size(1), n = topk_ids.numel();
  check::index_range_cpu<int32_t>(op, "topk_ids", topk_ids, 0, E, "expert ids, E = expert_offsets.shape[0] - 1");
  build_permutation(topk_ids.const_data_ptr<int32_t>(), n, E, expert_offsets.data_ptr<int64_t>(),
                    inv_perm.data_ptr<int32_t>());
  gather_rows(static_cast<char*>(permuted_x.data_ptr()), static_cast<const char*>(x.const_data_ptr()),
              inv_perm.const_data_ptr<int32_t>(), n, k, x.size(1) * x.element_size());
}

// out[t] = Σ_j w[t, j] · y[inv_perm[t, j]], fp32 accumulation in j order.
template <typename T>
void unpermute_rows(T* out, const T* y, const float* w, const int32_t* inv_perm, int64_t T_, int64_t k, int64_t H) {
  // work per token: k multiply-adds per output element
  at::parallel_for(0, T_, parallel_grain(H * k), [&](int64_t t0, int64_t t1) {
    std::vector<float> acc(H);
    for (int64_t t = t0; t < t1; ++t) {
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t j = 0; j < k; ++j) {
        const float wj = w[t * k + j];
        const T* row = y + static_cast<int64_t>(inv_perm[t * k + j]) * H;
        for (int64_t h = 0; h < H; ++h) acc[h] += wj * to_f(row[h]);
      }
      T* o = out + t * H;
      for (int64_t h = 0; h < H; ++h) o[h] = from_f<T>(acc[h]);
    }
  });
}

void moe_unpermute(at::Tensor& out, const at::Tensor& expert_out, const at::Tensor& topk_weights,
                   const at::Tensor& inv_perm) {
  constexpr const char* op = "moe_unpermute";
  require_cpu(op, "expert_out", expert_out);
  check::moe_unpermute_args(op, out, expert_out, topk_weights, inv_perm, kFloatTypes);
  check::index_range_cpu<int32_t>(op, "inv_perm", inv_perm, 0, expert_out.size(0), "rows of expert_out");
  MK_CPU_DISPATCH(expert_out.scalar_type(), op, [&] {
    unpermute_rows(out.data_ptr<scalar_t>(), expert_out.const_data_ptr<scalar_t>(),
                   topk_weights.const_data_ptr<float>(), inv_perm.const_data_ptr<int32_t>(), out.size(0),
                   inv_perm.size(1), out.size(1));
  });
}

// ---- fused block ---------------------------------------------------------------------------------------
// out [n, N] = a [n, K] · w [N, K]ᵀ. Decode-sized segments (n ≤ 16) go to skinny_linear (csrc/cpu/linear.cpp),
// which streams the expert's weight once at memory bandwidth; larger ones to ATen's GEMM.
constexpr int64_t kSkinnyMaxRows = 16;  // kMaxM of csrc/cpu/linear.cpp

void linear_into(at::Tensor& out, const at::Tensor& a, const at::Tensor& w) {
  if (a.size(0) <= kSkinnyMaxRows) {
    static const auto skinny = c10::Dispatcher::singleton()
                                   .findSchemaOrThrow("mistral_kernels::skinny_linear", "")
                                   .typed<void(at::Tensor&, const at::Tensor&, const at::Tensor&)>();
    skinny.call(out, a, w);
  } else {
    at::mm_out(out, a, w.t());
  }
}

// act[r] = silu(gate[r]) * up[r] for rows [r0, r1), fp32 math, stored in the dtype (the per-ISA SwiGLU of
// silu_and_mul, csrc/cpu/isa/norm.cpp).
void silu_mul_rows(at::Tensor& act, const at::Tensor& gate, const at::Tensor& up, int64_t r0, int64_t r1) {
  const int64_t I = act.size(1);
  const auto kernel = MK_ISA_CALL(silu_mul_rows);
  const Elem elem = elem_of(act.scalar_type());
  void* o = act.data_ptr();
  const void* g = gate.const_data_ptr();
  const void* u = up.const_data_ptr();
  // work per row: 2 per output (silu, the product), as silu_and_mul
  at::parallel_for(r0, r1, parallel_grain(2 * I), [&](int64_t a, int64_t b) { kernel(elem, o, I, g, u, I, a, b, I); });
}

// y[rows of segment e] = w2[e]·(silu(w1[e]·a) * w3[e]·a) for the G experts, a = permuted rows of the
// segment (segment e = rows [offsets[e], offsets[e+1])). Empty segments cost nothing; other rows of y
// are not written.
void expert_segments(at::Tensor& y, const at::Tensor& permuted, const int64_t* offsets, int64_t G,
                     const at::Tensor& w1, const at::Tensor& w2, const at::Tensor& w3) {
  const int64_t M = permuted.size(0), I = w1.size(1);
  at::Tensor gate = at::empty({M, I}, permuted.options()), up = at::empty({M, I}, permuted.options());
  at::Tensor act = at::empty({M, I}, permuted.options());
  for (int64_t e = 0; e < G; ++e) {
    const int64_t r0 = offsets[e], n = offsets[e + 1] - r0;
    if (n == 0) continue;  // untouched expert: no work at all
    const at::Tensor a = permuted.narrow(0, r0, n);
    at::Tensor g = gate.narrow(0, r0, n), u = up.narrow(0, r0, n);
    linear_into(g, a, w1.select(0, e));
    linear_into(u, a, w3.select(0, e));
    silu_mul_rows(act, gate, up, r0, r0 + n);
    at::Tensor ye = y.narrow(0, r0, n);
    linear_into(ye, act.narrow(0, r0, n), w2.select(0, e));
  }
}

// out [M, H]: the SwiGLU experts over the segments of permuted_x; rows outside every segment are 0.
void moe_expert_ffn(at::Tensor& out, const at::Tensor& permuted_x, const at::Tensor& expert_offsets,
                    const at::Tensor& w1, const at::Tensor& w2, const at::Tensor& w3) {
  constexpr const char* op = "moe_expert_ffn";
  require_cpu(op, "permuted_x", permuted_x);
  check::expert_ffn_args(op, out, permuted_x, expert_offsets, w1, w2, w3, kFloatTypes);
  out.zero_();
  if (permuted_x.size(0) == 0) return;
  expert_segments(out, permuted_x, expert_offsets.const_data_ptr<int64_t>(), w1.size(0), w1, w2, w3);
}

void fused_moe(at::Tensor& out, const at::Tensor& x, const at::Tensor& gate_weight, const at::Tensor& w1,
               const at::Tensor& w2, const at::Tensor& w3, int64_t top_k, bool renormalize) {
  constexpr const char* op = "fused_moe";
  require_cpu(op, "x", x);
  check::fused_moe_args(op, out, x, gate_weight, w1, w2, w3, top_k, kFloatTypes);
  const int64_t T_ = x.size(0), H = x.size(1), E = gate_weight.size(0), k = top_k;
  if (T_ == 0) return;

  // Chunks of at most C tokens (kMoeChunkTokens, csrc/checks/moe.h): every transient buffer is O(C).
  const int64_t C = std::min(T_, check::moe_chunk_tokens(op)), MC = C * k;
  at::Tensor logits = at::empty({C, E}, x.options());  // in x's dtype, like nn.Linear
  at::Tensor weights = at::empty({C, k}, x.options().dtype(at::kFloat));
  at::Tensor ids = at::empty({C, k}, x.options().dtype(at::kInt));
  at::Tensor inv_perm = at::empty({C, k}, x.options().dtype(at::kInt));
  std::vector<int64_t> offsets(E + 1);
  at::Tensor permuted = at::empty({MC, H}, x.options());
  at::Tensor y = at::empty({MC, H}, x.options());

  MK_CPU_DISPATCH(x.scalar_type(), op, [&] {
    for (int64_t t0 = 0; t0 < T_; t0 += C) {
      const int64_t tc = std::min(C, T_ - t0), mc = tc * k;
      const at::Tensor x_c = x.narrow(0, t0, tc);
      at::Tensor logits_c = logits.narrow(0, 0, tc), y_c = y.narrow(0, 0, mc);
      linear_into(logits_c, x_c, gate_weight);
      topk_softmax_rows(logits.const_data_ptr<scalar_t>(), weights.data_ptr<float>(), ids.data_ptr<int32_t>(), tc,
                        E, k, renormalize);
      build_permutation(ids.const_data_ptr<int32_t>(), mc, E, offsets.data(), inv_perm.data_ptr<int32_t>());
      gather_rows(static_cast<char*>(permuted.data_ptr()), static_cast<const char*>(x_c.const_data_ptr()),
                  inv_perm.const_data_ptr<int32_t>(), mc, k, H * x.element_size());
      expert_segments(y_c, permuted.narrow(0, 0, mc), offsets.data(), E, w1, w2, w3);
      unpermute_rows(out.data_ptr<scalar_t>() + t0 * H, y.const_data_ptr<scalar_t>(), weights.const_data_ptr<float>(),
                     inv_perm.const_data_ptr<int32_t>(), tc, k, H);
    }
  });
}

}  // namespace
}  // namespace mk::cpu

TORCH_LIBRARY_IMPL(mistral_kernels, CPU, m) { MK_MOE_OPS(MK_IMPL_CPU) }
