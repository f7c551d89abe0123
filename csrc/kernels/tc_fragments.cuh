// tc_fragments.cuh — the mma.sync.m16n8k16 vocabulary of the tensor-core kernels (paged_prefill_tc.cuh,
// grouped_gemm_tc.cuh, quant_gemm.cuh): the 16-bit types they take, the mma and pack wrappers dispatched on T,
// and the ldmatrix row addresses of the A / B fragments (framework-free; PTX through ../simt/portable.cuh).
// Fragment layouts: csrc/simt/emu_warp.cpp (worked examples), tested by tests/emu/test_prefill_tc_fragments.cpp.
#pragma once

#include <cstdint>
#include <type_traits>

#include "../simt/portable.cuh"
#include "common.cuh"

namespace mk::inline MK_ABI {

// The element types the tensor-core kernels run (fp32 keeps the SIMT kernels).
template <typename T>
inline constexpr bool kTcType = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

// d += a·b on the tensor cores, in T's 16-bit format.
template <typename T>
__device__ __forceinline__ void tc_mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (std::is_same_v<T, __half>) simt::mma_m16n8k16_f16(d, a, b, d);
  else simt::mma_m16n8k16_bf16(d, a, b, d);
}
template <typename T>
__device__ __forceinline__ uint32_t tc_pack(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) return simt::pack_half2(lo, hi);
  else return simt::pack_bf16x2(lo, hi);
}

// Fragment addressing shared by the kernels and tests/emu/test_prefill_tc_fragments.cpp. `base` points at
// element [row0][col0] of a row-major shared tile with row stride `ld` elements; lane = 0…31.
// A operand (16×16 at rows row0…+15, cols col0…+15), ldmatrix.x4 → a[0..3]:
//   lanes 0-15 → rows 0-15 at col 0, lanes 16-31 → rows 0-15 at col 8.
template <typename T>
__device__ __forceinline__ const T* tc_a_row(const T* base, int ld, int lane) {
  return base + (lane & 15) * ld + (lane >> 4) * 8;
}
// B operand from a [n][k] tile (K rows: n = key, k = d), two 8-wide n-tiles × one 16-deep k-step,
// ldmatrix.x4 (non-trans) → {r0, r1} = b of n-tile 0, {r2, r3} = b of n-tile 1:
//   matrix 0: n 0-7 k 0-7, 1: n 0-7 k 8-15, 2: n 8-15 k 0-7, 3: n 8-15 k 8-15 (lanes 8i…8i+7 → matrix i).
template <typename T>
__device__ __forceinline__ const T* tc_b_nk_row(const T* base, int ld, int lane) {
  return base + ((lane & 7) + ((lane >> 4) << 3)) * ld + ((lane >> 3) & 1) * 8;
}
// B operand from a [k][n] tile (V rows: k = key, n = d), one 16-deep k-step × two 8-wide n-tiles,
// ldmatrix.x4.trans → {r0, r1} = b of n-tile 0, {r2, r3} = b of n-tile 1:
//   matrix 0: k 0-7 n 0-7, 1: k 8-15 n 0-7, 2: k 0-7 n 8-15, 3: k 8-15 n 8-15.
template <typename T>
__device__ __forceinline__ const T* tc_b_kn_row(const T* base, int ld, int lane) {
  return base + ((lane & 7) + ((lane >> 3) & 1) * 8) * ld + (lane >> 4) * 8;
}
// The P·V A operand of k-step k from the fp32 S accumulators of n-tiles 2k (lo) and 2k+1 (hi):
// accumulator c[0..1] = row g, c[2..3] = row g+8 → a[0] = P[g][2t..], a[1] = P[g+8][2t..],
// a[2] = P[g][2t+8..], a[3] = P[g+8][2t+8..].
template <typename T>
__device__ __forceinline__ void tc_acc_to_a(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = tc_pack<T>(lo[0], lo[1]);
  a[1] = tc_pack<T>(lo[2], lo[3]);
  a[2] = tc_pack<T>(hi[0], hi[1]);
  a[3] = tc_pack<T>(hi[2], hi[3]);
}

}  // namespace mk::inline MK_ABI
