// cpu/quant.cpp — native CPU qlinear (MK_QUANT_OPS): out[M, N] = x[M, K] · W[N, K]ᵀ with W in a quantized
// format (csrc/kernels/quant_blocks.h). x / out fp32, bf16 or fp16; fp32 accumulation. The kernels are
// csrc/cpu/quant_kernels.h (framework-free); this file checks arguments, converts and picks the path:
//   M ≤ kGemvMaxM (decode): gemv_rows, parallel over N (at::parallel_for). x is converted to fp32 once
//     (M·K elements, small); the result is written in fp32 and rounded once to out's dtype.
//     Bound: memory — the packed bytes N·R per call at copy bandwidth.
//   M > kGemvMaxM (prefill): W is dequantized one tile of rows at a time (about kTileBytes, in parallel over
//     the tile's rows) into fp32 (bf16 when x is bf16: the weights are then rounded to bf16 like a dense bf16
//     model's, and the GEMM runs at the bf16 rate) and multiplied by ATen's GEMM (at::mm, multi-threaded).
//     Bound: the GEMM's FLOPs, 2·M·N·K; the dequantization adds N·K element stores per call.
#include <torch/library.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>

#include "../checks/quant.h"
#include "common.h"
#include "quant_kernels.h"

namespace mk::cpu {
namespace {

constexpr int64_t kGemvMaxM = 16;               // the decode path up to this many rows of x
constexpr int64_t kTileBytes = int64_t{8} << 20;  // the dequantized W tile of the prefill path

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

// y [M, N] fp32 for a block format QT; false when this (QT, x dtype) has no special path (then fp32 decoding).
template <int32_t QT>
bool gemv_bf16_fast(const at::Tensor& x, const at::Tensor& qweight, float* yp, int64_t grain) {
  constexpr Bf16Path path = bf16_path<QT>();
  if (path == Bf16Path::kFp32 || x.scalar_type() != at::kBFloat16) return false;
  const int64_t M = x.size(0), K = x.size(1), N = qweight.size(0), nchunks = K / 32;
  const auto* xb = reinterpret_cast<const uint16_t*>(x.const_data_ptr());
  const uint8_t* w = qweight.const_data_ptr<uint8_t>();
  // per chunk of 32 activations: (int8 path) the scale dx and dx · Σ q; (bf16 path) Σ x
  const at::Tensor sums = at::empty({2, M, nchunks}, x.options().dtype(at::kFloat));
  float* s0 = sums.data_ptr<float>();
  float* s1 = s0 + M * nchunks;
#if defined(MK_QUANT_VNNI)
  if constexpr (path == Bf16Path::kInt8) {
    const at::Tensor xq = at::empty({M, K}, x.options().dtype(at::kChar));
    int8_t* xqp = xq.data_ptr<int8_t>();
    quant::quantize_x_q8<true>(xb, M, K, xqp, s0, s1);
    at::parallel_for(0, N, grain,
                     [&](int64_t n0, int64_t n1) { quant::gemv_rows_q8<QT>(w, K, xqp, s0, s1, M, yp, N, n0, n1); });
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
  (void)s1, (void)xb, (void)w;
  return false;
}

void qlinear_gemv(at::Tensor& out, const at::Tensor& x, const at::Tensor& qweight,
                  const std::optional<at::Tensor>& scales, int64_t qtype, const QFormat& f) {
  const int64_t M = x.size(0), K = x.size(1), N = qweight.size(0);
  at::Tensor yf = out.scalar_type() == at::kFloat ? out : at::empty({M, N}, x.options().dtype(at::kFloat));
  float* yp = yf.data_ptr<float>();
  // work per output column: its packed bytes plus M·K multiply-adds; at least 4 columns per task.
  const int64_t row_bytes = qtype == kInt8Rowwise ? K : K / f.block * f.bytes;
  const int64_t grain = parallel_grain(row_bytes + M * K, 4);
  bool done = false;
  with_block_qtype(static_cast<int32_t>(qtype), [&]<int32_t QT>() { done = gemv_bf16_fast<QT>(x, qweight, yp, grain); });
  if (!done) {
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
  }
  if (!yf.is_same(out)) out.copy_(yf);
}

void qlinear_gemm(at::Tensor& out, const at::Tensor& x, const at::Tensor& qweight,
                  const std::optional<at::Tensor>& scales, int64_t qtype) {
  const int64_t M = x.size(0), K = x.size(1), N = qweight.size(0);
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  const at::Tensor xg = bf16 || x.scalar_type() == at::kFloat ? x : x.to(at::kFloat);
  const int64_t elt = bf16 ? 2 : 4;
  const int64_t nt = std::min<int64_t>(N, std::max<int64_t>(16, kTileBytes / (K * elt) / 16 * 16));
  at::Tensor tile = at::empty({nt, K}, x.options().dtype(bf16 ? at::kBFloat16 : at::kFloat));
  at::Tensor y = at::empty({M, nt}, xg.options());
  const int64_t grain = parallel_grain(K, 1);
  for (int64_t n0 = 0; n0 < N; n0 += nt) {
    const int64_t n1 = std::min(N, n0 + nt), rows = n1 - n0;
    at::parallel_for(n0, n1, grain, [&](int64_t a, int64_t b) {
      if (bf16)
        dequant_tile(qtype, qweight, scales, K, a, b, reinterpret_cast<uint16_t*>(tile.data_ptr()) + (a - n0) * K);
      else
        dequant_tile(qtype, qweight, scales, K, a, b, tile.data_ptr<float>() + (a - n0) * K);
    });
    at::Tensor yt = rows == nt ? y : at::empty({M, rows}, xg.options());
    at::mm_out(yt, xg, tile.narrow(0, 0, rows).t());
    out.narrow(1, n0, rows).copy_(yt);
  }
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
