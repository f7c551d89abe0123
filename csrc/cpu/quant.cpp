// cpu/quant.cpp — native CPU qlinear (MK_QUANT_OPS): out[M, N] = x[M, K] · W[N, K]ᵀ with W in a quantized
// format (csrc/kernels/quant_blocks.h). x / out fp32, bf16 or fp16; fp32 accumulation. The kernels are
// csrc/cpu/quant_kernels.h (framework-free); this file checks arguments, converts and picks the path:
//   M ≤ kGemvMaxM (decode): the GEMV kernels, parallel over N (at::parallel_for); bf16 x takes the int8 (VNNI)
//     or bf16 dot-product paths where the CPU and format have them, anything else the fp32 decoding (x converted
//     to fp32 once, M·K elements). Results are written once in out's dtype. Bound: memory — the packed bytes
//     N·R per call at copy bandwidth.
//   M > kGemvMaxM (prefill): parallel over tiles of W's rows (about kTileBytes each): a task dequantizes a tile
//     into its own buffer as fp32 (bf16 when x is bf16: the weights are then rounded to bf16 like a dense bf16
//     model's, and the GEMM runs at the bf16 rate) and multiplies it by x with ATen's GEMM (at::mm, one thread
//     inside the parallel region).
//     Bound: the GEMM's FLOPs, 2·M·N·K; the dequantization adds N·K element stores per call.
// Accuracy of each path: csrc/cpu/quant_kernels.h; tests/test_quant_linear.py checks the bounds.
#include <torch/library.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>

#include <vector>

#include "../checks/quant.h"
#include "common.h"
#include "quant_kernels.h"

namespace mk::cpu {
namespace {

constexpr int64_t kGemvMaxM = 16;               // the decode path up to this many rows of x
constexpr int64_t kTileBytes = int64_t{1} << 20;  // a dequantized W tile of the prefill path (L2-sized)

// Rows [n0, n1) of W, dequantized into dst (fp32 or bf16 bits).
template <typename OUT>
void dequant_tile(int64_t qtype, const at::Tensor& qweight, const std::optional<at::Tensor>& scales, int64_t K,
                  int64_t n0, int64_t n1, OUT* dst) {
  if (qtype == kInt8Rowwise) {
    quant::dequant_rows_i8(qweight.const_data_ptr<int8_t>(), scales->const_data_ptr<float>(), K, n0, n1, dst);
    return;
  }
  const uint8_t* w = qweight.const_data_ptr<uint8_t>();
  with_block_qtype(static_cast<int32_t>(qtype), [&]<int32_t QT>() { quant::dequant_rows<QT, OUT>(w, K, n0, n1, dst); });
}

// The decode path used for bf16 x with format QT (quant_kernels.h): activations quantized to int8 per 32
// (VNNI), the codes' exact bf16 dot products (AVX512-BF16), or fp32 decoding (x converted to fp32).
enum class Bf16Path { kInt8, kBf16, kFp32 };
template <int32_t QT>
constexpr Bf16Path bf16_path() {
#if defined(MK_QUANT_VNNI)
  if constexpr (quant::kInt8Dot<QT>) return Bf16Path::kInt8;
#endif
#if defined(MK_QUANT_BF16_DOT)
  if constexpr (quant::kBf16Dot<QT>) return Bf16Path::kBf16;
#endif
  return Bf16Path::kFp32;
}

// Per-thread scratch of the decode path (the quantized / summed activations), grown on demand: no tensor
// allocation per call (decode calls are ~10 us at SmolLM2 sizes).
uint8_t* scratch(size_t bytes) {
  thread_local std::vector<uint8_t> buf;
  if (buf.size() < bytes) buf.resize(bytes);
  return buf.data();
}

// f(y) with y the output as fp32 or bf16 bits; fp16 out goes through a fp32 buffer.
template <typename F>
void with_out(at::Tensor& out, F&& f) {
  if (out.scalar_type() == at::kFloat) {
    f(out.data_ptr<float>());
  } else if (out.scalar_type() == at::kBFloat16) {
    f(reinterpret_cast<uint16_t*>(out.data_ptr()));
  } else {
    at::Tensor yf = at::empty(out.sizes(), out.options().dtype(at::kFloat));
    f(yf.data_ptr<float>());
    out.copy_(yf);
  }
}

// y [M, N] for a block format QT and bf16 x through the int8 or bf16 dot products; false when this (QT, x dtype)
// has no such path (then fp32 decoding).
template <int32_t QT, typename OUT>
bool gemv_bf16_fast(const at::Tensor& x, const at::Tensor& qweight, OUT* yp, int64_t grain) {
  constexpr Bf16Path path = bf16_path<QT>();
  if (path == Bf16Path::kFp32 || x.scalar_type() != at::kBFloat16) return false;
  const int64_t M = x.size(0), K = x.size(1), N = qweight.size(0), nchunks = K / 32;
  const auto* xb = reinterpret_cast<const uint16_t*>(x.const_data_ptr());
  const uint8_t* w = qweight.const_data_ptr<uint8_t>();
  // per chunk of 32 activations: (int8 path) the scale dx and dx · Σ q, then the int8 x; (bf16 path) Σ x
  uint8_t* buf = scratch(static_cast<size_t>(2 * M * nchunks) * sizeof(float) + static_cast<size_t>(M * K));
  float* s0 = reinterpret_cast<float*>(buf);
  float* s1 = s0 + M * nchunks;
  [[maybe_unused]] int8_t* xq = reinterpret_cast<int8_t*>(s1 + M * nchunks);
#if defined(MK_QUANT_VNNI)
  if constexpr (path == Bf16Path::kInt8) {
    quant::quantize_x_q8<true>(xb, M, K, xq, s0, s1);
    at::parallel_for(0, N, grain,
                     [&](int64_t n0, int64_t n1) { quant::gemv_rows_q8<QT>(w, K, xq, s0, s1, M, yp, N, n0, n1); });
    return true;
  }
#endif
#if defined(MK_QUANT_BF16_DOT)
  if constexpr (path == Bf16Path::kBf16) {
    quant::chunk_sums_bf16(xb, M, K, s0);
    at::parallel_for(0, N, grain,
                     [&](int64_t n0, int64_t n1) { quant::gemv_rows_bf16<QT>(w, K, xb, s0, M, yp, N, n0, n1); });
    return true;
  }
#endif
  (void)xb, (void)w;
  return false;
}

void qlinear_gemv(at::Tensor& out, const at::Tensor& x, const at::Tensor& qweight,
                  const std::optional<at::Tensor>& scales, int64_t qtype, const QFormat& f) {
  const int64_t M = x.size(0), K = x.size(1), N = qweight.size(0);
  // work per output column: its packed bytes plus M·K multiply-adds; at least 4 columns per task.
  const int64_t row_bytes = qtype == kInt8Rowwise ? K : K / f.block * f.bytes;
  const int64_t grain = parallel_grain(row_bytes + M * K, 4);
  with_out(out, [&](auto* yp) {
    bool done = false;
    with_block_qtype(static_cast<int32_t>(qtype),
                     [&]<int32_t QT>() { done = gemv_bf16_fast<QT>(x, qweight, yp, grain); });
    if (done) return;
    const at::Tensor xf = x.scalar_type() == at::kFloat ? x : x.to(at::kFloat);
    const float* xp = xf.const_data_ptr<float>();
    if (qtype == kInt8Rowwise) {
      const int8_t* w = qweight.const_data_ptr<int8_t>();
      const float* s = scales->const_data_ptr<float>();
      at::parallel_for(0, N, grain,
                       [&](int64_t n0, int64_t n1) { quant::gemv_rows_i8(w, s, K, xp, M, yp, N, n0, n1); });
    } else {
      const uint8_t* w = qweight.const_data_ptr<uint8_t>();
      with_block_qtype(static_cast<int32_t>(qtype), [&]<int32_t QT>() {
        at::parallel_for(0, N, grain,
                         [&](int64_t n0, int64_t n1) { quant::gemv_rows<QT>(w, K, xp, M, yp, N, n0, n1); });
      });
    }
  });
}

void qlinear_gemm(at::Tensor& out, const at::Tensor& x, const at::Tensor& qweight,
                  const std::optional<at::Tensor>& scales, int64_t qtype) {
  const int64_t M = x.size(0), K = x.size(1), N = qweight.size(0);
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  const at::Tensor xg = bf16 || x.scalar_type() == at::kFloat ? x : x.to(at::kFloat);
  const int64_t elt = bf16 ? 2 : 4;
  // rows per tile: about kTileBytes, a multiple of 16, and at least one tile per thread
  const int64_t per_thread = (N + at::get_num_threads() - 1) / at::get_num_threads();
  const int64_t nt = std::min<int64_t>(std::max<int64_t>(16, kTileBytes / (K * elt) / 16 * 16), per_thread);
  const int64_t ntiles = (N + nt - 1) / nt;
  // Each task dequantizes its tiles into its own buffer and multiplies them by x with a single-threaded GEMM
  // (at::mm inside a parallel region): one parallel region per call, each tile used from the thread's L2.
  at::parallel_for(0, ntiles, 1, [&](int64_t t0, int64_t t1) {
    at::Tensor tile = at::empty({nt, K}, x.options().dtype(bf16 ? at::kBFloat16 : at::kFloat));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n0 = t * nt, n1 = std::min(N, n0 + nt), rows = n1 - n0;
      if (bf16)
        dequant_tile(qtype, qweight, scales, K, n0, n1, reinterpret_cast<uint16_t*>(tile.data_ptr()));
      else
        dequant_tile(qtype, qweight, scales, K, n0, n1, tile.data_ptr<float>());
      out.narrow(1, n0, rows).copy_(at::mm(xg, tile.narrow(0, 0, rows).t()));
    }
  });
}

void qlinear(at::Tensor& out, const at::Tensor& x, const at::Tensor& qweight, const std::optional<at::Tensor>& scales,
             int64_t qtype) {
  constexpr const char* op = "qlinear";
  require_cpu(op, "x", x);
  const QFormat f = check::qlinear_args(op, out, x, qweight, scales, qtype, {at::kFloat, at::kBFloat16, at::kHalf});
  const int64_t M = x.size(0), K = x.size(1), N = qweight.size(0);
  if (M == 0 || N == 0) return;
  if (K == 0) {
    out.zero_();
    return;
  }
  if (M <= kGemvMaxM)
    qlinear_gemv(out, x, qweight, scales, qtype, f);
  else
    qlinear_gemm(out, x, qweight, scales, qtype);
}

}  // namespace
}  // namespace mk::cpu

TORCH_LIBRARY_IMPL(mistral_kernels, CPU, m) { MK_QUANT_OPS(MK_IMPL_CPU) }
