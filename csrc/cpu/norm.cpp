// cpu/norm.cpp — native CPU rms_norm, fused_add_rms_norm, silu_and_mul (MK_NORM_OPS; fp32, bf16, fp16): the
// argument checks and the split of the rows over threads (at::parallel_for); the row loops are per-ISA
// kernels (csrc/cpu/isa/norm.cpp). Shapes: R rows, H hidden, I intermediate.
#include <torch/library.h>

#include "../checks/norm.h"
#include "common.h"
#include "isa/norm.h"
#include "isa_dispatch.h"

namespace mk::cpu {
namespace {

// rms_norm over rows of H (residual null) or fused_add_rms_norm (residual: the fused sum, in place).
void rms_rows(void* out, void* residual, const at::Tensor& x, const at::Tensor& weight, double eps) {
  const int64_t H = x.size(-1), rows = H == 0 ? 0 : x.numel() / H;
  const auto kernel = MK_ISA_CALL(rms_norm_rows);
  const Elem elem = elem_of(x.scalar_type());
  const void* xp = x.const_data_ptr();
  const void* wp = weight.const_data_ptr();
  // work per row: 2 per element (the sum of squares, the scaling)
  at::parallel_for(0, rows, parallel_grain(2 * H), [&](int64_t r0, int64_t r1) {
    kernel(elem, out, residual, xp, wp, r0, r1, H, static_cast<float>(eps));
  });
}

void rms_norm(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight, double eps) {
  constexpr const char* op = "rms_norm";
  require_cpu(op, "x", x);
  check::rms_norm_args(op, "out", out, x, weight, kFloatTypes, true);
  rms_rows(out.data_ptr(), nullptr, x, weight, eps);
}

void fused_add_rms_norm(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps) {
  constexpr const char* op = "fused_add_rms_norm";
  require_cpu(op, "x", x);
  check::rms_norm_args(op, "residual", residual, x, weight, kFloatTypes, false);
  rms_rows(x.data_ptr(), residual.data_ptr(), x, weight, eps);
}

void silu_and_mul(at::Tensor& out, const at::Tensor& x) {
  constexpr const char* op = "silu_and_mul";
  require_cpu(op, "x", x);
  check::silu_and_mul_args(op, out, x, kFloatTypes);
  const int64_t I = out.size(-1), rows = I == 0 ? 0 : out.numel() / I;
  const auto kernel = MK_ISA_CALL(silu_mul_rows);
  const Elem elem = elem_of(x.scalar_type());
  const char* gate = static_cast<const char*>(x.const_data_ptr());
  const void* up = gate + I * x.element_size();
  void* o = out.data_ptr();
  // work per row: 2 per output (silu, the product)
  at::parallel_for(0, rows, parallel_grain(2 * I), [&](int64_t r0, int64_t r1) {
    kernel(elem, o, I, gate, up, 2 * I, r0, r1, I);
  });
}

}  // namespace
}  // namespace mk::cpu

TORCH_LIBRARY_IMPL(mistral_kernels, CPU, m) { MK_NORM_OPS(MK_IMPL_CPU) }
