// moe_permute.cuh — token→expert permute and weighted unpermute (CUDA, framework-free).
//
// Shapes: T tokens, H hidden, E experts, k top-k, n = T·k flat entries f = t·k + j, M rows of expert_out.
//   permute:   x [T, H], ids int32 [T, k]  →  permuted [n, H], offsets int64 [E+1], inv_perm int32 [T, k]
//   unpermute: y [M, H], w fp32 [T, k], inv_perm  →  out [T, H] = Σ_j w[t, j] · y[inv_perm[t, j]]
// Layout (worked example in python/mistral_kernels/ops/moe.py): rows grouped by expert, inside an
// expert in increasing f (hence token) order. Deterministic without atomics, in three kernels:
//   1. rank:    the entries are cut into chunks of 32 (one warp each). Lane i learns, by 32 shuffles,
//               rank[f] = #{earlier lanes with the same id} and the chunk's count of its id; the first
//               lane of each id writes counts[chunk, id] (counts zero-filled by the caller).
//   2. scan:    one block; thread e walks its column: counts[c, e] ← Σ_{c' < c} counts[c', e]; the column
//               totals are exclusively scanned into offsets; then counts[c, e] += offsets[e] (row bases).
//   3. scatter: one block per entry: dest = counts[f / 32, id] + rank[f]; inv_perm[f] = dest; the row
//               x[t] is copied to permuted[dest] with 16-byte vectors.
// Ids outside [0, E) (only possible when the caller disabled the wrappers' checks) are skipped:
// memory stays safe, the output is garbage.
// Bound: memory, 2·n·H·sizeof(T) bytes for the copy; the index kernels move O(n + (n/32)·E) ints.
#pragma once

#include "../simt/portable.cuh"
#include "common.cuh"

namespace mk::inline MK_ABI {

inline constexpr int kPermuteChunk = 32;      // entries per warp in the rank kernel
inline constexpr int kPermuteMaxExperts = 4096;  // scan kernel: E int64 totals in shared memory

__global__ void __launch_bounds__(256)
moe_rank_kernel(int32_t* __restrict__ counts, int32_t* __restrict__ rank, const int32_t* __restrict__ ids,
                int64_t n, int E) {
  const int lane = threadIdx.x & 31;
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (chunk * kPermuteChunk >= n) return;  // whole warp
  const int64_t f = chunk * kPermuteChunk + lane;
  const int id = f < n ? ids[f] : -1;
  int before = 0, total = 0;
  for (int src = 0; src < 32; ++src) {
    const int other = simt::shfl(id, src);
    if (other == id) {
      before += src < lane;
      ++total;
    }
  }
  if (f < n && id >= 0 && id < E) {
    rank[f] = before;
    if (before == 0) counts[chunk * E + id] = total;
  }
}

// One block; offsets_smem: E int64 of dynamic shared memory.
__global__ void __launch_bounds__(256)
moe_scan_kernel(int64_t* __restrict__ offsets, int32_t* __restrict__ counts, int64_t num_chunks, int E) {
  SIMT_DYN_SMEM(int64_t, totals);
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int64_t running = 0;
    for (int64_t c = 0; c < num_chunks; ++c) {
      const int32_t v = counts[c * E + e];
      counts[c * E + e] = static_cast<int32_t>(running);
      running += v;
    }
    totals[e] = running;
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // E ≤ 4096 serial adds: noise next to the column walks above
    int64_t acc = 0;
    for (int e = 0; e < E; ++e) {
      const int64_t v = totals[e];
      totals[e] = acc;
      offsets[e] = acc;
      acc += v;
    }
    offsets[E] = acc;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    const int64_t base = totals[e];
    for (int64_t c = 0; c < num_chunks; ++c) counts[c * E + e] += static_cast<int32_t>(base);
  }
}

template <typename T, int VEC>
__global__ void __launch_bounds__(128)
moe_scatter_kernel(T* __restrict__ permuted, int32_t* __restrict__ inv_perm, const T* __restrict__ x,
                   const int32_t* __restrict__ ids, const int32_t* __restrict__ bases,
                   const int32_t* __restrict__ rank, int64_t k, int64_t H, int E) {
  using V = Vec<T, VEC>;
  const int64_t f = blockIdx.x;
  const int id = ids[f];
  if (id < 0 || id >= E) return;  // whole block
  const int64_t dest = static_cast<int64_t>(bases[(f / kPermuteChunk) * E + id]) + rank[f];
  if (threadIdx.x == 0) inv_perm[f] = static_cast<int32_t>(dest);
  const V* src = reinterpret_cast<const V*>(x + (f / k) * H);
  V* dst = reinterpret_cast<V*>(permuted + dest * H);
  for (int64_t i = threadIdx.x; i < H / VEC; i += blockDim.x) dst[i] = src[i];
}

// counts: zero-filled int32 [ceil(n/32), E]; rank: int32 [n] workspace.
template <typename T>
cudaError_t launch_moe_permute(T* permuted, int64_t* offsets, int32_t* inv_perm, int32_t* counts, int32_t* rank,
                               const T* x, const int32_t* ids, int64_t num_tokens, int64_t k, int64_t H, int E,
                               cudaStream_t stream) {
  if (E < 1 || E > kPermuteMaxExperts) return cudaErrorInvalidValue;
  const int64_t n = num_tokens * k, num_chunks = ceil_div(n, kPermuteChunk);
  cudaError_t err = cudaSuccess;
  if (n > 0) {
    err = simt::launch(moe_rank_kernel, dim3(static_cast<unsigned>(ceil_div(num_chunks, 8))), dim3(256), 0, stream,
                       counts, rank, ids, n, E);
    if (err != cudaSuccess) return err;
  }
  // Always run the scan: it also writes offsets (all zero for n = 0).
  err = simt::launch(moe_scan_kernel, dim3(1), dim3(256), sizeof(int64_t) * E, stream, offsets, counts, num_chunks, E);
  if (err != cudaSuccess || n == 0) return err;
  constexpr int VV = kVec16<T>;
  const dim3 grid(static_cast<unsigned>(n)), block(128);
  if (H % VV == 0 && aligned16(permuted) && aligned16(x))
    return simt::launch(moe_scatter_kernel<T, VV>, grid, block, 0, stream, permuted, inv_perm, x, ids, counts, rank,
                        k, H, E);
  return simt::launch(moe_scatter_kernel<T, 1>, grid, block, 0, stream, permuted, inv_perm, x, ids, counts, rank, k,
                      H, E);
}

// out [T, H]: grid (ceil(H / (128·VEC)), T); fp32 accumulation in j order; rows outside [0, M) skipped.
template <typename T, int VEC>
__global__ void __launch_bounds__(128)
moe_unpermute_kernel(T* __restrict__ out, const T* __restrict__ y, const float* __restrict__ w,
                     const int32_t* __restrict__ inv_perm, int64_t k, int64_t H, int64_t M) {
  using V = Vec<T, VEC>;
  const int64_t t = blockIdx.y;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;  // vector index
  if (i >= H / VEC) return;
  float acc[VEC];
#pragma unroll
  for (int v = 0; v < VEC; ++v) acc[v] = 0.f;
  for (int64_t j = 0; j < k; ++j) {
    const int64_t r = inv_perm[t * k + j];
    if (r < 0 || r >= M) continue;
    const float wj = w[t * k + j];
    const V a = reinterpret_cast<const V*>(y + r * H)[i];
#pragma unroll
    for (int v = 0; v < VEC; ++v) acc[v] += wj * simt::to_float(a.v[v]);
  }
  V o;
#pragma unroll
  for (int v = 0; v < VEC; ++v) o.v[v] = simt::from_float<T>(acc[v]);
  reinterpret_cast<V*>(out + t * H)[i] = o;
}

template <typename T>
cudaError_t launch_moe_unpermute(T* out, const T* y, const float* w, const int32_t* inv_perm, int64_t num_tokens,
                                 int64_t k, int64_t H, int64_t M, cudaStream_t stream) {
  if (num_tokens == 0 || H == 0) return cudaSuccess;
  if (num_tokens > 65535) return cudaErrorInvalidConfiguration;  // grid.y: the glue launches in chunks
  constexpr int VV = kVec16<T>;
  const bool vec_ok = H % VV == 0 && aligned16(out) && aligned16(y);
  const int64_t work = vec_ok ? H / VV : H;
  const dim3 grid(static_cast<unsigned>(ceil_div(work, 128)), static_cast<unsigned>(num_tokens)), block(128);
  if (vec_ok)
    return simt::launch(moe_unpermute_kernel<T, VV>, grid, block, 0, stream, out, y, w, inv_perm, k, H, M);
  return simt::launch(moe_unpermute_kernel<T, 1>, grid, block, 0, stream, out, y, w, inv_perm, k, H, M);
}

}  // namespace mk::inline MK_ABI
