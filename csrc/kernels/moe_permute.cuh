// moe_permute.cuh — token→expert permute and weighted unpermute (CUDA, framework-free).
//
// Shapes: T tokens, H hidden, E experts, k top-k, n = T·k flat entries f = t·k + j, M rows of expert_out.
//   permute:   x [T, H], ids int32 [T, k]  →  permuted [n, H], offsets int64 [E+1], inv_perm int32 [T, k]
//   unpermute: y [M, H], w fp32 [T, k], inv_perm  →  out [T, H] = Σ_j w[t, j] · y[inv_perm[t, j]]
// Layout (worked example in python/mistral_kernels/ops/moe.py): rows grouped by expert, inside an
// expert in increasing f (hence token) order. Deterministic without atomics; C = ceil(n / 32) chunks of 32
// entries; counts int32 [E, C] (expert-major, zero-filled by the caller):
//   1. rank:    one warp per chunk. Lane i learns, by 32 shuffles, rank[f] = #{earlier lanes with the same
//               id} and the chunk's count of its id; the first lane of each id writes counts[id, chunk].
//   2. columns: one warp per expert (8 per block), over its row of counts 32 chunks at a time: a shuffle
//               scan turns counts[e, c] into Σ_{c' < c} counts[e, c'] in place (coalesced), and the total
//               lands in offsets[e + 1].
//   3. offsets: one block scans offsets[1..E] in place into the exclusive expert bases (offsets[0] = 0):
//               each thread sums ≤ 16 consecutive totals, a shuffle scan per warp, then the 8 warp sums.
//               When E ≤ kPermuteFusedExperts the columns kernel runs as one block and does this step itself
//               after a __syncthreads (decode: one launch less).
//   4. scatter: one block per entry: dest = offsets[id] + counts[id, f / 32] + rank[f]; inv_perm[f] = dest;
//               the row x[t] is copied to permuted[dest] with 16-byte vectors.
// Ids outside [0, E) (only possible when the caller disabled the wrappers' checks) are skipped:
// memory stays safe, the output is garbage.
// Bound: memory, 2·n·H·sizeof(T) bytes for the copy; the index kernels move O(n + C·E) ints, the columns
// kernel with E·ceil(C / 32) warp steps spread over E warps (Mixtral prefill of 4096 tokens, k = 2: C = 256,
// 8 steps per warp), where one thread per expert used to walk C chunks serially. Shared memory: 64 bytes
// (the offsets scan's 8 warp sums), no dynamic shared memory; 256-thread blocks, a few registers each.
#pragma once

#include "../simt/portable.cuh"
#include "common.cuh"

namespace mk::inline MK_ABI {

inline constexpr int kPermuteChunk = 32;          // entries per warp in the rank kernel
inline constexpr int kPermuteMaxExperts = 4096;   // offsets kernel: ≤ 16 totals per thread of 256
inline constexpr int kPermuteScanWarps = 8;       // warps (experts in flight) per columns block
inline constexpr int kPermuteFusedExperts = 32;   // up to this E, columns + offsets run as one block

__global__ void __launch_bounds__(256)
moe_rank_kernel(int32_t* __restrict__ counts, int32_t* __restrict__ rank, const int32_t* __restrict__ ids,
                int64_t n, int64_t num_chunks, int E) {
  const int lane = threadIdx.x & 31;
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (chunk >= num_chunks) return;  // whole warp
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
    if (before == 0) counts[static_cast<int64_t>(id) * num_chunks + chunk] = total;
  }
}

// offsets[1..E] (totals) → inclusive prefix sums in place, offsets[0] = 0: offsets[e] is expert e's first row.
// Every thread of the block calls it (256 threads, E ≤ kPermuteMaxExperts).
__device__ __forceinline__ void moe_scan_offsets_block(int64_t* __restrict__ offsets, int E) {
  __shared__ int64_t warp_sums[8];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int per = (E + 255) / 256;  // consecutive totals owned by one thread
  const int e0 = min(E, tid * per), e1 = min(E, e0 + per);
  int64_t own = 0;
  for (int e = e0; e < e1; ++e) own += offsets[e + 1];
  int64_t incl = own;  // inclusive scan over the warp's lanes
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int64_t up = simt::shfl_up(incl, d);
    if (lane >= d) incl += up;
  }
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  int64_t base = incl - own;
  for (int w = 0; w < warp; ++w) base += warp_sums[w];
  for (int e = e0; e < e1; ++e) {  // only this thread reads or writes offsets[e0 + 1 .. e1]
    base += offsets[e + 1];
    offsets[e + 1] = base;
  }
  if (tid == 0) offsets[0] = 0;
}

// Grid: 1 block (fuse_offsets, E ≤ kPermuteFusedExperts) or ceil(E / 8) blocks; 256 threads, warp w of
// block b takes experts e = 8·b + w, e += 8·gridDim.x.
__global__ void __launch_bounds__(256)
moe_columns_kernel(int64_t* __restrict__ offsets, int32_t* __restrict__ counts, int64_t num_chunks, int E,
                   bool fuse_offsets) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int e = blockIdx.x * kPermuteScanWarps + warp; e < E; e += gridDim.x * kPermuteScanWarps) {
    int32_t* row = counts + static_cast<int64_t>(e) * num_chunks;
    int64_t running = 0;  // Σ of the chunks before c0
    for (int64_t c0 = 0; c0 < num_chunks; c0 += 32) {  // uniform over the warp
      const int64_t c = c0 + lane;
      const int32_t v = c < num_chunks ? row[c] : 0;
      int32_t incl = v;
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const int32_t up = simt::shfl_up(incl, d);
        if (lane >= d) incl += up;
      }
      if (c < num_chunks) row[c] = static_cast<int32_t>(running + incl - v);
      running += simt::shfl(incl, 31);
    }
    if (lane == 0) offsets[e + 1] = running;
  }
  if (!fuse_offsets) return;  // whole grid (a kernel argument)
  __syncthreads();
  moe_scan_offsets_block(offsets, E);
}

__global__ void __launch_bounds__(256) moe_offsets_kernel(int64_t* __restrict__ offsets, int E) {
  moe_scan_offsets_block(offsets, E);
}

template <typename T, int VEC>
__global__ void __launch_bounds__(128)
moe_scatter_kernel(T* __restrict__ permuted, int32_t* __restrict__ inv_perm, const T* __restrict__ x,
                   const int32_t* __restrict__ ids, const int64_t* __restrict__ offsets,
                   const int32_t* __restrict__ bases, const int32_t* __restrict__ rank, int64_t k, int64_t H,
                   int64_t num_chunks, int E) {
  using V = Vec<T, VEC>;
  const int64_t f = blockIdx.x;
  const int id = ids[f];
  if (id < 0 || id >= E) return;  // whole block
  const int64_t dest = offsets[id] + bases[static_cast<int64_t>(id) * num_chunks + f / kPermuteChunk] + rank[f];
  if (threadIdx.x == 0) inv_perm[f] = static_cast<int32_t>(dest);
  const V* src = reinterpret_cast<const V*>(x + (f / k) * H);
  V* dst = reinterpret_cast<V*>(permuted + dest * H);
  for (int64_t i = threadIdx.x; i < H / VEC; i += blockDim.x) dst[i] = src[i];
}

// counts: zero-filled int32 [E, ceil(n / 32)]; rank: int32 [n] workspace.
template <typename T>
cudaError_t launch_moe_permute(T* permuted, int64_t* offsets, int32_t* inv_perm, int32_t* counts, int32_t* rank,
                               const T* x, const int32_t* ids, int64_t num_tokens, int64_t k, int64_t H, int E,
                               cudaStream_t stream) {
  if (E < 1 || E > kPermuteMaxExperts) return cudaErrorInvalidValue;
  const int64_t n = num_tokens * k, num_chunks = ceil_div(n, kPermuteChunk);
  cudaError_t err = cudaSuccess;
  if (n > 0) {
    err = simt::launch(moe_rank_kernel, dim3(static_cast<unsigned>(ceil_div(num_chunks, 8))), dim3(256), 0, stream,
                       counts, rank, ids, n, num_chunks, E);
    if (err != cudaSuccess) return err;
  }
  // Always scan: it also writes offsets (all zero for n = 0).
  const bool fused = E <= kPermuteFusedExperts;
  const unsigned col_blocks = fused ? 1u : static_cast<unsigned>(ceil_div(E, kPermuteScanWarps));
  err = simt::launch(moe_columns_kernel, dim3(col_blocks), dim3(32 * kPermuteScanWarps), 0, stream, offsets, counts,
                     num_chunks, E, fused);
  if (err == cudaSuccess && !fused)
    err = simt::launch(moe_offsets_kernel, dim3(1), dim3(256), 0, stream, offsets, E);
  if (err != cudaSuccess || n == 0) return err;
  constexpr int VV = kVec16<T>;
  const dim3 grid(static_cast<unsigned>(n)), block(128);
  if (H % VV == 0 && aligned16(permuted) && aligned16(x))
    return simt::launch(moe_scatter_kernel<T, VV>, grid, block, 0, stream, permuted, inv_perm, x, ids, offsets,
                        counts, rank, k, H, num_chunks, E);
  return simt::launch(moe_scatter_kernel<T, 1>, grid, block, 0, stream, permuted, inv_perm, x, ids, offsets, counts,
                      rank, k, H, num_chunks, E);
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
