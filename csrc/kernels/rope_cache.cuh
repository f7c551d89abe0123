// rope_cache.cuh — rotary_embedding_and_cache: RoPE on q and k and the K/V cache write of the same tokens
// in one launch (CUDA, framework-free): rope.cuh's rotation, then kv_cache.cuh's copy, per token.
//
// Shapes: T tokens, Hq / Hkv heads, D head_dim, R rot_dim, P max positions, N num_blocks, S block_size.
//   positions int64 [T]; q [T, Hq, D], k / v [T, Hkv, D] (heads and dim dense, token strides free);
//   cos_sin fp32 [P, R]; k_cache / v_cache [N, S, Hkv, D]; slot_mapping int64 [T] (-1: skip the token).
// Result: exactly rotary_embedding(positions, q, k, ...) followed by reshape_and_cache(k, v, ...): q and k
// are rotated in place and the rotated k row is what the cache receives (a position outside [0, P) is
// not rotated, a slot outside the cache is not written, as in the two ops).
// One block per token: the threads rotate the token's q and k heads, a barrier makes the rotated k row
// visible to all of them, then they copy the K and V rows in 16-byte vectors when the layout allows.
// Why: a decode layer otherwise launches the two one-block-per-token kernels back to back; at batch 1
// each is a latency-bound launch of a few µs (docs/kernels.md), so fusing removes one per layer.
#pragma once

#include "../simt/portable.cuh"
#include "common.cuh"
#include "kv_cache.cuh"
#include "rope.cuh"

namespace mk::inline MK_ABI {

template <typename T, bool NEOX, int VEC>
__global__ void __launch_bounds__(128)
rotary_embedding_and_cache_kernel(const int64_t* __restrict__ positions, T* q, T* k, const T* __restrict__ v,
                                  const float* __restrict__ cos_sin, const PagedKV<T> cache,
                                  const int64_t* __restrict__ slot_mapping, int64_t q_stride, int64_t k_stride,
                                  int64_t v_stride, int64_t Hq, int64_t Hkv, int64_t D, int64_t R, int64_t max_pos) {
  const int64_t t = blockIdx.x;
  rope_token<T, NEOX>(t, positions, q, k, cos_sin, q_stride, k_stride, Hq, Hkv, D, R, max_pos);
  __syncthreads();  // the k row is rotated by all threads before any of them copies it
  cache_token<T, VEC>(t, k, v, cache, slot_mapping, k_stride, v_stride);
}

// cache: as launch_reshape_and_cache's (slot_stride = Hkv·D, no block table).
template <typename T>
cudaError_t launch_rotary_embedding_and_cache(const int64_t* positions, T* q, T* k, const T* v, const float* cos_sin,
                                              const PagedKV<T>& cache, const int64_t* slot_mapping, int64_t T_,
                                              int64_t q_stride, int64_t k_stride, int64_t v_stride, int64_t Hq,
                                              int64_t Hkv, int64_t D, int64_t R, int64_t max_pos, bool is_neox,
                                              cudaStream_t stream) {
  if (T_ == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(T_)), block(128);
  const bool vec = cache_vectorizable<T>(k, v, cache, k_stride, v_stride);
  const auto go = [&](auto kernel) {
    return simt::launch(kernel, grid, block, 0, stream, positions, q, k, v, cos_sin, cache, slot_mapping, q_stride,
                        k_stride, v_stride, Hq, Hkv, D, R, max_pos);
  };
  constexpr int V = kVec16<T>;
  if (is_neox)
    return vec ? go(rotary_embedding_and_cache_kernel<T, true, V>) : go(rotary_embedding_and_cache_kernel<T, true, 1>);
  return vec ? go(rotary_embedding_and_cache_kernel<T, false, V>) : go(rotary_embedding_and_cache_kernel<T, false, 1>);
}

}  // namespace mk::inline MK_ABI
