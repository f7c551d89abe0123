// rope.cuh — rotary position embedding, in place on q and k (CUDA, framework-free).
//
// Shapes: T tokens, Hq / Hkv heads, D head_dim, R = rot_dim ≤ D (partial rotary), P max positions.
//   positions int64 [T]; q [T, Hq, D] and k [T, Hkv, D] with heads and dim dense (token stride free,
//   so q/k can be views into a fused QKV buffer); cos_sin fp32 [P, R]: cos in [:R/2], sin in [R/2:].
// Pair i (0 ≤ i < R/2) rotates by angle pos·θ_i:
//   neox        (HF layout):              (x[i],    x[i + R/2])
//   interleaved (Mistral / GGUF layout):  (x[2i],   x[2i + 1])
//   x1' = x1·cos − x2·sin,  x2' = x2·cos + x1·sin   (fp32 math, one rounding to T).
// Dims R..D-1 are left untouched. One block per token; threads stride over (head, pair) for q then k.
// Positions outside [0, P) are skipped on the device (the op validates them on the host side).
#pragma once

#include "../simt/portable.cuh"
#include "common.cuh"

namespace mk::inline MK_ABI {

template <typename T, bool NEOX>
__device__ __forceinline__ void rope_rotate_heads(T* base, int64_t heads, int64_t D, int64_t half,
                                                  const float* cos, const float* sin) {
  for (int64_t idx = threadIdx.x; idx < heads * half; idx += blockDim.x) {
    const int64_t h = idx / half, i = idx % half;
    T* p = base + h * D;
    const int64_t i1 = NEOX ? i : 2 * i, i2 = NEOX ? i + half : 2 * i + 1;
    const float x1 = simt::to_float(p[i1]), x2 = simt::to_float(p[i2]);
    const float c = cos[i], s = sin[i];
    p[i1] = simt::from_float<T>(x1 * c - x2 * s);
    p[i2] = simt::from_float<T>(x2 * c + x1 * s);
  }
}

// Token t of a block: its q and k heads rotated in place (nothing for a position outside [0, max_pos)).
template <typename T, bool NEOX>
__device__ __forceinline__ void rope_token(int64_t t, const int64_t* __restrict__ positions, T* q, T* k,
                                           const float* __restrict__ cos_sin, int64_t q_stride, int64_t k_stride,
                                           int64_t Hq, int64_t Hkv, int64_t D, int64_t R, int64_t max_pos) {
  const int64_t pos = positions[t];
  if (pos < 0 || pos >= max_pos) return;
  const int64_t half = R / 2;
  const float* cos = cos_sin + pos * R;
  const float* sin = cos + half;
  rope_rotate_heads<T, NEOX>(q + t * q_stride, Hq, D, half, cos, sin);
  rope_rotate_heads<T, NEOX>(k + t * k_stride, Hkv, D, half, cos, sin);
}

template <typename T, bool NEOX>
__global__ void __launch_bounds__(256)
rotary_embedding_kernel(const int64_t* __restrict__ positions, T* q, T* k, const float* __restrict__ cos_sin,
                        int64_t q_stride, int64_t k_stride, int64_t Hq, int64_t Hkv, int64_t D, int64_t R,
                        int64_t max_pos) {
  rope_token<T, NEOX>(blockIdx.x, positions, q, k, cos_sin, q_stride, k_stride, Hq, Hkv, D, R, max_pos);
}

template <typename T>
cudaError_t launch_rotary_embedding(const int64_t* positions, T* q, T* k, const float* cos_sin, int64_t T_,
                                    int64_t q_stride, int64_t k_stride, int64_t Hq, int64_t Hkv, int64_t D,
                                    int64_t R, int64_t max_pos, bool is_neox, cudaStream_t stream) {
  if (T_ == 0 || R == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(T_)), block(128);
  if (is_neox)
    return simt::launch(rotary_embedding_kernel<T, true>, grid, block, 0, stream, positions, q, k, cos_sin, q_stride,
                        k_stride, Hq, Hkv, D, R, max_pos);
  return simt::launch(rotary_embedding_kernel<T, false>, grid, block, 0, stream, positions, q, k, cos_sin, q_stride,
                      k_stride, Hq, Hkv, D, R, max_pos);
}

}  // namespace mk::inline MK_ABI
