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

#include <initializer_list>
#include <string>

#include "../abi.h"

namespace mk::inline MK_ABI::check {

inline std::string shape_str(const at::Tensor& t) { return c10::str(t.sizes()); }

inline void defined(const char* op, const char* arg, const at::Tensor& t) {
  TORCH_CHECK(t.defined(), op, ": ", arg, " is undefined (None); pass a tensor");
}

inline void dtype_in(const char* op, const char* arg, const at::Tensor& t,
                     std::initializer_list<at::ScalarType> allowed) {
  for (auto s : allowed)
    if (t.scalar_type() == s) return;
  std::string names;
  for (auto s : allowed) names += std::string(names.empty() ? "" : ", ") + c10::toString(s);
  TORCH_CHECK(false, op, ": ", arg, " has dtype ", t.scalar_type(), " but this backend (", t.device().type(),
              ") supports ", names);
}

inline void dtype_is(const char* op, const char* arg, const at::Tensor& t, at::ScalarType s) {
  TORCH_CHECK(t.scalar_type() == s, op, ": ", arg, " must have dtype ", s, ", got ", t.scalar_type());
}

inline void same_dtype(const char* op, const char* arg, const at::Tensor& t, const char* ref_arg,
                       const at::Tensor& ref) {
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), op, ": ", arg, " has dtype ", t.scalar_type(), " but ", ref_arg,
              " has ", ref.scalar_type(), "; they must match");
}

inline void same_device(const char* op, const char* arg, const at::Tensor& t, const char* ref_arg,
                        const at::Tensor& ref) {
  TORCH_CHECK(t.device() == ref.device(), op, ": ", arg, " is on ", t.device(), " but ", ref_arg, " is on ",
              ref.device(), "; move them to the same device");
}

inline void ndim(const char* op, const char* arg, const at::Tensor& t, int64_t n, const char* layout) {
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
