// glue/quant.h — qlinear for the CUDA and emulated backends (MK_QUANT_OPS, csrc/checks/quant.h).
// Shapes: M rows, K in features, N out features. M ≤ kGemvMaxRows (decode) runs the GEMV of
// kernels/quant_gemv.cuh, larger M the tile GEMM of kernels/quant_gemm.cuh.
#pragma once

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
  // The unit loads need the packed rows 4-byte aligned (quant_blocks.h, kUnitAlign); a view at an odd
  // offset (e.g. a slice of a memory-mapped file) is copied, at every call: loaders keep packed weights aligned.
  const at::Tensor w = reinterpret_cast<uintptr_t>(qweight.data_ptr()) % 4 == 0 ? qweight : qweight.clone();
  const auto* wp = static_cast<const uint8_t*>(w.data_ptr());
  const float* sp = qtype == kInt8Rowwise ? scales->data_ptr<float>() : nullptr;
  const int32_t qt = static_cast<int32_t>(qtype);
  MK_DISPATCH_FLOAT(x.scalar_type(), op, [&] {
    using T = kernel_t<scalar_t>;
    auto run = [&]<int32_t QT>() {
      const cudaError_t err =
          quant_gemv_rows(M) ? launch_quant_gemv<T, QT>(kptr<scalar_t>(out), kptr<scalar_t>(x), wp, sp, M, N, K,
                                                         ctx.stream())
                             : launch_quant_gemm<T, QT>(kptr<scalar_t>(out), kptr<scalar_t>(x), wp, sp, M, N, K,
                                                         ctx.stream());
      check_launch(err, op);
    };
    if (qt == kInt8Rowwise) run.template operator()<kInt8Rowwise>();
    else TORCH_CHECK(with_block_qtype(qt, run), op, ": qtype ", qtype, " has no kernel");
  });
}

}  // namespace mk::inline MK_ABI::glue
