// checks/common.h — argument validation shared by the CPU, CUDA and emulated backends.
// Every failure raises (TORCH_CHECK → Python RuntimeError) with the op name, the argument name,
// what was expected and what was given.
//
// checks/<family>.h also holds the family's op list, MK_<FAMILY>_OPS(X): every backend registers its
// implementations by expanding it (TORCH_LIBRARY_IMPL(..., m) { MK_NORM_OPS(MK_IMPL_CPU) }, with
// MK_IMPL_CPU from cpu/common.h or MK_IMPL_GLUE from glue/common.h); the schemas are in
// csrc/registration.cpp.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <initializer_list>
#include <string>
#include <utility>

#include "../abi.h"

namespace mk::inline MK_ABI::check {

inline std::string shape_str(const at::Tensor& t) { return c10::str(t.sizes()); }

inline void defined(const char* op, const char* arg, const at::Tensor& t) {
  TORCH_CHECK(t.defined(), op, ": ", arg, " is undefined (None); pass a tensor");
}

inline void dtype_in(const char* op, const char* arg, const at::Tensor& t,
                     std::initializer_list<at::ScalarType> allowed) {
  defined(op, arg, t);
  for (auto s : allowed)
    if (t.scalar_type() == s) return;
  std::string names;
  for (auto s : allowed) names += std::string(names.empty() ? "" : ", ") + c10::toString(s);
  TORCH_CHECK(false, op, ": ", arg, " has dtype ", t.scalar_type(), " but this backend (", t.device().type(),
              ") supports ", names);
}

inline void dtype_is(const char* op, const char* arg, const at::Tensor& t, at::ScalarType s) {
  defined(op, arg, t);
  TORCH_CHECK(t.scalar_type() == s, op, ": ", arg, " must have dtype ", s, ", got ", t.scalar_type());
}

inline void same_dtype(const char* op, const char* arg, const at::Tensor& t, const char* ref_arg,
                       const at::Tensor& ref) {
  defined(op, ref_arg, ref);
  defined(op, arg, t);
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), op, ": ", arg, " has dtype ", t.scalar_type(), " but ", ref_arg,
              " has ", ref.scalar_type(), "; they must match");
}

inline void same_device(const char* op, const char* arg, const at::Tensor& t, const char* ref_arg,
                        const at::Tensor& ref) {
  defined(op, ref_arg, ref);
  defined(op, arg, t);
  TORCH_CHECK(t.device() == ref.device(), op, ": ", arg, " is on ", t.device(), " but ", ref_arg, " is on ",
              ref.device(), "; move them to the same device");
}

inline void ndim(const char* op, const char* arg, const at::Tensor& t, int64_t n, const char* layout) {
  defined(op, arg, t);
  TORCH_CHECK(t.dim() == n, op, ": ", arg, " must be ", n, "-D ", layout, ", got shape ", shape_str(t));
}

inline void size_eq(const char* op, const char* arg, const at::Tensor& t, int64_t d, int64_t expected,
                    const char* what) {
  TORCH_CHECK(t.size(d) == expected, op, ": ", arg, ".shape[", d, "] must be ", expected, " (", what, "), got shape ",
              shape_str(t));
}

inline void contiguous(const char* op, const char* arg, const at::Tensor& t) {
  TORCH_CHECK(t.is_contiguous(), op, ": ", arg, " must be contiguous (call .contiguous()), got strides ",
              c10::str(t.strides()), " for shape ", shape_str(t));
}

// Dense in the last `n` dims (row-major), any stride for the leading dim.
inline void dense_inner(const char* op, const char* arg, const at::Tensor& t, int n) {
  int64_t expected = 1;
  for (int d = static_cast<int>(t.dim()) - 1; d >= static_cast<int>(t.dim()) - n; --d) {
    TORCH_CHECK(t.size(d) == 1 || t.stride(d) == expected, op, ": ", arg, " must be contiguous in its last ", n,
                " dims, got strides ", c10::str(t.strides()), " for shape ", shape_str(t));
    expected *= t.size(d);
  }
}

// ---- memory overlap of written tensors ------------------------------------------------------------------
// The ops write their outputs in place, so a written tensor must own each of its elements (no stride-0 or
// overlapping rows) and share no byte with any other argument, as torch's own in-place ops require. The one
// allowed alias is documented per op (README "Ops"): rms_norm's out may BE x (the same view, elementwise).
// Model: a checked tensor is dense in every dim but the first (the checks above run first), i.e. R rows of
// L bytes, row i at base + i·s (s = stride(0) bytes). Two row sets with the same s ≥ L overlap iff some
// pair of rows does, which only the rows nearest in offset can; otherwise the byte spans are compared.
struct RowSpan {
  intptr_t base;  // first byte
  int64_t rows, stride, len;  // R, s, L (bytes)
  explicit RowSpan(const at::Tensor& t) : base(reinterpret_cast<intptr_t>(t.const_data_ptr())) {
    const int64_t es = t.element_size();
    if (t.dim() == 0 || t.numel() == 0) {
      rows = t.numel() == 0 ? 0 : 1, stride = es, len = es;
    } else {
      rows = t.size(0), stride = t.stride(0) * es, len = t.numel() / t.size(0) * es;
      if (rows == 1) stride = len;
    }
  }
  int64_t span() const { return rows == 0 ? 0 : (rows - 1) * stride + len; }
  bool self_overlaps() const { return rows > 1 && stride < len; }
};

inline bool spans_overlap(const RowSpan& a, const RowSpan& b) {
  if (a.rows == 0 || b.rows == 0) return false;
  if (a.base >= b.base + b.span() || b.base >= a.base + a.span()) return false;  // disjoint byte ranges
  const int64_t s = a.stride;
  if (a.rows == 1 || b.rows == 1 || s != b.stride || s < a.len || s < b.len) return true;  // conservative
  // Row i of a, [a.base + i·s, +a.len), meets row j of b, [b.base + j·s, +b.len), iff
  // -a.len < d + (i - j)·s < b.len with d = a.base - b.base.
  const int64_t d = static_cast<int64_t>(a.base - b.base);
  const int64_t k0 = -d / s;  // the row offsets k = i - j nearest to -d/s
  for (int64_t k = k0 - 1; k <= k0 + 1; ++k) {
    if (k < -(b.rows - 1) || k > a.rows - 1) continue;
    const int64_t off = d + k * s;
    if (off > -a.len && off < b.len) return true;
  }
  return false;
}

// `arg` (written by the op) owns each of its elements: no stride 0 / overlapping rows.
inline void no_internal_overlap(const char* op, const char* arg, const at::Tensor& t) {
  TORCH_CHECK(!RowSpan(t).self_overlaps(), op, ": ", arg,
              " is written by this op but its elements overlap in memory (strides ", c10::str(t.strides()),
              " for shape ", shape_str(t), ", e.g. from expand() or as_strided); pass a tensor that owns "
              "its memory (.contiguous() or .clone())");
}

// The written tensor `arg` shares no memory with any of `others` (name, tensor).
inline void no_overlap(const char* op, const char* arg, const at::Tensor& t,
                       std::initializer_list<std::pair<const char*, const at::Tensor*>> others) {
  const RowSpan a(t);
  for (const auto& [name, o] : others)
    TORCH_CHECK(!spans_overlap(a, RowSpan(*o)), op, ": ", arg, " is written by this op but shares memory with ",
                name, "; pass separate tensors (in-place use of this argument is not supported)");
}

// Every element of the CPU index tensor `t` lies in [lo, hi). Reports the first offender.
// (Device tensors are checked by the Python wrapper, which can afford the sync when asked.)
template <typename I>
inline void index_range_cpu(const char* op, const char* arg, const at::Tensor& t, int64_t lo, int64_t hi,
                            const char* what) {
  if (!t.device().is_cpu()) return;
  const I* p = t.const_data_ptr<I>();
  for (int64_t i = 0; i < t.numel(); ++i)
    TORCH_CHECK(p[i] >= lo && p[i] < hi, op, ": ", arg, "[", i, "]=", static_cast<int64_t>(p[i]),
                " is out of range [", lo, ", ", hi, ") (", what, ")");
}

}  // namespace mk::inline MK_ABI::check
