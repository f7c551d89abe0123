// cpu/common.h — helpers for the glue of the native CPU ops (csrc/cpu/*.cpp, baseline ISA): dtype dispatch
// (fp32, bf16, fp16), float conversion, the element type of the per-ISA kernels (csrc/cpu/isa), the
// parallel grain, op registration. The glue may include framework-free headers of csrc/kernels (common.cuh:
// the attention rules); csrc/cpu translation units are built with MK_ABI=abi_cpu (CMakeLists.txt,
// csrc/abi.h), so those headers' symbols stay apart from the CUDA / emulated / per-ISA builds.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "../checks/common.h"
#include "isa/api.h"

namespace mk::cpu {

inline constexpr std::initializer_list<at::ScalarType> kFloatTypes = {at::kFloat, at::kBFloat16, at::kHalf};

inline void require_cpu(const char* op, const char* arg, const at::Tensor& t) {
  check::defined(op, arg, t);
  TORCH_CHECK(t.device().is_cpu(), op, ": ", arg, " must be a CPU tensor for the CPU kernel, got device ",
              t.device());
}

// Branch-free conversions the compiler vectorises (bf16 ↔ fp32 is a 16-bit shift; round to nearest even).
inline float to_f(float x) { return x; }
inline float to_f(c10::BFloat16 x) {
  return std::bit_cast<float>(static_cast<uint32_t>(x.x) << 16);
}
inline float to_f(c10::Half x) { return static_cast<float>(x); }
template <typename T> inline T from_f(float f);
template <> inline float from_f<float>(float f) { return f; }
template <> inline c10::BFloat16 from_f<c10::BFloat16>(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;  // round to nearest even
  const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
  return c10::BFloat16(static_cast<uint16_t>(nan ? 0x7fc0u : rounded), c10::BFloat16::from_bits());
}
template <> inline c10::Half from_f<c10::Half>(float f) { return c10::Half(f); }

// The per-ISA kernels' element type of scalar_t (csrc/cpu/isa/api.h).
template <typename T> inline constexpr Elem kElem = Elem::f32;
template <> inline constexpr Elem kElem<c10::BFloat16> = Elem::bf16;
template <> inline constexpr Elem kElem<c10::Half> = Elem::f16;
static_assert(sizeof(c10::BFloat16) == 2 && sizeof(c10::Half) == 2);
// The same for a dtype already checked to be one of kFloatTypes.
inline Elem elem_of(at::ScalarType t) {
  return t == at::kBFloat16 ? Elem::bf16 : (t == at::kHalf ? Elem::f16 : Elem::f32);
}

// The grain of at::parallel_for (the least items per task): enough items that one task does about
// kTaskWork units of work — a unit is one multiply-add or one byte moved — so that small problems run
// inline instead of waking threads for nothing. at::parallel_for gives each thread one contiguous chunk
// anyway; the grain only decides how small a range is still split. Example: rms_norm rows of H = 4096
// (2 units per element: the sum of squares and the scaling) → 65536 / 8192 = 8 rows per task.
inline constexpr int64_t kTaskWork = int64_t{1} << 16;
inline int64_t parallel_grain(int64_t work_per_item, int64_t min_items = 1) {
  return std::max<int64_t>(min_items, kTaskWork / std::max<int64_t>(1, work_per_item));
}

// Bytes of one thread's tile of W in the prefill GEMMs: fp32 / bf16 tiles (dense, or dequantized: they stay in
// the thread's L2 between the dequantization and the GEMM) and the int8 GEMM's decoded tiles (half the L2: the
// prepared x shares it).
inline constexpr int64_t kTileBytes = int64_t{1} << 20;
inline constexpr int64_t kTile8Bytes = int64_t{1} << 19;

// A buffer kept by the calling thread, 64-byte aligned, grown on demand: no allocation and no fresh pages (page
// faults) per call. Slot tells the buffers of one thread apart (an instantiation each).
template <int Slot>
uint8_t* kept_buffer(size_t bytes) {
  thread_local std::vector<uint8_t> buf;
  if (buf.size() < bytes + 64) buf.resize(bytes + 64);
  const auto p = reinterpret_cast<uintptr_t>(buf.data());
  return reinterpret_cast<uint8_t*>((p + 63) & ~uintptr_t{63});
}

// Rows per tile when the N rows of W are cut into tiles for a prefill GEMM: at most max_rows (a multiple of
// `multiple`, at least that) and a multiple of the thread count of tiles with equal rows (the last one
// partial), so that every thread gets the same work (at::parallel_for hands each thread one contiguous range
// of tiles). Example: N = 700, max_rows 240, multiple 16, 2 threads → 4 tiles of 176 rows (the last 172).
inline int64_t equal_tile_rows(int64_t N, int64_t max_rows, int64_t multiple) {
  const int64_t nthreads = at::get_num_threads();
  max_rows = std::max(multiple, max_rows / multiple * multiple);
  const int64_t want = nthreads * ((N + nthreads * max_rows - 1) / (nthreads * max_rows));
  return ((N + want - 1) / want + multiple - 1) / multiple * multiple;
}

}  // namespace mk::cpu

// One line of TORCH_LIBRARY_IMPL(mistral_kernels, CPU, m): registers mk::cpu::<name> for op <name>.
// Expand an op list with it (checks/<family>.h): TORCH_LIBRARY_IMPL(mistral_kernels, CPU, m) { MK_NORM_OPS(MK_IMPL_CPU) }
#define MK_IMPL_CPU(name) m.impl(#name, &mk::cpu::name);

// MK_CPU_DISPATCH(dtype, "op", [&] { ... scalar_t ... }) over float, bfloat16 and float16 (kFloatTypes).
#define MK_CPU_DISPATCH(TYPE, NAME, ...)                                                                    \
  AT_DISPATCH_SWITCH(TYPE, NAME,                                                                            \
                     AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__) AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__) \
                         AT_DISPATCH_CASE(at::kHalf, __VA_ARGS__))
