// cpu/linear.cpp — skinny_linear: out[M, N] = x[M, K] · W[N, K]ᵀ on dense CPU weights (`ops.linear` calls it for
// decode-sized inputs of every float dtype and for fp32 inputs of any size).
//
// M ≤ kMaxM (decode: M = batch): decode matmuls are memory-bound GEMVs, every weight byte read once per step;
// the output columns are split over threads (at::parallel_for) and the per-ISA GEMV core (csrc/cpu/isa/gemv.cpp,
// shared with the fused decode step) streams W exactly once per call for any M ≤ 16.
// M > kMaxM, fp32 at a level with the fp32 tile kernel (AVX-512F): qlinear's prefill GEMM on a dense W —
// x packed once per call, W read in place in tiles of ≤ kTileBytes (L2) split evenly over the threads
// (isa/quant_tiles.h; measured 10–25 % faster than ATen's GEMM at SmolLM2's shapes,
// benchmarks/results/cpu_llamacpp.md). Each output is one fp32 FMA chain over k: the result depends neither on
// M nor on the thread count. Otherwise (16-bit x, other levels) ATen's GEMM.
#include <torch/library.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>

#include "../checks/common.h"
#include "common.h"
#include "isa/gemv.h"
#include "isa/quant_tiles.h"
#include "isa_dispatch.h"

namespace mk::cpu {
namespace {

constexpr int64_t kMaxM = kGemvMaxM;

// out = x · Wᵀ for fp32 x [M, K], M > kMaxM, by the fp32 tile kernel (the caller checked tile_gemm_supported).
void tile_linear(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight) {
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  at::Tensor xt = at::empty({MK_ISA_CALL(tile_x_bytes)(M, K) / 4}, x.options());
  const auto pack = MK_ISA_CALL(tile_pack_x);
  at::parallel_for(0, (M + 15) / 16, parallel_grain(16 * K, 1), [&](int64_t b0, int64_t b1) {
    pack(x.const_data_ptr<float>(), M, K, b0, b1, xt.data_ptr<float>());
  });
  const int64_t nt = equal_tile_rows(N, kTileBytes / (4 * K), 8), ntiles = (N + nt - 1) / nt;
  const auto gemm = MK_ISA_CALL(tile_gemm);
  const float* w = weight.const_data_ptr<float>();
  float* y = out.data_ptr<float>();
  at::parallel_for(0, ntiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n0 = t * nt, rows = std::min(N, n0 + nt) - n0;
      gemm(xt.const_data_ptr<float>(), M, K, w + n0 * K, rows, y + n0, N);
    }
  });
}

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
  if (M > kMaxM) {
    if (x.scalar_type() == at::kFloat && MK_ISA_CALL(tile_gemm_supported)()) {
      tile_linear(out, x, weight);
    } else {
      at::mm_out(out, x, weight.t());
    }
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
