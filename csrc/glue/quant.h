// glue/quant.h — qlinear for the CUDA and emulated backends (MK_QUANT_OPS, csrc/checks/quant.h).
// Shapes: M rows, K in features, N out features. M ≤ kGemvMaxRows (decode) runs the GEMV of
// kernels/quant_gemv.cuh — for fp16 / bf16 x its int8-activation path (x quantized once per call into a
// workspace, dp4a; error bound in kernels/quant_q8x.cuh), for fp32 x the exact one — up to kQGemmDequantRows
// the tile GEMM of kernels/quant_gemm.cuh (K split over the SMs by qgemm_plan, partial sums in an fp32
// workspace, reduced in a fixed order), above W dequantized once to x's dtype and a dense GEMM (at::mm_out:
// cuBLAS on the GPU, the CPU's GEMM under the emulator).
#pragma once

#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>

#include <optional>

#include "../checks/quant.h"
#include "../kernels/quant_gemm.cuh"
#include "../kernels/quant_gemv.cuh"
#include "common.h"

namespace mk::inline MK_ABI::glue {

// out [M, N] = x [M, K] · Wᵀ, W [N, K] quantized (qweight, scales, qtype: checks/quant.h).
inline void qlinear(at::Tensor& out, const at::Tensor& x, const at::Tensor& qweight,
                    const std::optional<at::Tensor>& scales, int64_t qtype) {
  constexpr const char* op = "qlinear";
  backend::require_device(op, "x", x);
  check::qlinear_args(op, out, x, qweight, scales, qtype, backend::kFloatTypes);
  backend::Context ctx(x);
  const int64_t M = x.size(0), K = x.size(1), N = qweight.size(0);
  if (M == 0 || N == 0) return;
  if (K == 0) {
    out.zero_();
    return;
  }
  const at::Tensor w = aligned_or_copy(qweight, 4);  // the unit loads (quant_blocks.h, kUnitAlign)
  const auto* wp = static_cast<const uint8_t*>(w.data_ptr());
  const float* sp = qtype == kInt8Rowwise ? scales->data_ptr<float>() : nullptr;
  const int32_t qt = static_cast<int32_t>(qtype);
  MK_DISPATCH_FLOAT(x.scalar_type(), op, [&] {
    using T = kernel_t<scalar_t>;
    auto run = [&]<int32_t QT>() {
      if (M > kQGemmDequantRows) {  // W decoded once to x's dtype, then the dense GEMM (cuBLAS on the GPU)
        at::Tensor wd = at::empty({N, K}, x.options());
        check_launch(launch_quant_dequantize<T, QT>(kptr<scalar_t>(wd), wp, sp, N, K, ctx.stream()), op);
        at::mm_out(out, x, wd.t());
        return;
      }
      if (!quant_gemv_rows(M)) {  // the tile GEMM, K split over the SMs (qgemm_plan, kernels/quant_gemm.cuh)
        const at::Tensor xa = QT == kInt8Rowwise ? x : aligned_or_copy(x, 16);  // its x copies: 16-byte vectors
        const QGemmPlan plan = qgemm_plan(M, N, K, ctx.sm_count());
        at::Tensor ws;
        if (plan.splits > 1) ws = at::empty({plan.workspace_floats}, x.options().dtype(at::kFloat));
        check_launch(launch_quant_gemm<T, QT>(kptr<scalar_t>(out), kptr<scalar_t>(xa), wp, sp, M, N, K, ctx.stream(),
                                              plan, ws.defined() ? ws.data_ptr<float>() : nullptr),
                     op);
        return;
      }
      // fp16 / bf16 x: the int8-activation GEMV (kernels/quant_q8x.cuh: x quantized once into the workspace)
      at::Tensor ws;
      if (quant_gemv_q8_ok<T, QT>(wp)) ws = at::empty({q8x_workspace_bytes(M, K)}, x.options().dtype(at::kByte));
      check_launch(launch_quant_gemv<T, QT>(kptr<scalar_t>(out), kptr<scalar_t>(x), wp, sp, M, N, K, ctx.stream(),
                                            ws.defined() ? ws.data_ptr() : nullptr),
                   op);
    };
    if (qt == kInt8Rowwise) run.template operator()<kInt8Rowwise>();
    else TORCH_CHECK(with_block_qtype(qt, run), op, ": qtype ", qtype, " has no kernel");
  });
}

}  // namespace mk::inline MK_ABI::glue
