// glue/norm.h — rms_norm, fused_add_rms_norm, silu_and_mul for the CUDA and emulated backends.
// Shapes: H hidden, I intermediate; leading dims flattened to R rows.
#pragma once

#include "../checks/norm.h"
#include "../kernels/activation.cuh"
#include "../kernels/norm.cuh"
#include "common.h"

namespace mk::inline MK_ABI::glue {

// out [..., H] = rms_norm(x [..., H]) * weight [H]
inline void rms_norm(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight, double eps) {
  constexpr const char* op = "rms_norm";
  backend::require_device(op, "x", x);
  check::rms_norm_args(op, "out", out, x, weight, backend::kFloatTypes, true);
  backend::Context ctx(x);
  const int64_t H = x.size(-1), rows = H == 0 ? 0 : x.numel() / H;
  MK_DISPATCH_FLOAT(x.scalar_type(), op, [&] {
    check_launch(launch_rms_norm<kernel_t<scalar_t>, false>(kptr<scalar_t>(out), nullptr, kptr<scalar_t>(x),
                                                            kptr<scalar_t>(weight), rows, H,
                                                            static_cast<float>(eps), ctx.stream()),
                 op);
  });
}

// residual [..., H] += x; x = rms_norm(residual) * weight   (in place on both)
inline void fused_add_rms_norm(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps) {
  constexpr const char* op = "fused_add_rms_norm";
  backend::require_device(op, "x", x);
  check::rms_norm_args(op, "residual", residual, x, weight, backend::kFloatTypes, false);
  backend::Context ctx(x);
  const int64_t H = x.size(-1), rows = H == 0 ? 0 : x.numel() / H;
  MK_DISPATCH_FLOAT(x.scalar_type(), op, [&] {
    check_launch(launch_rms_norm<kernel_t<scalar_t>, true>(kptr<scalar_t>(x), kptr<scalar_t>(residual),
                                                           kptr<scalar_t>(x), kptr<scalar_t>(weight), rows, H,
                                                           static_cast<float>(eps), ctx.stream()),
                 op);
  });
}

// out [..., I] = silu(x[..., :I]) * x[..., I:]
inline void silu_and_mul(at::Tensor& out, const at::Tensor& x) {
  constexpr const char* op = "silu_and_mul";
  backend::require_device(op, "x", x);
  check::silu_and_mul_args(op, out, x, backend::kFloatTypes);
  backend::Context ctx(x);
  const int64_t I = out.size(-1), rows = I == 0 ? 0 : out.numel() / I;
  constexpr int64_t kMaxRows = 65535;  // grid.y limit: launch in chunks of rows
  MK_DISPATCH_FLOAT(x.scalar_type(), op, [&] {
    for (int64_t r0 = 0; r0 < rows; r0 += kMaxRows) {
      const int64_t n = std::min(kMaxRows, rows - r0);
      check_launch(launch_silu_and_mul(kptr<scalar_t>(out) + r0 * I, kptr<scalar_t>(x) + r0 * 2 * I, n, I,
                                       ctx.stream()),
                   op);
    }
  });
}

}  // namespace mk::inline MK_ABI::glue
