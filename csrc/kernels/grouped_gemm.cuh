// grouped_gemm.cuh — grouped "NT" GEMM over row segments whose bounds stay on the device (CUDA,
// framework-free). Used by fused_moe for the router and the expert projections.
//
// Shapes: M rows, G groups, N outputs, K reduction.
//   A [M, K] (row stride lda), W [G, N, K] contiguous, offsets int64 [G+1] on the device
//   (nullptr: one group covering [0, M)), C [M, ·] (row stride ldc).
//   C[r, n] = Σ_κ A[r, κ] · W[g, n, κ]   for offsets[g] ≤ r < offsets[g+1]
// Tiles BM × BN, K in steps of BK through shared memory (fp32), fp32 accumulation, 256 threads as 16 × 16,
// thread (ty, tx) owning rows ty + 16·i and columns tx + 16·j (conflict-free shared reads).
// Tile scheduler, no host sync: grid.y strides over "slots" = an upper bound of the M-tiles of all groups,
// grouped_slots = floor(M / BM) + min(G, M); each block walks the offsets (grouped_tile) to map its slot to
// (group, first row) and exits when the slot lies past the last tile. Empty groups cost one offsets walk
// per block. fp16 / bf16 expert projections run grouped_gemm_tc.cuh (tensor cores) where it applies.
// BM = 16 for decode-sized segments (≤ 16 rows per group), 64 otherwise.
// Bound: a SIMT kernel (no tensor cores): for decode it streams the touched experts' weights once
// (memory-bound, ~N·K·sizeof(T) per group hit); for prefill it reaches a fraction of the FMA peak.
#pragma once

#include "../simt/portable.cuh"
#include "common.cuh"

namespace mk::inline MK_ABI {

// The tile scheduler of the grouped GEMMs (this file and grouped_gemm_tc.cuh), written once: M-tile `slot`
// (counted over the groups in order, ceil(rows_g / BM) tiles each) → its group g and rows [row0, row_end),
// row_end the end of g's segment; false when slot lies past the last tile. Offsets are clamped into [0, M],
// so a corrupt offsets tensor can only mis-assign rows, never reach outside A or C.
// offsets = nullptr: one group covering [0, M).
// Example: offsets [0, 3, 3, 40], BM 16 → slot 0: g 0 rows [0, 3); slot 1: g 2 rows [3, 19); slot 2: g 2
// rows [19, 35) (row_end 40); slot 3: g 2 rows [35, 40); slot 4: false.
MK_HD bool grouped_tile(const int64_t* offsets, int G, int64_t M, int BM, int64_t slot, int& g, int64_t& row0,
                        int64_t& row_end) {
  int64_t seen = 0;
  for (int gg = 0; gg < G; ++gg) {
    int64_t lo = offsets ? offsets[gg] : 0, hi = offsets ? offsets[gg + 1] : M;
    lo = lo < 0 ? 0 : (lo > M ? M : lo);
    hi = hi < lo ? lo : (hi > M ? M : hi);
    const int64_t tiles = (hi - lo + BM - 1) / BM;
    if (slot < seen + tiles) {
      g = gg;
      row0 = lo + (slot - seen) * BM;
      row_end = hi;
      return true;
    }
    seen += tiles;
  }
  return false;
}

// Upper bound of the M-tiles over all groups (the grid's slot count). With offsets: a segment of r rows has
// ceil(r / BM) ≤ floor(r / BM) + 1 tiles, the floors sum to at most floor(M / BM) and at most min(G, M)
// segments are non-empty (segments are disjoint: the wrappers check offsets). Decode T = 1, k = 2: M = 2 →
// 0 + 2 slots, both used.
MK_HD int64_t grouped_slots(int64_t M, int64_t G, int BM, bool has_offsets) {
  return has_offsets ? M / BM + (G < M ? G : M) : ceil_div(M, BM);
}

inline constexpr int kGemmThreads = 256;
inline constexpr int kGemmBK = 32;

template <typename T, int BM, int BN>
__global__ void __launch_bounds__(kGemmThreads)
grouped_gemm_nt_kernel(T* __restrict__ C, int64_t ldc, const T* __restrict__ A, int64_t lda, const T* __restrict__ W,
                       const int64_t* __restrict__ offsets, int G, int64_t M, int64_t N, int64_t K, int64_t slots) {
  constexpr int BK = kGemmBK, TM = BM / 16, TN = BN / 16;
  __shared__ float As[BK][BM + 1];
  __shared__ float Ws[BK][BN + 1];
  const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * BN;

  for (int64_t slot = blockIdx.y; slot < slots; slot += gridDim.y) {
    // slot → (group, row0): every thread computes the same answer, so the exit below is block-uniform.
    int g;
    int64_t row0, row_end;
    if (!grouped_tile(offsets, G, M, BM, slot, g, row0, row_end)) break;  // past the last tile

    const T* Wg = W + static_cast<int64_t>(g) * N * K;
    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;

    for (int64_t k0 = 0; k0 < K; k0 += BK) {
      for (int idx = threadIdx.x; idx < BM * BK; idx += kGemmThreads) {
        const int rr = idx / BK, kk = idx % BK;
        const int64_t r = row0 + rr, kg = k0 + kk;
        As[kk][rr] = (r < row_end && kg < K) ? simt::to_float(A[r * lda + kg]) : 0.f;
      }
      for (int idx = threadIdx.x; idx < BN * BK; idx += kGemmThreads) {
        const int nn = idx / BK, kk = idx % BK;
        const int64_t n = n0 + nn, kg = k0 + kk;
        Ws[kk][nn] = (n < N && kg < K) ? simt::to_float(Wg[n * K + kg]) : 0.f;
      }
      __syncthreads();
#pragma unroll 4
      for (int kk = 0; kk < BK; ++kk) {
        float a[TM], b[TN];
#pragma unroll
        for (int i = 0; i < TM; ++i) a[i] = As[kk][ty + 16 * i];
#pragma unroll
        for (int j = 0; j < TN; ++j) b[j] = Ws[kk][tx + 16 * j];
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
          for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
      }
      __syncthreads();  // before the next tile overwrites As / Ws
    }
#pragma unroll
    for (int i = 0; i < TM; ++i) {
      const int64_t r = row0 + ty + 16 * i;
      if (r >= row_end) continue;
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        const int64_t n = n0 + tx + 16 * j;
        if (n < N) C[r * ldc + n] = simt::from_float<T>(acc[i][j]);
      }
    }
  }
}

// max_group_rows: an upper bound of any group's row count known on the host (fused_moe: T, since a token
// picks an expert at most once) — it only selects the tile height.
template <typename T>
cudaError_t launch_grouped_gemm_nt(T* C, int64_t ldc, const T* A, int64_t lda, const T* W, const int64_t* offsets,
                                   int G, int64_t M, int64_t max_group_rows, int64_t N, int64_t K,
                                   cudaStream_t stream) {
  if (M == 0 || N == 0) return cudaSuccess;
  if (G < 1) return cudaErrorInvalidValue;
  constexpr int BN = 64;
  const dim3 block(kGemmThreads);
  const int64_t n_tiles = ceil_div(N, BN);
  if (n_tiles > 0x7fffffff) return cudaErrorInvalidConfiguration;
  auto go = [&](auto kernel, int BM) {
    const int64_t slots = grouped_slots(M, G, BM, offsets != nullptr);
    const dim3 grid(static_cast<unsigned>(n_tiles), static_cast<unsigned>(slots < 65535 ? slots : 65535));
    return simt::launch(kernel, grid, block, 0, stream, C, ldc, A, lda, W, offsets, G, M, N, K, slots);
  };
  if (max_group_rows <= 16) return go(grouped_gemm_nt_kernel<T, 16, BN>, 16);
  return go(grouped_gemm_nt_kernel<T, 64, BN>, 64);
}

}  // namespace mk::inline MK_ABI
