// cpu/norm.cpp — native CPU rms_norm, fused_add_rms_norm, silu_and_mul (MK_NORM_OPS; fp32, bf16).
// Shapes: R rows, H hidden, I intermediate. Parallel over rows (at::parallel_for); inner loops are
// plain fp32 loops the compiler vectorises. Same rounding as the CUDA kernels (csrc/kernels/norm.cuh):
// the fused residual sum is rounded to the dtype once, stored, and that stored value is normalised.
#include <torch/library.h>

#include "../checks/norm.h"
#include "common.h"
#include "row_ops.h"

namespace mk::cpu {
namespace {

template <typename T, bool FUSED_ADD>
void rms_norm_rows(T* out, T* residual, const T* x, const T* w, int64_t rows, int64_t H, float eps) {
  // work per row: 2 per element (the sum of squares, the scaling)
  at::parallel_for(0, rows, parallel_grain(2 * H), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      T* rr = FUSED_ADD ? residual + r * H : nullptr;
      rowops::add_rms_norm(out + r * H, rr, x + r * H, rr, w, H, eps);
    }
  });
}

void rms_norm(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight, double eps) {
  constexpr const char* op = "rms_norm";
  require_cpu(op, "x", x);
  check::rms_norm_args(op, "out", out, x, weight, kFloatTypes, true);
  const int64_t H = x.size(-1), rows = H == 0 ? 0 : x.numel() / H;
  MK_CPU_DISPATCH(x.scalar_type(), op, [&] {
    rms_norm_rows<scalar_t, false>(out.data_ptr<scalar_t>(), nullptr, x.const_data_ptr<scalar_t>(),
                                   weight.const_data_ptr<scalar_t>(), rows, H, static_cast<float>(eps));
  });
}

void fused_add_rms_norm(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps) {
  constexpr const char* op = "fused_add_rms_norm";
  require_cpu(op, "x", x);
  check::rms_norm_args(op, "residual", residual, x, weight, kFloatTypes, false);
  const int64_t H = x.size(-1), rows = H == 0 ? 0 : x.numel() / H;
  MK_CPU_DISPATCH(x.scalar_type(), op, [&] {
    rms_norm_rows<scalar_t, true>(x.data_ptr<scalar_t>(), residual.data_ptr<scalar_t>(), x.const_data_ptr<scalar_t>(),
                                  weight.const_data_ptr<scalar_t>(), rows, H, static_cast<float>(eps));
  });
}

void silu_and_mul(at::Tensor& out, const at::Tensor& x) {
  constexpr const char* op = "silu_and_mul";
  require_cpu(op, "x", x);
  check::silu_and_mul_args(op, out, x, kFloatTypes);
  const int64_t I = out.size(-1), rows = I == 0 ? 0 : out.numel() / I;
  MK_CPU_DISPATCH(x.scalar_type(), op, [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    scalar_t* op_ = out.data_ptr<scalar_t>();
    // work per row: 2 per output (silu, the product)
    at::parallel_for(0, rows, parallel_grain(2 * I), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const scalar_t* a = xp + r * 2 * I;
        rowops::silu_mul(op_ + r * I, a, a + I, I);
      }
    });
  });
}

}  // namespace
}  // namespace mk::cpu

TORCH_LIBRARY_IMPL(mistral_kernels, CPU, m) { MK_NORM_OPS(MK_IMPL_CPU) }
