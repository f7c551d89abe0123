// cpu/linear.cpp — skinny_linear: out[M, N] = x[M, K] · W[N, K]ᵀ for small M (decode: M = batch ≤ 16).
//
// Decode matmuls are memory-bound GEMVs: every weight byte is read once per step. This glue checks the
// arguments and splits the output columns over threads (at::parallel_for); the per-ISA GEMV core
// (csrc/cpu/isa/gemv.cpp, shared with the fused decode step) streams W exactly once per call for any M ≤ 16.
// Results do not depend on the thread count.
// Prefill-sized M goes to ATen's GEMM (the Python wrapper `ops.linear` picks).
#include <torch/library.h>

#include "../checks/common.h"
#include "common.h"
#include "isa/gemv.h"
#include "isa_dispatch.h"

namespace mk::cpu {
namespace {

constexpr int64_t kMaxM = kGemvMaxM;

void skinny_linear(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight) {
  constexpr const char* op = "skinny_linear";
  require_cpu(op, "x", x);
  check::dtype_in(op, "x", x, kFloatTypes);
  check::same_dtype(op, "weight", weight, "x", x);
  check::same_dtype(op, "out", out, "x", x);
  check::same_device(op, "weight", weight, "x", x);
  check::same_device(op, "out", out, "x", x);
  check::ndim(op, "x", x, 2, "[M, K]");
  check::ndim(op, "weight", weight, 2, "[N, K]");
  check::ndim(op, "out", out, 2, "[M, N]");
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  TORCH_CHECK(M <= kMaxM, op, ": x.shape[0] (M) must be <= ", kMaxM, " (use a GEMM for larger batches), got ", M);
  check::size_eq(op, "weight", weight, 1, K, "K = x.shape[1]");
  check::size_eq(op, "out", out, 0, M, "M = x.shape[0]");
  check::size_eq(op, "out", out, 1, N, "N = weight.shape[0]");
  check::contiguous(op, "x", x);
  check::contiguous(op, "weight", weight);
  check::contiguous(op, "out", out);
  check::no_overlap(op, "out", out, {{"x", &x}, {"weight", &weight}});
  if (M == 0 || N == 0) return;
  if (K == 0) {
    out.zero_();
    return;
  }
  // work per output column: the bytes of its weight row; at least 16 columns per task.
  const int64_t grain = parallel_grain(K * static_cast<int64_t>(x.element_size()), 16);
  const auto kernel = MK_ISA_CALL(gemv_rows);
  const Elem elem = elem_of(x.scalar_type());
  const void* xp = x.const_data_ptr();
  const void* wp = weight.const_data_ptr();
  void* op_ = out.data_ptr();
  at::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) { kernel(elem, op_, N, xp, K, wp, K, M, n0, n1); });
}

}  // namespace
}  // namespace mk::cpu

// CPU only (csrc/registration.cpp kCpuOnlySchemas): one op, no family list.
TORCH_LIBRARY_IMPL(mistral_kernels, CPU, m) { MK_IMPL_CPU(skinny_linear) }
