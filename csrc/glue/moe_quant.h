// glue/moe_quant.h — moe_qgemm for the CUDA and emulated backends (MK_MOE_QUANT_OPS, csrc/checks/moe_quant.h).
// Shapes: M rows grouped by expert, G experts, N out features, K in features.
// Expected rows per expert ceil(M / G) ≤ 8 (decode): the grouped GEMV of kernels/moe_qgemm.cuh, gated in ONE
// launch (SwiGLU in its epilogue; fp16 / bf16 x on int8 activations); > 64 with fp16 / bf16 (moe_dequant_tc):
// the experts dequantized once + the tensor-core grouped GEMM of kernels/grouped_gemm_tc.cuh (gated fused);
// otherwise the grouped tile GEMM, gated as gate | up into h13 [M, 2N] (two launches) + silu_and_mul. The
// offsets stay on the device: no host sync.
#pragma once

#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <algorithm>
#include <optional>

#include "../checks/moe_quant.h"
#include "../kernels/activation.cuh"
#include "../kernels/grouped_gemm_tc.cuh"
#include "../kernels/moe_qgemm.cuh"
#include "common.h"

namespace mk::inline MK_ABI::glue {

// True when the prefill path dequantizes the experts once and runs the tensor-core grouped GEMM: fp16 / bf16,
// more than kQGemmDequantRows expected rows per expert (each expert's dequantization is then amortized over at
// least a 64-row tile, as qlinear's rule), and shapes grouped_gemm_tc takes (x, out rows 16-byte aligned, N
// even). Otherwise the fused 64 × 64 tile GEMM of kernels/moe_qgemm.cuh.
template <typename T>
inline bool moe_dequant_tc(const MoeQArgs<T>& p, bool gated) {
  if constexpr (!kTcType<T>) {
    return false;
  } else {
    if (ceil_div(p.M, p.G) <= kQGemmDequantRows) return false;
    // the dequantized stacks come from the allocator (16-byte aligned): stand-ins with x's alignment
    const GroupedGemmTcArgs<T> a{p.out, p.ldo, p.x, p.K, p.x, gated ? p.x : nullptr, p.offsets, p.G, p.M, p.N, p.K};
    return grouped_gemm_tc_supported(a);
  }
}

// out [M, N] per segment g of expert_offsets: x · W[g]ᵀ (plain), swiglu(x·W[g]ᵀ, x·W3[g]ᵀ) (up_qweight given);
// rows outside every segment are 0.
inline void moe_qgemm(at::Tensor& out, const at::Tensor& x, const at::Tensor& expert_offsets,
                      const at::Tensor& qweight, const std::optional<at::Tensor>& scales, int64_t qtype,
                      const std::optional<at::Tensor>& up_qweight, const std::optional<at::Tensor>& up_scales) {
  constexpr const char* op = "moe_qgemm";
  backend::require_device(op, "x", x);
  check::moe_qgemm_args(op, out, x, expert_offsets, qweight, scales, qtype, up_qweight, up_scales,
                        backend::kFloatTypes);
  backend::Context ctx(x);
  const int64_t M = x.size(0), K = x.size(1), G = qweight.size(0), N = qweight.size(1);
  const bool gated = up_qweight.has_value() && up_qweight->defined();
  if (M == 0 || N == 0) return;
  out.zero_();  // rows outside every segment (the kernels write only segment rows)
  if (K == 0 || G == 0) return;
  // the unit loads (quant_blocks.h, kUnitAlign)
  const at::Tensor w = aligned_or_copy(qweight, 4), w3 = gated ? aligned_or_copy(*up_qweight, 4) : at::Tensor();
  const bool int8 = qtype == kInt8Rowwise;
  const float* sp = int8 ? scales->const_data_ptr<float>() : nullptr;
  const float* sp3 = int8 && gated ? up_scales->const_data_ptr<float>() : nullptr;
  const auto* wp = static_cast<const uint8_t*>(w.const_data_ptr());
  const auto* wp3 = gated ? static_cast<const uint8_t*>(w3.const_data_ptr()) : nullptr;
  const int64_t* offs = expert_offsets.const_data_ptr<int64_t>();
  const int g = static_cast<int>(G);
  const int32_t qt = static_cast<int32_t>(qtype);
  const cudaStream_t stream = ctx.stream();
  MK_DISPATCH_FLOAT(x.scalar_type(), op, [&] {
    using T = kernel_t<scalar_t>;
    auto run = [&]<int32_t QT>() {
      const MoeQArgs<T> p{kptr<scalar_t>(out), N, kptr<scalar_t>(x), wp, wp3, sp, sp3, offs, g, M, N, K};
      if (moe_qgemv_rows(M, G)) {  // fp16 / bf16 x: the int8-activation body (x quantized once into ws)
        at::Tensor ws;
        if (moe_qgemv_q8_ok<T, QT>(p)) ws = at::empty({q8x_workspace_bytes(M, K)}, x.options().dtype(at::kByte));
        check_launch(launch_moe_qgemv<T, QT>(p, stream, ws.defined() ? ws.data_ptr() : nullptr), op);
      } else if (moe_dequant_tc<T>(p, gated)) {
        // fp16 / bf16, > kQGemmDequantRows rows per expert: every expert's W (and W3) dequantized once to T, then
        // the tensor-core grouped GEMM (gated: SwiGLU in its epilogue, no h13)
        const auto dequantized = [&](const uint8_t* q, const float* sc) {
          at::Tensor wd = at::empty({G, N, K}, x.options());
          check_launch(launch_quant_dequantize<T, QT>(kptr<scalar_t>(wd), q, sc, G * N, K, stream), op);
          return wd;
        };
        const at::Tensor wd = dequantized(wp, sp), wd3 = gated ? dequantized(wp3, sp3) : at::Tensor();
        const GroupedGemmTcArgs<T> a{kptr<scalar_t>(out), N, kptr<scalar_t>(x), K, kptr<scalar_t>(wd),
                                     gated ? kptr<scalar_t>(wd3) : nullptr, offs, g, M, N, K};
        check_launch(launch_grouped_gemm_tc(a, ceil_div(M, G), stream), op);
      } else {
        const at::Tensor xa = QT == kInt8Rowwise ? x : aligned_or_copy(x, 16);  // the tile GEMM's x: 16-byte vectors
        MoeQArgs<T> q = p;
        q.x = kptr<scalar_t>(xa);
        if (!gated) {
          check_launch(launch_moe_qgemm<T, QT>(q, stream), op);
          return;
        }
        at::Tensor h13 = at::zeros({M, 2 * N}, x.options());  // rows outside every segment stay 0
        T* h = kptr<scalar_t>(h13);
        const MoeQArgs<T> gate{h, 2 * N, q.x, wp, nullptr, sp, nullptr, offs, g, M, N, K};
        const MoeQArgs<T> up{h + N, 2 * N, q.x, wp3, nullptr, sp3, nullptr, offs, g, M, N, K};
        check_launch(launch_moe_qgemm<T, QT>(gate, stream), op);
        check_launch(launch_moe_qgemm<T, QT>(up, stream), op);
        constexpr int64_t kMaxRows = 65535;  // silu_and_mul grid.y
        for (int64_t r0 = 0; r0 < M; r0 += kMaxRows)
          check_launch(launch_silu_and_mul(p.out + r0 * N, h + r0 * 2 * N, std::min(kMaxRows, M - r0), N, stream), op);
      }
    };
    if (qt == kInt8Rowwise) run.template operator()<kInt8Rowwise>();
    else TORCH_CHECK(with_block_qtype(qt, run), op, ": qtype ", qtype, " has no kernel");
  });
}

}  // namespace mk::inline MK_ABI::glue
