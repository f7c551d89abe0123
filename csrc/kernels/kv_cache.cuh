// kv_cache.cuh — reshape_and_cache: scatter the K/V rows of new tokens into the paged caches (CUDA,
// framework-free).
//
// Shapes: T tokens, Hkv kv heads, D head_dim, N num_blocks, S block_size, R = Hkv·D (one token row).
//   k, v [T, Hkv, D] with heads and dim dense (token strides k_stride / v_stride, in elements);
//   k_cache, v_cache [N, S, Hkv, D] contiguous: slot s = block·S + offset is row s of a [N·S, R] view
//   (PagedKV::row, common.cuh); slot_mapping int64 [T]: token t → slot; -1 (padding) and out-of-range
//   slots are skipped on the device (the op validates the range on the host side).
// One block per token, threads stride over the row in 16-byte vectors (VEC = 16/sizeof(T)) when R,
// the strides and the pointers allow it. A pure copy: bit-exact.
//
// Bound: memory, 4·T·R·sizeof(T) bytes (read k, v; write two cache rows); 1 µs moves ~2 MB at 2 TB/s.
#pragma once

#include "../simt/portable.cuh"
#include "common.cuh"

namespace mk::inline MK_ABI {

// Token t of a block: its K and V rows copied to slot slot_mapping[t] (nothing for a slot outside the cache).
// k and v are not __restrict__: the fused rope kernel (rope_cache.cuh) writes k in the same launch, and
// restrict would allow the non-coherent read-only path.
template <typename T, int VEC>
__device__ __forceinline__ void cache_token(int64_t t, const T* k, const T* v,
                                            const PagedKV<T>& cache, const int64_t* __restrict__ slot_mapping,
                                            int64_t k_stride, int64_t v_stride) {
  using V = Vec<T, VEC>;
  const int64_t row = cache.slot_stride;
  const int64_t slot = slot_mapping[t];
  if (!cache.holds(slot)) return;
  const V* ks = reinterpret_cast<const V*>(k + t * k_stride);
  const V* vs = reinterpret_cast<const V*>(v + t * v_stride);
  V* kd = reinterpret_cast<V*>(cache.k + cache.row(slot));
  V* vd = reinterpret_cast<V*>(cache.v + cache.row(slot));
  for (int64_t i = threadIdx.x; i < row / VEC; i += blockDim.x) {
    kd[i] = ks[i];
    vd[i] = vs[i];
  }
}

template <typename T, int VEC>
__global__ void __launch_bounds__(128)
reshape_and_cache_kernel(const T* __restrict__ k, const T* __restrict__ v, const PagedKV<T> cache,
                         const int64_t* __restrict__ slot_mapping, int64_t k_stride, int64_t v_stride) {
  cache_token<T, VEC>(blockIdx.x, k, v, cache, slot_mapping, k_stride, v_stride);
}

// Whether the rows can move as 16-byte vectors: row length, strides and pointers all allow it.
template <typename T>
bool cache_vectorizable(const T* k, const T* v, const PagedKV<T>& cache, int64_t k_stride, int64_t v_stride) {
  constexpr int V = kVec16<T>;
  return cache.slot_stride % V == 0 && k_stride % V == 0 && v_stride % V == 0 && aligned16(k) && aligned16(v) &&
         aligned16(cache.k) && aligned16(cache.v);
}

// cache: k/v = k_cache/v_cache, slot_stride = R, block_size = S, num_blocks = N (no block table).
template <typename T>
cudaError_t launch_reshape_and_cache(const T* k, const T* v, const PagedKV<T>& cache, const int64_t* slot_mapping,
                                     int64_t T_, int64_t k_stride, int64_t v_stride, cudaStream_t stream) {
  const int64_t row = cache.slot_stride;
  if (T_ == 0 || row == 0) return cudaSuccess;
  constexpr int V = kVec16<T>;
  const bool vec_ok = cache_vectorizable(k, v, cache, k_stride, v_stride);
  const dim3 grid(static_cast<unsigned>(T_)), block(128);
  if (vec_ok)
    return simt::launch(reshape_and_cache_kernel<T, V>, grid, block, 0, stream, k, v, cache, slot_mapping, k_stride,
                        v_stride);
  return simt::launch(reshape_and_cache_kernel<T, 1>, grid, block, 0, stream, k, v, cache, slot_mapping, k_stride,
                      v_stride);
}

}  // namespace mk::inline MK_ABI
