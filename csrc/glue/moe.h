// glue/moe.h — topk_softmax, moe_permute, moe_unpermute, fused_moe, moe_expert_ffn for the CUDA and emulated
// backends.
// Shapes: T tokens, H hidden, I intermediate, E experts, k top-k, M = T·k permuted rows.
//
// fused_moe composes the kernels without a host sync (the expert offsets never leave the device), over
// chunks of at most C = check::moe_chunk_tokens() tokens (kMoeChunkTokens, csrc/checks/moe.h: transient
// memory O(C), every buffer below sized for one chunk and reused), per chunk x_c [T_c, H]:
//   logits [T_c, E] = x_c · gate_weightᵀ   dense GEMM (at::mm: cuBLAS on CUDA, ATen on the emulated
//                                           backend's CPU tensors), in x's dtype like nn.Linear
//   weights, ids    = topk_softmax(logits)                                  (fp32, int32)
//   permuted [M, H] = moe_permute(x_c, ids)  + offsets [E+1], inv_perm [T_c, k]   (M = T_c·k)
//   act [M, I]      = silu(grouped_gemm(permuted, w1)) * grouped_gemm(permuted, w3)   (segments by offsets;
//                     fp16 / bf16: one tensor-core GEMM with the SwiGLU epilogue, else h13 [M, 2I] + silu_and_mul)
//   y [M, H]        = grouped_gemm(act, w2)
//   out_c [T_c, H]  = moe_unpermute(y, weights, inv_perm)
// The router GEMM (N = E = 8 for Mixtral) used to run as the grouped GEMM with one group: one block for a
// decode step. cuBLAS splits such a skinny product over the whole GPU.
// Index ranges of device tensors are checked by the Python wrappers; CPU ones (emulated) here.
#pragma once

#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/zeros.h>

#include <algorithm>

#include "../checks/moe.h"
#include "../kernels/activation.cuh"
#include "../kernels/grouped_gemm.cuh"
#include "../kernels/grouped_gemm_tc.cuh"
#include "../kernels/moe_permute.cuh"
#include "../kernels/moe_router.cuh"
#include "common.h"

namespace mk::inline MK_ABI::glue {

namespace moe_detail {

inline void check_expert_count(const char* op, int64_t E) {
  TORCH_CHECK(E <= kPermuteMaxExperts && E <= kRouterMaxExperts, op, ": at most ", kPermuteMaxExperts,
              " experts are supported by the ", backend::kName, " kernels, got E = ", E);
}

template <typename S>
void router(const char* op, at::Tensor& weights, at::Tensor& ids, const at::Tensor& logits, bool renormalize,
            cudaStream_t stream) {
  check_launch(launch_topk_softmax(weights.data_ptr<float>(), ids.data_ptr<int32_t>(), kptr<S>(logits),
                                   logits.size(0), static_cast<int>(logits.size(1)), static_cast<int>(weights.size(1)),
                                   renormalize, stream),
               op);
}

template <typename S>
void permute(const char* op, at::Tensor& permuted, at::Tensor& offsets, at::Tensor& inv_perm, const at::Tensor& x,
             const at::Tensor& ids, int64_t E, cudaStream_t stream) {
  const int64_t n = ids.numel();
  at::Tensor counts = at::zeros({E, std::max<int64_t>(1, ceil_div(n, kPermuteChunk))}, ids.options());
  at::Tensor rank = at::empty({std::max<int64_t>(1, n)}, ids.options());
  check_launch(launch_moe_permute(kptr<S>(permuted), offsets.data_ptr<int64_t>(), inv_perm.data_ptr<int32_t>(),
                                  counts.data_ptr<int32_t>(), rank.data_ptr<int32_t>(), kptr<S>(x),
                                  ids.const_data_ptr<int32_t>(), x.size(0), ids.size(1), x.size(1),
                                  static_cast<int>(E), stream),
               op);
}

template <typename S>
void unpermute(const char* op, at::Tensor& out, const at::Tensor& y, const at::Tensor& weights,
               const at::Tensor& inv_perm, cudaStream_t stream) {
  const int64_t T = out.size(0), H = out.size(1), k = inv_perm.size(1), M = y.size(0);
  constexpr int64_t kMaxRows = 65535;  // grid.y limit: launch in chunks of tokens
  for (int64_t t0 = 0; t0 < T; t0 += kMaxRows) {
    const int64_t nt = std::min(kMaxRows, T - t0);
    check_launch(launch_moe_unpermute(kptr<S>(out) + t0 * H, kptr<S>(y), weights.const_data_ptr<float>() + t0 * k,
                                      inv_perm.const_data_ptr<int32_t>() + t0 * k, nt, k, H, M, stream),
                 op);
  }
}

// y [M, H] rows of segment g (rows [offsets[g], offsets[g+1]), g < G, offsets on the device) =
// w2[g]·(silu(w1[g]·x) * w3[g]·x); other rows of y are not written. fp16 / bf16: the tensor-core grouped GEMM
// (grouped_gemm_tc.cuh) with the SwiGLU in the w1|w3 epilogue (no h13), its tile picked from the expected
// rows per segment (rows_per_group; ≤ 0: M / G); fp32 and shapes outside its rule: the SIMT grouped GEMM,
// whose tile height max_group_rows (a bound of any segment) picks. docs/kernels.md lists which kernel runs when.
template <typename S>
void expert_ffn(const char* op, at::Tensor& y, const at::Tensor& permuted, const int64_t* offsets, int64_t G,
                int64_t max_group_rows, const at::Tensor& w1, const at::Tensor& w2, const at::Tensor& w3,
                cudaStream_t stream, int64_t rows_per_group = 0) {
  const int64_t M = permuted.size(0), H = permuted.size(1), I = w1.size(1);
  at::Tensor act = at::empty({M, I}, permuted.options());
  const int g = static_cast<int>(G);
  using K = kernel_t<S>;
  if (rows_per_group <= 0) rows_per_group = G > 0 ? ceil_div(M, G) : M;
  const GroupedGemmTcArgs<K> up{kptr<S>(act), I, kptr<S>(permuted), H, kptr<S>(w1), kptr<S>(w3), offsets, g, M, I, H};
  if (grouped_gemm_tc_supported(up)) {
    check_launch(launch_grouped_gemm_tc(up, rows_per_group, stream), op);
  } else {
    at::Tensor h13 = at::empty({M, 2 * I}, permuted.options());
    K* h = kptr<S>(h13);
    check_launch(launch_grouped_gemm_nt(h, 2 * I, kptr<S>(permuted), H, kptr<S>(w1), offsets, g, M, max_group_rows, I,
                                        H, stream),
                 op);
    check_launch(launch_grouped_gemm_nt(h + I, 2 * I, kptr<S>(permuted), H, kptr<S>(w3), offsets, g, M,
                                        max_group_rows, I, H, stream),
                 op);
    constexpr int64_t kMaxRows = 65535;  // silu_and_mul grid.y
    for (int64_t r0 = 0; r0 < M; r0 += kMaxRows)
      check_launch(launch_silu_and_mul(kptr<S>(act) + r0 * I, h + r0 * 2 * I, std::min(kMaxRows, M - r0), I, stream),
                   op);
  }
  const GroupedGemmTcArgs<K> down{kptr<S>(y), H, kptr<S>(act), I, kptr<S>(w2), nullptr, offsets, g, M, H, I};
  if (grouped_gemm_tc_supported(down))
    check_launch(launch_grouped_gemm_tc(down, rows_per_group, stream), op);
  else
    check_launch(launch_grouped_gemm_nt(kptr<S>(y), H, kptr<S>(act), I, kptr<S>(w2), offsets, g, M, max_group_rows, H,
                                        I, stream),
                 op);
}

}  // namespace moe_detail

// topk_weights fp32 [T, k], topk_ids int32 [T, k]  ←  gating_logits [T, E]
inline void topk_softmax(at::Tensor& topk_weights, at::Tensor& topk_ids, const at::Tensor& gating_logits,
                         bool renormalize) {
  constexpr const char* op = "topk_softmax";
  backend::require_device(op, "gating_logits", gating_logits);
  check::topk_softmax_args(op, topk_weights, topk_ids, gating_logits, backend::kFloatTypes);
  moe_detail::check_expert_count(op, gating_logits.size(1));
  backend::Context ctx(gating_logits);
  MK_DISPATCH_FLOAT(gating_logits.scalar_type(), op, [&] {
    moe_detail::router<scalar_t>(op, topk_weights, topk_ids, gating_logits, renormalize, ctx.stream());
  });
}

// permuted_x [T·k, H], expert_offsets int64 [E+1], inv_perm int32 [T, k]  ←  x [T, H], topk_ids int32 [T, k]
inline void moe_permute(at::Tensor& permuted_x, at::Tensor& expert_offsets, at::Tensor& inv_perm, const at::Tensor& x,
                        const at::Tensor& topk_ids) {
  constexpr const char* op = "moe_permute";
  backend::require_device(op, "x", x);
  check::moe_permute_args(op, permuted_x, expert_offsets, inv_perm, x, topk_ids, backend::kFloatTypes);
  const int64_t E = expert_offsets.size(0) - 1;
  moe_detail::check_expert_count(op, E);
  check::index_range_cpu<int32_t>(op, "topk_ids", topk_ids, 0, E, "expert ids, E = expert_offsets.shape[0] - 1");
  backend::Context ctx(x);
  MK_DISPATCH_FLOAT(x.scalar_type(), op, [&] {
    moe_detail::permute<scalar_t>(op, permuted_x, expert_offsets, inv_perm, x, topk_ids, E, ctx.stream());
  });
}

// out [T, H] = Σ_j topk_weights[t, j] · expert_out[inv_perm[t, j]]
inline void moe_unpermute(at::Tensor& out, const at::Tensor& expert_out, const at::Tensor& topk_weights,
                          const at::Tensor& inv_perm) {
  constexpr const char* op = "moe_unpermute";
  backend::require_device(op, "expert_out", expert_out);
  check::moe_unpermute_args(op, out, expert_out, topk_weights, inv_perm, backend::kFloatTypes);
  check::index_range_cpu<int32_t>(op, "inv_perm", inv_perm, 0, expert_out.size(0), "rows of expert_out");
  backend::Context ctx(expert_out);
  MK_DISPATCH_FLOAT(expert_out.scalar_type(), op, [&] {
    moe_detail::unpermute<scalar_t>(op, out, expert_out, topk_weights, inv_perm, ctx.stream());
  });
}

// out [T, H] = Mixtral sparse MoE block(x [T, H])
inline void fused_moe(at::Tensor& out, const at::Tensor& x, const at::Tensor& gate_weight, const at::Tensor& w1,
                      const at::Tensor& w2, const at::Tensor& w3, int64_t top_k, bool renormalize) {
  constexpr const char* op = "fused_moe";
  backend::require_device(op, "x", x);
  check::fused_moe_args(op, out, x, gate_weight, w1, w2, w3, top_k, backend::kFloatTypes);
  const int64_t T = x.size(0), H = x.size(1), E = gate_weight.size(0), k = top_k;
  moe_detail::check_expert_count(op, E);
  if (T == 0) return;
  backend::Context ctx(x);
  const cudaStream_t stream = ctx.stream();
  const int64_t C = std::min(T, check::moe_chunk_tokens(op)), MC = C * k;  // tokens, rows per chunk
  at::Tensor logits = at::empty({C, E}, x.options());
  at::Tensor weights = at::empty({C, k}, x.options().dtype(at::kFloat));
  at::Tensor ids = at::empty({C, k}, x.options().dtype(at::kInt));
  at::Tensor inv_perm = at::empty({C, k}, x.options().dtype(at::kInt));
  at::Tensor offsets = at::empty({E + 1}, x.options().dtype(at::kLong));
  at::Tensor permuted = at::empty({MC, H}, x.options());
  at::Tensor y = at::empty({MC, H}, x.options());
  const at::Tensor gate_t = gate_weight.t();
  MK_DISPATCH_FLOAT(x.scalar_type(), op, [&] {
    for (int64_t t0 = 0; t0 < T; t0 += C) {
      const int64_t tc = std::min(C, T - t0), mc = tc * k;  // narrowed leading dims stay contiguous
      at::Tensor out_c = out.narrow(0, t0, tc), logits_c = logits.narrow(0, 0, tc);
      at::Tensor weights_c = weights.narrow(0, 0, tc), ids_c = ids.narrow(0, 0, tc);
      at::Tensor inv_c = inv_perm.narrow(0, 0, tc), permuted_c = permuted.narrow(0, 0, mc), y_c = y.narrow(0, 0, mc);
      const at::Tensor x_c = x.narrow(0, t0, tc);
      at::mm_out(logits_c, x_c, gate_t);  // router: the dense GEMM path
      moe_detail::router<scalar_t>(op, weights_c, ids_c, logits_c, renormalize, stream);
      moe_detail::permute<scalar_t>(op, permuted_c, offsets, inv_c, x_c, ids_c, E, stream);
      // A token picks an expert at most once: no segment exceeds tc rows.
      moe_detail::expert_ffn<scalar_t>(op, y_c, permuted_c, offsets.const_data_ptr<int64_t>(), E, tc, w1, w2, w3,
                                       stream);
      moe_detail::unpermute<scalar_t>(op, out_c, y_c, weights_c, inv_c, stream);
    }
  });
}

// out [M, H]: the SwiGLU experts w1/w3 [G, I, H], w2 [G, H, I] over the segments of permuted_x [M, H]
// (segment e = rows [offsets[e], offsets[e+1]), offsets on the device: no host sync); other rows are 0.
inline void moe_expert_ffn(at::Tensor& out, const at::Tensor& permuted_x, const at::Tensor& expert_offsets,
                           const at::Tensor& w1, const at::Tensor& w2, const at::Tensor& w3) {
  constexpr const char* op = "moe_expert_ffn";
  backend::require_device(op, "permuted_x", permuted_x);
  check::expert_ffn_args(op, out, permuted_x, expert_offsets, w1, w2, w3, backend::kFloatTypes);
  const int64_t M = permuted_x.size(0), G = w1.size(0);
  moe_detail::check_expert_count(op, G);
  backend::Context ctx(permuted_x);
  out.zero_();
  if (M == 0 || G == 0) return;
  MK_DISPATCH_FLOAT(permuted_x.scalar_type(), op, [&] {
    // Segment sizes stay on the device: bound every segment by M rows (tiles past a segment exit early). The
    // rows expected per expert: M over every bucket of expert_offsets (other ranks' experts included).
    moe_detail::expert_ffn<scalar_t>(op, out, permuted_x, expert_offsets.const_data_ptr<int64_t>(), G, M, w1, w2, w3,
                                     ctx.stream(), ceil_div(M, expert_offsets.size(0) - 1));
  });
}

}  // namespace mk::inline MK_ABI::glue
