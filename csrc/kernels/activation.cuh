// activation.cuh — SwiGLU gate: out = silu(x[..., :I]) * x[..., I:] (CUDA, framework-free).
//
// Shapes: R rows, I intermediate.  x: [R, 2I] contiguous; out: [R, I] contiguous.
// Grid (ceil(I / (256·VEC)), R): a row is split over several blocks so that decode (R = 1,
// I = 14336) still fills the GPU. 16-byte vectors when I and the pointers allow, else scalar.
// silu(a) = a / (1 + exp(-a)) computed in fp32.
// Bound: memory, 3·R·I·sizeof(T) bytes.
#pragma once

#include "../simt/portable.cuh"
#include "common.cuh"

namespace mk::inline MK_ABI {

// The SwiGLU rule, written once (also the epilogue of grouped_gemm_tc.cuh): silu(gate) · up in fp32.
__device__ __forceinline__ float swiglu(float gate, float up) { return gate / (1.f + expf(-gate)) * up; }

template <typename T, int VEC>
__global__ void __launch_bounds__(256)
silu_and_mul_kernel(T* __restrict__ out, const T* __restrict__ x, int64_t I) {
  using V = Vec<T, VEC>;
  const int64_t row = blockIdx.y;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;  // vector index
  if (i >= I / VEC) return;
  const V a = reinterpret_cast<const V*>(x + row * 2 * I)[i];
  const V b = reinterpret_cast<const V*>(x + row * 2 * I + I)[i];
  V o;
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    o.v[j] = simt::from_float<T>(swiglu(simt::to_float(a.v[j]), simt::to_float(b.v[j])));
  }
  reinterpret_cast<V*>(out + row * I)[i] = o;
}

template <typename T>
cudaError_t launch_silu_and_mul(T* out, const T* x, int64_t rows, int64_t I, cudaStream_t stream) {
  if (rows == 0 || I == 0) return cudaSuccess;
  if (rows > 65535) return cudaErrorInvalidConfiguration;  // glue splits larger batches
  constexpr int V = kVec16<T>;
  const bool vec_ok = I % V == 0 && aligned16(out) && aligned16(x);
  const int64_t work = vec_ok ? I / V : I;
  const int threads = 256;
  const dim3 grid(static_cast<unsigned>(ceil_div(work, threads)), static_cast<unsigned>(rows));
  if (vec_ok) return simt::launch(silu_and_mul_kernel<T, V>, grid, dim3(threads), 0, stream, out, x, I);
  return simt::launch(silu_and_mul_kernel<T, 1>, grid, dim3(threads), 0, stream, out, x, I);
}

}  // namespace mk::inline MK_ABI
