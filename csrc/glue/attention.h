// glue/attention.h — reshape_and_cache, paged_decode_attention, paged_prefill_attention for the CUDA
// and emulated backends: checks, split-K workspace, dtype / head_dim dispatch, launch.
// Shapes: see csrc/checks/attention.h (T tokens, Tq packed queries, B sequences, Hq / Hkv heads,
// D head_dim, N num_blocks, S block_size, M max_blocks, P split-K partitions).
#pragma once

#include <ATen/ops/empty.h>

#include "../checks/attention.h"
#include "../kernels/kv_cache.cuh"
#include "../kernels/paged_decode.cuh"
#include "../kernels/paged_prefill.cuh"
#include "../kernels/paged_prefill_tc.cuh"
#include "common.h"

namespace mk::inline MK_ABI::glue {

inline void check_attention_launch(cudaError_t err, const char* op) {
  TORCH_CHECK(err != cudaErrorMisalignedAddress, op,
              ": k_cache, v_cache (and for prefill q's rows and token stride) must be 16-byte aligned for the "
              "vectorised kernels; pass tensors allocated by torch (not offset views)");
  check_launch(err, op);
}

// The kernels' window: effective_window of the block tables' capacity (M·S keys).
inline int kernel_window(int64_t sliding_window, const at::Tensor& k_cache, const at::Tensor& block_tables) {
  return static_cast<int>(effective_window(sliding_window, block_tables.size(1) * k_cache.size(1)));
}

inline void reshape_and_cache(const at::Tensor& k, const at::Tensor& v, at::Tensor& k_cache, at::Tensor& v_cache,
                              const at::Tensor& slot_mapping) {
  constexpr const char* op = "reshape_and_cache";
  backend::require_device(op, "k", k);
  check::reshape_and_cache_args(op, k, v, k_cache, v_cache, slot_mapping, backend::kFloatTypes);
  backend::Context ctx(k);
  MK_DISPATCH_FLOAT(k.scalar_type(), op, [&] {
    // The whole cache as slots of Hkv·D elements (no block table: slot_mapping holds the slots).
    const PagedKV<kernel_t<scalar_t>> cache{kptr<scalar_t>(k_cache), kptr<scalar_t>(v_cache), nullptr,
                                            k.size(1) * k.size(2), static_cast<int>(k_cache.size(1)),
                                            static_cast<int>(k_cache.size(0))};
    check_launch(launch_reshape_and_cache(kptr<scalar_t>(k), kptr<scalar_t>(v), cache,
                                          slot_mapping.const_data_ptr<int64_t>(), k.size(0), k.stride(0), v.stride(0),
                                          ctx.stream()),
                 op);
  });
}

inline void paged_decode_attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache,
                                   const at::Tensor& v_cache, const at::Tensor& block_tables,
                                   const at::Tensor& seq_lens, double scale, int64_t sliding_window,
                                   int64_t partition_size) {
  constexpr const char* op = "paged_decode_attention";
  backend::require_device(op, "q", q);
  check::attention_common_args(op, out, q, k_cache, v_cache, block_tables, seq_lens, scale, backend::kFloatTypes,
                               true);
  check::decode_shape_args(op, q, k_cache, block_tables, seq_lens, sliding_window, partition_size);
  check::paged_indices_cpu(op, k_cache, block_tables, seq_lens, sliding_window);  // emulated (CPU) index tensors
  if (out.numel() == 0) return;
  backend::Context ctx(q);
  const int64_t B = seq_lens.size(0);
  const int64_t Hq = q.size(1), D = q.size(2), Hkv = k_cache.size(2), G = Hq / Hkv;
  // Split-K from shapes and the SM count only (attention_plan.h): no sync, graph-capturable.
  const DecodePlan plan = decode_plan(B, Hkv * ceil_div(G, decode_group_chunk(static_cast<int>(G))),
                                      decode_key_range(block_tables.size(1) * k_cache.size(1), sliding_window),
                                      partition_size, ctx.sm_count());
  const int64_t part = plan.part_size, P = plan.partitions;
  at::Tensor part_out, part_ml;
  if (P > 1) {
    part_out = at::empty({B, Hq, P, D}, q.options().dtype(at::kFloat));
    part_ml = at::empty({2, B, Hq, P}, q.options().dtype(at::kFloat));
  }
  MK_DISPATCH_FLOAT(q.scalar_type(), op, [&] {
    DecodeParams<kernel_t<scalar_t>> p{check::paged_cache_of<kernel_t<scalar_t>>(k_cache, v_cache, block_tables)};
    p.out = kptr<scalar_t>(out);
    p.q = kptr<scalar_t>(q);
    p.seq_lens = seq_lens.const_data_ptr<int32_t>();
    if (P > 1) {
      p.part_out = part_out.data_ptr<float>();
      p.part_m = part_ml.data_ptr<float>();
      p.part_l = p.part_m + B * Hq * P;
    }
    p.q_stride = q.stride(0);
    p.B = static_cast<int>(B);
    p.Hq = static_cast<int>(Hq);
    p.window = kernel_window(sliding_window, k_cache, block_tables);
    p.part_size = partition_size > 0 ? static_cast<int>(part) : 0;  // 0: sized per sequence in the kernel
    p.P = static_cast<int>(P);
    p.b0 = 0;
    p.scale = static_cast<float>(scale);
    check_attention_launch(launch_paged_decode(p, static_cast<int>(D), ctx.stream()), op);
  });
}

inline void paged_prefill_attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache,
                                    const at::Tensor& v_cache, const at::Tensor& block_tables,
                                    const at::Tensor& cu_seqlens_q, const at::Tensor& seq_lens, double scale,
                                    int64_t sliding_window) {
  constexpr const char* op = "paged_prefill_attention";
  backend::require_device(op, "q", q);
  check::attention_common_args(op, out, q, k_cache, v_cache, block_tables, seq_lens, scale, backend::kFloatTypes,
                               true);
  check::prefill_shape_args(op, q, cu_seqlens_q, seq_lens);
  check::prefill_out_args(op, out, cu_seqlens_q);
  check::cu_seqlens_cpu(op, cu_seqlens_q, seq_lens, q.size(0));  // emulated (CPU) index tensors
  check::paged_indices_cpu(op, k_cache, block_tables, seq_lens, sliding_window, cu_seqlens_q);
  if (out.numel() == 0) return;
  const int64_t B = seq_lens.size(0);
  backend::Context ctx(q);
  MK_DISPATCH_FLOAT(q.scalar_type(), op, [&] {
    PrefillParams<kernel_t<scalar_t>> p{check::paged_cache_of<kernel_t<scalar_t>>(k_cache, v_cache, block_tables)};
    p.out = kptr<scalar_t>(out);
    p.q = kptr<scalar_t>(q);
    p.cu_seqlens_q = cu_seqlens_q.const_data_ptr<int32_t>();
    p.seq_lens = seq_lens.const_data_ptr<int32_t>();
    p.q_stride = q.stride(0);
    p.Hq = static_cast<int>(q.size(1));
    p.window = kernel_window(sliding_window, k_cache, block_tables);
    p.scale = static_cast<float>(scale);
    // fp16 / bf16: the tensor-core kernel (paged_prefill_tc.cuh); fp32 and its fallback rule: the SIMT one
    const int D = static_cast<int>(q.size(2));
    const bool tc = paged_prefill_tc_supported(p, D);
    const size_t smem = prefill_smem_bytes<kernel_t<scalar_t>>(D);
    TORCH_CHECK(tc || smem <= static_cast<size_t>(ctx.max_smem_per_block()), op, ": ", q.scalar_type(),
                " with head_dim ", D, " needs ", smem / 1024, " KiB of shared memory per block, this GPU allows ",
                ctx.max_smem_per_block() / 1024, " KiB (sm_86 / sm_89: 99 KiB); use bfloat16 or float16 (the "
                "tensor-core kernel) or a GPU with more shared memory (A100, H100)");
    check_attention_launch(tc ? launch_paged_prefill_tc(p, q.size(0), static_cast<int>(B), D, ctx.stream())
                               : launch_paged_prefill(p, q.size(0), static_cast<int>(B), D, ctx.stream()),
                           op);
  });
}

}  // namespace mk::inline MK_ABI::glue
