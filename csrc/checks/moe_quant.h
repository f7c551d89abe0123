// checks/moe_quant.h — argument checks of moe_qgemm: the expert projections of a MoE layer on quantized
// (packed) expert stacks, over rows grouped by expert.
// Shapes: M rows, G experts, N out features, K in features, R = K / QK · bytes per block (a packed row).
// The formats (codes, block geometry, byte layouts) are csrc/kernels/quant_blocks.h.
#pragma once

#include <optional>

#include "../kernels/quant_blocks.h"
#include "common.h"
#include "quant.h"

// The ops of this family (registered by every backend from this list; see common.h).
#define MK_MOE_QUANT_OPS(X) X(moe_qgemm)

namespace mk::inline MK_ABI::check {

// One packed expert stack `arg` [G, N, ·] of format f for x [M, K]: GGUF blocks uint8 [G, N, R] with scales
// None; INT8_ROWWISE int8 [G, N, K] with scales fp32 [G, N]. Contiguous, on x's device.
inline void packed_experts(const char* op, const char* arg, const char* scales_arg, const at::Tensor& x,
                           const at::Tensor& q, const std::optional<at::Tensor>& scales, const QFormat& f, int64_t G,
                           int64_t N) {
  const int64_t K = x.size(1);
  same_device(op, arg, q, "x", x);
  ndim(op, arg, q, 3, f.qtype == kInt8Rowwise ? "[G, N, K]" : "[G, N, K / QK * bytes per block]");
  size_eq(op, arg, q, 0, G, "G = qweight.shape[0] experts");
  size_eq(op, arg, q, 1, N, "N = qweight.shape[1]");
  contiguous(op, arg, q);
  if (f.qtype == kInt8Rowwise) {
    dtype_is(op, arg, q, at::kChar);
    size_eq(op, arg, q, 2, K, "K = x.shape[1]");
    TORCH_CHECK(scales.has_value() && scales->defined(), op, ": ", scales_arg,
                " [G, N] fp32 is required for INT8_ROWWISE");
    dtype_is(op, scales_arg, *scales, at::kFloat);
    same_device(op, scales_arg, *scales, "x", x);
    ndim(op, scales_arg, *scales, 2, "[G, N]");
    size_eq(op, scales_arg, *scales, 0, G, "G");
    size_eq(op, scales_arg, *scales, 1, N, "N");
    contiguous(op, scales_arg, *scales);
  } else {
    dtype_is(op, arg, q, at::kByte);
    TORCH_CHECK(!scales.has_value() || !scales->defined(), op, ": ", scales_arg, " must be None for ", f.name,
                " (its scales are inside the blocks)");
    size_eq(op, arg, q, 2, K / f.block * f.bytes, "K / QK * bytes per block");
  }
}

// out [M, N] = x [M, K] · W[g]ᵀ per segment g (plain), or swiglu(x·W[g]ᵀ, x·W3[g]ᵀ) when up_qweight is given
// (same format as qweight). x, out contiguous, same float dtype (`dtypes`) and device; expert_offsets int64
// [≥ G+1] (CPU: checked here to be non-decreasing within [0, M]; CUDA: by the Python wrapper). Returns the format.
inline QFormat moe_qgemm_args(const char* op, const at::Tensor& out, const at::Tensor& x, const at::Tensor& offsets,
                              const at::Tensor& qweight, const std::optional<at::Tensor>& scales, int64_t qtype,
                              const std::optional<at::Tensor>& up_qweight, const std::optional<at::Tensor>& up_scales,
                              std::initializer_list<at::ScalarType> dtypes) {
  const QFormat f = native_qformat(op, qtype);
  dtype_in(op, "x", x, dtypes);
  same_dtype(op, "out", out, "x", x);
  same_device(op, "out", out, "x", x);
  ndim(op, "x", x, 2, "[M, K]");
  contiguous(op, "x", x);
  contiguous(op, "out", out);
  TORCH_CHECK(x.size(0) <= INT32_MAX, op, ": x has more than INT32_MAX rows");
  if (f.qtype != kInt8Rowwise)
    TORCH_CHECK(x.size(1) % f.block == 0, op, ": K = x.shape[1] = ", x.size(1), " must be a multiple of ", f.block,
                " for ", f.name);
  defined(op, "qweight", qweight);
  TORCH_CHECK(qweight.dim() == 3, op, ": qweight must be a packed expert stack [G, N, ·], got ", shape_str(qweight));
  const int64_t G = qweight.size(0), N = qweight.size(1);
  packed_experts(op, "qweight", "scales", x, qweight, scales, f, G, N);
  const bool gated = up_qweight.has_value() && up_qweight->defined();
  if (gated) {
    packed_experts(op, "up_qweight", "up_scales", x, *up_qweight, up_scales, f, G, N);
  } else {
    TORCH_CHECK(!up_scales.has_value() || !up_scales->defined(), op, ": up_scales given without up_qweight");
  }
  same_device(op, "expert_offsets", offsets, "x", x);
  dtype_is(op, "expert_offsets", offsets, at::kLong);
  ndim(op, "expert_offsets", offsets, 1, "[G + 1] (or longer)");
  contiguous(op, "expert_offsets", offsets);
  TORCH_CHECK(offsets.size(0) >= G + 1, op, ": expert_offsets needs at least G + 1 = ", G + 1,
              " entries (G = qweight.shape[0] experts), got ", offsets.size(0));
  TORCH_CHECK(out.dim() == 2 && out.size(0) == x.size(0) && out.size(1) == N, op, ": out must be [M, N] = [",
              x.size(0), ", ", N, "], got ", shape_str(out));
  no_overlap(op, "out", out, {{"x", &x}, {"expert_offsets", &offsets}, {"qweight", &qweight}});
  if (scales.has_value() && scales->defined()) no_overlap(op, "out", out, {{"scales", &*scales}});
  if (gated) no_overlap(op, "out", out, {{"up_qweight", &*up_qweight}});
  if (up_scales.has_value() && up_scales->defined()) no_overlap(op, "out", out, {{"up_scales", &*up_scales}});
  if (offsets.device().is_cpu()) {  // segment bounds: 0 <= offsets[0] <= ... <= offsets[G] <= M
    const int64_t* o = offsets.const_data_ptr<int64_t>();
    for (int64_t e = 0; e <= G; ++e)
      TORCH_CHECK(o[e] >= (e ? o[e - 1] : 0) && o[e] <= x.size(0), op, ": expert_offsets[", e, "]=", o[e],
                  " breaks 0 <= offsets[0] <= ... <= offsets[G] <= M = ", x.size(0));
  }
  return f;
}

}  // namespace mk::inline MK_ABI::check
