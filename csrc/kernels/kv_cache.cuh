// kv_cache.cuh — reshape_and_cache: scatter the K/V rows of new tokens into the paged caches (CUDA,
// framework-free).
//
// Shapes: T tokens, Hkv kv heads, D head_dim, N num_blocks, S block_size, R = Hkv·D (one token row).
//   k, v [T, Hkv, D] with heads and dim dense (token strides k_stride / v_stride, in elements);
//   k_cache, v_cache [N, S, Hkv, D] contiguous: slot s = block·S + offset is row s of a [N·S, R] view;
//   slot_mapping int64 [T]: token t → slot; -1 (padding) and out-of-range slots are skipped on the
//   device (the op validates the range on the host side).
// One block per token, threads stride over the row in 16-byte vectors (VEC = 16/sizeof(T)) when R,
// the strides and the pointers allow it. A pure copy: bit-exact.
//
// Bound: memory, 4·T·R·sizeof(T) bytes (read k, v; write two cache rows); 1 µs moves ~2 MB at 2 TB/s.
#pragma once

#include "common.cuh"

namespace mk {

template <typename T, int VEC>
__global__ void __launch_bounds__(128)
reshape_and_cache_kernel(const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ k_cache,
                         T* __restrict__ v_cache, const int64_t* __restrict__ slot_mapping, int64_t k_stride,
                         int64_t v_stride, int64_t row, int64_t num_slots) {
  using V = Vec<T, VEC>;
  const int64_t t = blockIdx.x;
  const int64_t slot = slot_mapping[t];
  if (slot < 0 || slot >= num_slots) return;
  const V* ks = reinterpret_cast<const V*>(k + t * k_stride);
  const V* vs = reinterpret_cast<const V*>(v + t * v_stride);
  V* kd = reinterpret_cast<V*>(k_cache + slot * row);
  V* vd = reinterpret_cast<V*>(v_cache + slot * row);
  for (int64_t i = threadIdx.x; i < row / VEC; i += blockDim.x) {
    kd[i] = ks[i];
    vd[i] = vs[i];
  }
}

template <typename T>
cudaError_t launch_reshape_and_cache(const T* k, const T* v, T* k_cache, T* v_cache, const int64_t* slot_mapping,
                                     int64_t T_, int64_t k_stride, int64_t v_stride, int64_t row, int64_t num_slots,
                                     cudaStream_t stream) {
  if (T_ == 0 || row == 0) return cudaSuccess;
  constexpr int V = kVec16<T>;
  const bool vec_ok = row % V == 0 && k_stride % V == 0 && v_stride % V == 0 && aligned16(k) && aligned16(v) &&
                      aligned16(k_cache) && aligned16(v_cache);
  const dim3 grid(static_cast<unsigned>(T_)), block(128);
  if (vec_ok)
    return simt::launch(reshape_and_cache_kernel<T, V>, grid, block, 0, stream, k, v, k_cache, v_cache, slot_mapping,
                        k_stride, v_stride, row, num_slots);
  return simt::launch(reshape_and_cache_kernel<T, 1>, grid, block, 0, stream, k, v, k_cache, v_cache, slot_mapping,
                      k_stride, v_stride, row, num_slots);
}

}  // namespace mk
