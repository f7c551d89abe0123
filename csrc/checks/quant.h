// checks/quant.h — argument checks for qlinear (linear layers on quantized weights).
// Shapes: M rows (tokens), K in features, N out features; R = K / QK · bytes per block, the packed row bytes.
// The formats (codes, block geometry, byte layouts) are csrc/kernels/quant_blocks.h.
#pragma once

#include "../kernels/quant_blocks.h"
#include <optional>

#include "common.h"

// The ops of this family (registered by every backend from this list; see common.h).
#define MK_QUANT_OPS(X) X(qlinear)

namespace mk::inline MK_ABI::check {

// The geometry of format code qtype, or an error naming the formats with a native kernel.
inline QFormat native_qformat(const char* op, int64_t qtype) {
  const QFormat f = qformat(static_cast<int32_t>(qtype));
  TORCH_CHECK(f.qtype != 0 && qtype == f.qtype, op, ": qtype ", qtype,
              " has no native kernel; supported: Q4_0 (2), Q4_1 (3), Q8_0 (8), Q4_K (12), Q5_K (13), Q6_K (14), "
              "INT8_ROWWISE (1000) — dequantize other formats at load");
  return f;
}

// out [M, N] = x [M, K] · W[N, K]ᵀ with W given as
//   GGUF block formats: qweight uint8 [N, R], R = K / QK · bytes, scales None;
//   kInt8Rowwise:       qweight int8 [N, K], scales fp32 [N].
// x, out: contiguous, same float dtype (`dtypes`) and device; qweight / scales contiguous on x's device.
// Returns the format's geometry.
inline QFormat qlinear_args(const char* op, const at::Tensor& out, const at::Tensor& x, const at::Tensor& qweight,
                            const std::optional<at::Tensor>& scales, int64_t qtype,
                            std::initializer_list<at::ScalarType> dtypes) {
  const QFormat f = native_qformat(op, qtype);
  dtype_in(op, "x", x, dtypes);
  same_dtype(op, "out", out, "x", x);
  same_device(op, "out", out, "x", x);
  same_device(op, "qweight", qweight, "x", x);
  ndim(op, "x", x, 2, "[M, K]");
  ndim(op, "qweight", qweight, 2, qtype == kInt8Rowwise ? "[N, K]" : "[N, K / QK * bytes per block]");
  const int64_t k = x.size(1), n = qweight.size(0);
  if (qtype == kInt8Rowwise) {
    dtype_is(op, "qweight", qweight, at::kChar);
    size_eq(op, "qweight", qweight, 1, k, "K = x.shape[1]");
    TORCH_CHECK(scales.has_value() && scales->defined(), op, ": scales [N] fp32 is required for INT8_ROWWISE");
    dtype_is(op, "scales", *scales, at::kFloat);
    same_device(op, "scales", *scales, "x", x);
    ndim(op, "scales", *scales, 1, "[N]");
    size_eq(op, "scales", *scales, 0, n, "N = qweight.shape[0]");
    contiguous(op, "scales", *scales);
  } else {
    dtype_is(op, "qweight", qweight, at::kByte);
    TORCH_CHECK(!scales.has_value() || !scales->defined(), op, ": scales must be None for ", f.name,
                " (its scales are inside the blocks)");
    TORCH_CHECK(k % f.block == 0, op, ": K = x.shape[1] = ", k, " must be a multiple of ", f.block, " for ", f.name);
    size_eq(op, "qweight", qweight, 1, k / f.block * f.bytes, "K / QK * bytes per block");
  }
  TORCH_CHECK(out.dim() == 2 && out.size(0) == x.size(0) && out.size(1) == n, op, ": out must be [M, N] = [",
              x.size(0), ", ", n, "], got ", shape_str(out));
  contiguous(op, "x", x);
  contiguous(op, "qweight", qweight);
  contiguous(op, "out", out);
  no_overlap(op, "out", out, {{"x", &x}, {"qweight", &qweight}});
  if (scales.has_value() && scales->defined()) no_overlap(op, "out", out, {{"scales", &*scales}});
  return f;
}

}  // namespace mk::inline MK_ABI::check
