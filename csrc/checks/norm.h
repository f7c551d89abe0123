// checks/norm.h — argument checks for rms_norm, fused_add_rms_norm, silu_and_mul.
// Shapes: H hidden, I intermediate; leading dims "..." flattened to rows.
#pragma once

#include "common.h"

// The ops of this family (registered by every backend from this list; see common.h).
#define MK_NORM_OPS(X) X(rms_norm) X(fused_add_rms_norm) X(silu_and_mul)

namespace mk::inline MK_ABI::check {

// out [..., H], x [..., H], weight [H]; all contiguous, same dtype/device.
// `out_name` is "out" for rms_norm and "residual" for fused_add_rms_norm (which writes x and residual).
// rms_norm's out may be x itself (elementwise per row: README "Ops", allowed aliasing); no other overlap.
inline void rms_norm_args(const char* op, const char* out_name, const at::Tensor& out, const at::Tensor& x,
                          const at::Tensor& weight, std::initializer_list<at::ScalarType> dtypes,
                          bool out_may_be_x) {
  dtype_in(op, "x", x, dtypes);
  same_dtype(op, "weight", weight, "x", x);
  same_dtype(op, out_name, out, "x", x);
  same_device(op, "weight", weight, "x", x);
  same_device(op, out_name, out, "x", x);
  TORCH_CHECK(x.dim() >= 1, op, ": x must have at least 1 dim [..., H], got a scalar");
  ndim(op, "weight", weight, 1, "[H]");
  size_eq(op, "weight", weight, 0, x.size(-1), "H = x.shape[-1]");
  TORCH_CHECK(out.sizes() == x.sizes(), op, ": ", out_name, " must have the shape of x ", shape_str(x), ", got ",
              shape_str(out));
  contiguous(op, "x", x);
  contiguous(op, "weight", weight);
  contiguous(op, out_name, out);
  const bool same = out_may_be_x && out.const_data_ptr() == x.const_data_ptr();  // same shape, contiguous
  if (!same) no_overlap(op, out_name, out, {{"x", &x}});
  no_overlap(op, out_name, out, {{"weight", &weight}});
  if (!out_may_be_x) no_overlap(op, "x", x, {{"weight", &weight}});  // fused_add_rms_norm writes x too
}

// x [..., 2I] → out [..., I]
inline void silu_and_mul_args(const char* op, const at::Tensor& out, const at::Tensor& x,
                              std::initializer_list<at::ScalarType> dtypes) {
  dtype_in(op, "x", x, dtypes);
  same_dtype(op, "out", out, "x", x);
  same_device(op, "out", out, "x", x);
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) % 2 == 0, op, ": x must be [..., 2*I] with an even last dim, got shape ",
              shape_str(x));
  TORCH_CHECK(out.dim() == x.dim(), op, ": out must be [..., I] for x ", shape_str(x), ", got ", shape_str(out));
  for (int64_t d = 0; d + 1 < x.dim(); ++d)
    TORCH_CHECK(out.size(d) == x.size(d), op, ": out must be [..., I] for x ", shape_str(x), ", got ",
                shape_str(out));
  size_eq(op, "out", out, out.dim() - 1, x.size(-1) / 2, "I = x.shape[-1] / 2");
  contiguous(op, "x", x);
  contiguous(op, "out", out);
  no_overlap(op, "out", out, {{"x", &x}});
}

}  // namespace mk::inline MK_ABI::check
