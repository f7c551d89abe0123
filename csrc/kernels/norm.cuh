// norm.cuh — RMSNorm and fused residual-add + RMSNorm (CUDA, framework-free).
//
// Shapes: R rows, H hidden.  x, out, residual: [R, H] contiguous; weight: [H].
// One block per row; every thread strides over the row in 16-byte vectors when H and the
// pointers allow it (VEC = 16 / sizeof(T)), else one element at a time (VEC = 1).
// Sum of squares in fp32, block-reduced through shared memory.
//
// fused_add_rms_norm rounding: residual_new = round_T(float(x) + float(residual)) is what is
// stored AND what is normalised, so the residual stream carries exactly one rounding per layer
// (the same as an unfused `residual = x + residual; x = rms_norm(residual)` in dtype T).
//
// Bound: memory. rms_norm moves 2·R·H·sizeof(T) bytes (read x, write out; the second pass over
// x hits L1/L2), fused moves 4·R·H·sizeof(T) — at 2 TB/s (A100) a 4096-wide bf16 row costs ~8 ns.
#pragma once

#include "../simt/portable.cuh"
#include "common.cuh"

namespace mk::inline MK_ABI {

template <typename T, int VEC, bool FUSED_ADD>
__global__ void __launch_bounds__(1024)
rms_norm_kernel(T* out, T* __restrict__ residual, const T* x,  // out may alias x (fused, in place)
                const T* __restrict__ weight, int64_t H, float eps) {
  __shared__ float scratch[32];
  using V = Vec<T, VEC>;
  const int64_t row = blockIdx.x;
  const int64_t nvec = H / VEC;
  const V* xv = reinterpret_cast<const V*>(x + row * H);
  V* rv = reinterpret_cast<V*>(residual + row * H);  // only dereferenced when FUSED_ADD
  const V* wv = reinterpret_cast<const V*>(weight);
  V* ov = reinterpret_cast<V*>(out + row * H);

  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) {
    V a = xv[i];
    if constexpr (FUSED_ADD) {
      V r = rv[i];
#pragma unroll
      for (int j = 0; j < VEC; ++j) a.v[j] = simt::from_float<T>(simt::to_float(a.v[j]) + simt::to_float(r.v[j]));
      rv[i] = a;
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float f = simt::to_float(a.v[j]);
      ss += f * f;
    }
  }
  const float inv_rms = rsqrtf(simt::block_sum(ss, scratch) / static_cast<float>(H) + eps);

  for (int64_t i = threadIdx.x; i < nvec; i += blockDim.x) {
    // In the fused case this thread wrote rv[i] itself above: no barrier needed to read it back.
    const V a = FUSED_ADD ? rv[i] : xv[i];
    const V w = wv[i];
    V o;
#pragma unroll
    for (int j = 0; j < VEC; ++j)
      o.v[j] = simt::from_float<T>(simt::to_float(a.v[j]) * inv_rms * simt::to_float(w.v[j]));
    ov[i] = o;
  }
}

// out = rms_norm(x) (FUSED_ADD=false), or residual += x; x_out = rms_norm(residual) (true, out == x allowed).
template <typename T, bool FUSED_ADD>
cudaError_t launch_rms_norm(T* out, T* residual, const T* x, const T* weight, int64_t rows, int64_t H,
                            float eps, cudaStream_t stream) {
  if (rows == 0 || H == 0) return cudaSuccess;
  constexpr int V = kVec16<T>;
  const bool vec_ok = H % V == 0 && aligned16(out) && aligned16(x) && aligned16(weight) &&
                      (!FUSED_ADD || aligned16(residual));
  const int64_t work = vec_ok ? H / V : H;
  // Enough threads to cover the row once, rounded to whole warps, capped at 1024.
  int threads = static_cast<int>(ceil_div(work < 1024 ? work : 1024, 32) * 32);
  const dim3 grid(static_cast<unsigned>(rows)), block(static_cast<unsigned>(threads));
  if (vec_ok)
    return simt::launch(rms_norm_kernel<T, V, FUSED_ADD>, grid, block, 0, stream, out, residual, x, weight, H, eps);
  return simt::launch(rms_norm_kernel<T, 1, FUSED_ADD>, grid, block, 0, stream, out, residual, x, weight, H, eps);
}

}  // namespace mk::inline MK_ABI
