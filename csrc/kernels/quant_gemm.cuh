// quant_gemm.cuh — dequantizing tile GEMM (CUDA, framework-free): out [M, N] = x [M, K] · Wᵀ with W [N, K] in
// a quantized format of quant_blocks.h, for any M (the glue sends kGemvMaxRows < M ≤ kQGemmDequantRows here:
// the batched decode steps of 9–64 sequences and short prefills), and the one-pass dequantization W → T [N, K]
// the glue runs above kQGemmDequantRows before a dense GEMM (cuBLAS).
//
// Why it looks as it does (measured motivation, H200, benchmarks/results/gpu_decode.md): a Mistral-7B-shaped
// Q4_K model decoded 349 tok/s at batch 1 but 713 tok/s at batch 32 — 2 % of its weight roofline — because
// every linear at M = 32 ran here at ~170 µs on average (where reading the packed weights once takes 3–10 µs):
// one block per 64 × 64 output tile (64 blocks for N = 4096 on 132 SMs, each walking all of K) and ~880
// warp-instructions per K tile per warp, 32 of them HMMA, the rest mostly the per-unit W decode.
//
// Shapes: M rows, N out features, K in features, R packed bytes per row; BM = BN = 64 output tile, BK = 64
// (one K tile = 8 units of every weight row, quant_blocks.h), LD the padded shared row (elements), S splits.
// x, out contiguous; qweight [N, R] 4-byte aligned (kQTileAlign); x 16-byte aligned for the block formats
// (the glue copies other views); scales fp32 [N] (INT8_ROWWISE only).
//
// Grid (ceil(N / 64), ceil(M / 64), S), 4 warps; S from qgemm_plan below (split-K: about 4 blocks per SM at
// small M; the splits' fp32 partial sums go to a workspace [S][M][N] and qgemm_splitk_reduce_kernel adds them
// in split order — deterministic). Per K tile, 2 stages in shared memory:
//   X tile [BM][LD] of T: cp.async 16-byte copies, 32 consecutive elements of one row per thread from a row
//     pointer advanced by one tile per call (zero-filled past M / K; INT8_ROWWISE rows whose K·sizeof(T) is
//     not a multiple of 16 use plain loads);
//   W tile [BN][LD]: block formats — thread (r, hh) owns 32 weights of weight row r (quant_tile.cuh): the
//     loads of tile kt+1 (16-byte runs of quants, the block's scale words) are issued before the mma of tile
//     kt and decoded after it (scales once per tile, byte-parallel bit work, PRMT + I2FP + FFMA per weight,
//     16-byte shared stores); INT8_ROWWISE — 4 units per thread, gemv_unit. The packed bytes are read from
//     HBM once per M tile.
// Compute: fp16 / bf16 x → the W tile holds T (the dequantized fp32 weight rounded once to T) and each
//   warp computes a 32×32 quarter with mma.sync.m16n8k16 (fp32 accumulation): A = x rows via ldmatrix.x4,
//   B = W rows via ldmatrix.x4 (a W row is a column of Wᵀ: mma's "col" layout), the fragment helpers of
//   tc_fragments.cuh. LD = 72: a row is 36 words ≡ 4 (mod 32), conflict-free ldmatrix (the argument of
//   paged_prefill_tc.cuh's header). fp32 x → a SIMT path, no conversion: the W tile holds fp32 weights
//   (exactly gguf's values) and each thread accumulates 8 rows × 4 columns of outputs with FMAs (LD = 68).
// Shared memory: 2 stages × (BM + BN) × LD × sizeof: 16-bit 36,864 B, fp32 69,632 B (dynamic, opt-in).
// Registers (nvcc 13, sm_80 / sm_90, 0 spills; tests/test_nvcc_ptxas.py): see benchmarks/results/
// gpu_sass_budget.md (fp16 / bf16 ~110–130).
// k-loop, sm_90 SASS (nvcc 13, bf16, scripts/sass_budget.py), warp-instructions per K tile per warp (32 HMMA),
// before → after this design: Q4_K 882 → 287, Q5_K 1003 → 333, Q6_K 1018 → 390, Q4_0 666 → 266, Q4_1 679 →
// 251, Q8_0 692 → 271 (INT8_ROWWISE keeps its unit decode: 712 → 690); HMMA issue share 6·32 / instructions:
// Q4_K 22 % → 67 %.
// Estimate (from those counts, not measured; H100: 4 · 132 · 1.83 GHz ≈ 0.97·10¹² warp-instructions/s):
//   a call with M ≤ 64 issues (N / 64)·(K / 64)·4·I warp-instructions (I the count above): Q4_K 4096 × 4096
//   ≈ 4.7 M → ~5 µs, 14336 × 4096 ≈ 16.5 M → ~17 µs — issue-bound, at ~0.3 warp-instructions per weight,
//   over the 2–8 µs the packed bytes need at HBM rate; plus the workspace round trip (S·M·N·4 B through L2,
//   4 MiB at M = 32, N = 4096) and the reduce launch (~2–3 µs). So an estimated ~8 µs (4096²) and ~20 µs
//   (14336 × 4096) per Q4_K linear at M = 32, against the ~170 µs average implied by the measured decode.
//   Alternative (the path above kQGemmDequantRows): dequantize once (0.56 B read + 2 B written per Q4_K
//   weight) then cuBLAS (2 B read): ≥ 4.6 B of HBM traffic per weight, ≥ 18 µs for 4096² — the tile GEMM is
//   ahead at M ≤ 64 by an estimated 2–3×; its decode repeats per 64-row M tile, so the crossover lies near
//   M ≈ 192–256 by these counts (M = 512, 4096², Q4_K: 8 tiles × ~5 µs ≈ 41 µs vs 45 µs measured for the
//   dequantize path). kQGemmDequantRows stays 64 until bench_gpu_kernels.py's M = 64 / 65 rows measure it.
//   fp32: the CUDA-core FMA rate, like grouped_gemm.cuh.
#pragma once

#include <type_traits>

#include "../simt/portable.cuh"
#include "common.cuh"
#include "tc_fragments.cuh"
#include "quant_blocks.h"
#include "quant_gemv.cuh"
#include "quant_tile.cuh"

namespace mk::inline MK_ABI {

template <typename T>
struct QGemmTile {
  static constexpr bool TC = kTcType<T>;             // fp16 / bf16: tensor cores; fp32: SIMT
  using S = std::conditional_t<TC, T, float>;         // shared-memory element
  static constexpr int BM = 64, BN = 64, BK = 64, THREADS = 128;
  // Resident blocks per SM the registers are sized for (≤ 168 each; without the hint ptxas chose 80 and
  // spilled for fp32). Shared memory allows 4 (16-bit) / 2 (fp32) blocks on A100.
  static constexpr int MIN_BLOCKS = 3;
  static constexpr int LD = BK + (TC ? 8 : 4);
  static constexpr int VE = 16 / static_cast<int>(sizeof(T));  // x elements per 16-byte copy
  static constexpr size_t stage_elems = static_cast<size_t>(BM + BN) * LD;
  static constexpr size_t smem_bytes() { return 2 * stage_elems * sizeof(S); }
};

// Four floats → the smem tile at `dst` (4 consecutive elements, 8- or 16-byte aligned).
template <typename S>
__device__ __forceinline__ void qgemm_store4(S* dst, float a, float b, float c, float d) {
  if constexpr (std::is_same_v<S, float>) {
    *reinterpret_cast<float4*>(dst) = make_float4(a, b, c, d);
  } else {
    *reinterpret_cast<uint2*>(dst) = make_uint2(tc_pack<S>(a, b), tc_pack<S>(c, d));
  }
}

// 16 floats → 16 consecutive smem elements at `dst` (16-byte aligned): two (16-bit S) or four (fp32) 16-byte
// stores.
template <typename S>
__device__ __forceinline__ void qgemm_store16(S* dst, const float (&y)[16]) {
  if constexpr (std::is_same_v<S, float>) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
      reinterpret_cast<float4*>(dst)[i] = make_float4(y[4 * i], y[4 * i + 1], y[4 * i + 2], y[4 * i + 3]);
  } else {
#pragma unroll
    for (int i = 0; i < 2; ++i)
      reinterpret_cast<uint4*>(dst)[i] = make_uint4(tc_pack<S>(y[8 * i], y[8 * i + 1]), tc_pack<S>(y[8 * i + 2], y[8 * i + 3]),
                                                    tc_pack<S>(y[8 * i + 4], y[8 * i + 5]),
                                                    tc_pack<S>(y[8 * i + 6], y[8 * i + 7]));
  }
}

// One block's output tile (quant_gemm_kernel, and the grouped moe_qgemm_kernel of moe_qgemm.cuh): rows
// m0 … m0+63 below M of x (row stride K) times weight rows n0 … n0+63 below N of w, over the K tiles
// kt_begin … kt_end-1 (kt_end < 0: all), written to out (row stride ldo) — or, with `partial` set, the fp32
// sums to partial (same indexing) for the split-K reduce.
template <typename T, int32_t QT>
__device__ __forceinline__ void quant_gemm_tile(T* __restrict__ out, int64_t ldo, const T* __restrict__ x,
                                                const uint8_t* __restrict__ w, const float* __restrict__ scales,
                                                int64_t M, int64_t N, int64_t K, int64_t R, bool x_vec, int64_t m0,
                                                int64_t n0, int64_t kt_begin = 0, int64_t kt_end = -1,
                                                float* __restrict__ partial = nullptr) {
  using C = QGemmTile<T>;
  using S = typename C::S;
  constexpr int BM = C::BM, BN = C::BN, BK = C::BK, LD = C::LD, VE = C::VE, THREADS = C::THREADS;
  SIMT_DYN_SMEM(S, smem);  // [2 stages][X [BM][LD], W [BN][LD]]
  const int tid = threadIdx.x;
  const int64_t KT = kt_end < 0 ? ceil_div(K, BK) : kt_end;

  // X tile kt → stage st (x_vec: cp.async, committed by the caller). Vector copies: thread (xr, xh) =
  // (tid / 2, tid % 2) copies the 32 elements xh·32 … +31 of tile row xr as XN consecutive 16-byte vectors
  // from one row pointer (set once, advanced by BK per tile: immediate offsets, one predicate for a block
  // format, whose K % 32 == 0 puts the 32 elements all in or all out). The block formats always take this path
  // (the launcher requires x 16-byte aligned): their hot loop carries no elementwise fallback.
  constexpr int XN = 32 / VE;  // vectors per thread: 4 (16-bit), 8 (fp32)
  constexpr bool kTile = kQTileFormat<QT>;
  const int xr = tid >> 1, xh = tid & 1;
  // load_x visits the tiles kt_begin, kt_begin + 1, … in order (rows ≥ M point into row 0, copy no byte)
  const bool xrow_ok = m0 + xr < M;
  int64_t xk = kt_begin * BK + 32 * xh;
  const T* xp = x + (xrow_ok ? (m0 + xr) * K : 0) + xk;
  auto load_x = [&](int64_t kt, int st) {
    S* Xs = smem + st * C::stage_elems;
    const int64_t k0 = kt * BK;
    if (kTile || x_vec) {
#pragma unroll
      for (int j = 0; j < XN; ++j) {
        const bool ok = xrow_ok && (kTile ? xk < K : xk + VE * j < K);  // x_vec: K % VE == 0
        simt::cp_async_16_zfill(Xs + xr * LD + 32 * xh + VE * j, xp + VE * j, ok ? 16u : 0u);
      }
      xp += BK;
      xk += BK;
    } else {
      for (int idx = tid; idx < BM * BK; idx += THREADS) {
        const int r = idx / BK, c = idx % BK;
        const int64_t m = m0 + r, k = k0 + c;
        const float v = m < M && k < K ? simt::to_float(x[m * K + k]) : 0.f;
        if constexpr (C::TC) Xs[r * LD + c] = simt::from_float<S>(v);
        else Xs[r * LD + c] = v;
      }
    }
  };
  // W tile, block formats (quant_tile.cuh): thread (r, hh) = (tid / 2, tid % 2) owns 32 weights of weight row
  // n0 + r; fetch_w issues the loads of tile kt into registers, store_w decodes them into stage st. Blocks ≥ K
  // hold ±0 (x is 0 there too).
  const int wr = tid >> 1, whh = tid & 1;
  const uint8_t* wrow = w + (n0 + wr < N ? n0 + wr : N - 1) * R;  // rows past N: row N-1 again, never stored
  QTileRaw raw;
  auto fetch_w = [&](int64_t kt) {
    if constexpr (kTile) qtile_fetch<QT>(wrow, static_cast<int>(kt), whh, K, raw);  // K < 2^31: kt is int
  };
  // INT8_ROWWISE: 8 units per weight row, 4 per thread, decoded at store time (units past K read as 0).
  auto store_w = [&](int64_t kt, int st) {
    S* Ws = smem + st * C::stage_elems + BM * LD;
    if constexpr (kTile) {
      float ya[16], yb[16];
      qtile_decode<QT>(raw, static_cast<int>(kt), ya, yb);
      qgemm_store16(Ws + wr * LD + qtile_run_a<QT>(whh), ya);
      qgemm_store16(Ws + wr * LD + qtile_run_b<QT>(whh), yb);
    } else {
#pragma unroll
      for (int i = 0; i < BN * 8 / THREADS; ++i) {
        const int idx = tid + i * THREADS, r = idx / 8, v = idx % 8;
        const int64_t n = n0 + r;
        const int U = static_cast<int>(kt) * 8 + v;  // K < 2^31 (the launcher's rule)
        float y[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        if (n < N && U * 8 < K) gemv_unit<QT>(w + n * R, U, K, scales[n], y);
        qgemm_store4(Ws + r * LD + 8 * v, y[0], y[1], y[2], y[3]);
        qgemm_store4(Ws + r * LD + 8 * v + 4, y[4], y[5], y[6], y[7]);
      }
    }
  };

  const int lane = tid & 31, warp = tid >> 5;
  // TC: warp (wm, wn) owns rows 32·wm … +31 and columns 32·wn … +31, 2 × 4 mma tiles.
  // SIMT: thread (ty, tx) = (tid / 16, tid % 16) owns rows ty + 8i (i < 8) and columns tx + 16j (j < 4).
  constexpr int A0 = C::TC ? 2 : 8, A1 = 4, A2 = C::TC ? 4 : 1;
  float acc[A0][A1][A2];
#pragma unroll
  for (int i = 0; i < A0; ++i)
#pragma unroll
    for (int j = 0; j < A1; ++j)
#pragma unroll
      for (int e = 0; e < A2; ++e) acc[i][j][e] = 0.f;

  load_x(kt_begin, 0);
  fetch_w(kt_begin);
  store_w(kt_begin, 0);
  simt::cp_async_commit();
  for (int64_t kt = kt_begin; kt < KT; ++kt) {
    const int st = static_cast<int>((kt - kt_begin) & 1);
    const bool next = kt + 1 < KT;
    if (next) {  // tile kt+1: x copies and W loads in flight while tile kt is multiplied
      load_x(kt + 1, st ^ 1);
      fetch_w(kt + 1);
    }
    simt::cp_async_commit();
    simt::cp_async_wait<1>();  // tile kt's copies landed
    __syncthreads();
    const S* Xs = smem + st * C::stage_elems;
    const S* Ws = Xs + BM * LD;
    if constexpr (C::TC) {
      const int wm = warp >> 1, wn = warp & 1;
      // a warp whose 32 rows all lie past M (M ≤ 32: half the warps) skips its mma (warp-uniform)
#pragma unroll
      for (int ks = 0; ks < (m0 + 32 * wm < M ? BK / 16 : 0); ++ks) {
        uint32_t a[2][4];
#pragma unroll
        for (int i = 0; i < 2; ++i) simt::ldmatrix_x4(a[i], tc_a_row(Xs + (32 * wm + 16 * i) * LD + 16 * ks, LD, lane));
#pragma unroll
        for (int np = 0; np < 2; ++np) {
          uint32_t b[4];
          simt::ldmatrix_x4(b, tc_b_nk_row(Ws + (32 * wn + 16 * np) * LD + 16 * ks, LD, lane));
          const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            tc_mma<T>(acc[i][2 * np], a[i], b0);
            tc_mma<T>(acc[i][2 * np + 1], a[i], b1);
          }
        }
      }
    } else {
      const int ty = tid >> 4, tx = tid & 15;
#pragma unroll 4
      for (int k = 0; k < BK; ++k) {
        float a[8], b[4];
#pragma unroll
        for (int i = 0; i < 8; ++i) a[i] = Xs[(ty + 8 * i) * LD + k];
#pragma unroll
        for (int j = 0; j < 4; ++j) b[j] = Ws[(tx + 16 * j) * LD + k];
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j][0] = fmaf(a[i], b[j], acc[i][j][0]);
      }
    }
    // stage st ^ 1 was released by the trailing barrier of iteration kt-1; iteration kt+1 reads it after the
    // barrier below
    if (next) store_w(kt + 1, st ^ 1);
    __syncthreads();  // every warp is done with stage st (and stage st ^ 1 is written) before iteration kt+1
  }
  simt::cp_async_wait<0>();  // the last (empty) group: nothing in flight at exit

  if constexpr (C::TC) {
    const int wm = warp >> 1, wn = warp & 1, g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int64_t m = m0 + 32 * wm + 16 * i + g + 8 * (e >> 1), n = n0 + 32 * wn + 8 * j + 2 * t4 + (e & 1);
          if (m < M && n < N) {
            if (partial) partial[m * ldo + n] = acc[i][j][e];
            else out[m * ldo + n] = simt::from_float<T>(acc[i][j][e]);
          }
        }
  } else {
    const int ty = tid >> 4, tx = tid & 15;
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t m = m0 + ty + 8 * i, n = n0 + tx + 16 * j;
        if (m < M && n < N) {
          if (partial) partial[m * ldo + n] = acc[i][j][0];
          else out[m * ldo + n] = simt::from_float<T>(acc[i][j][0]);
        }
      }
  }
}

// ---- dequantize once (the glue's path above kQGemmDequantRows: W → T [N, K], then a dense GEMM) ----------
// Rows M above which qlinear dequantizes W once and multiplies densely (cuBLAS on the GPU) instead of running
// the tile GEMM: the tile GEMM decodes every weight again per 64-row M tile (~0.3 warp-instructions per weight
// per tile, sm_90 Q4_K), the dequantization once per call (2 + bytes/QK bytes of memory per weight, then the
// dense GEMM's 2). Estimated crossover M ≈ 192–256 (the header's estimate); kept at one M tile until a GPU run
// measures it (bench_gpu_kernels.py, M = 64 vs 65 rows).
inline constexpr int64_t kQGemmDequantRows = 64;

// One thread per unit (8 weights, quant_blocks.h) of W [N, K]: the two groups of 4 stored with 8- (16-bit T) or
// 16-byte (fp32) stores; INT8_ROWWISE rows with K % 8 ≠ 0 elementwise.
template <typename T, int32_t QT>
__global__ void __launch_bounds__(256) quant_dequantize_kernel(T* __restrict__ out, const uint8_t* __restrict__ w,
                                                               const float* __restrict__ scales, int64_t N, int64_t K,
                                                               int64_t R) {
  const int64_t units = (K + 7) / 8, id = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;
  if (id >= N * units) return;
  const int64_t n = id / units;
  const int U = static_cast<int>(id % units);
  float y[8];
  gemv_unit<QT>(w + n * R, U, K, QT == kInt8Rowwise ? scales[n] : 1.f, y);
  T* row = out + n * K;
  if (QT == kInt8Rowwise && K % 8 != 0) {
    for (int j = 0; j < 8 && 8 * U + j < K; ++j) row[8 * U + j] = simt::from_float<T>(y[j]);
    return;
  }
  const int blk0 = QT == kInt8Rowwise ? 8 * U : (U / kUnits<QT>) * qformat(QT).block;
  const int u = U % kUnits<QT>;
  qgemm_store4(row + blk0 + unit_elem<QT>(u, 0), y[0], y[1], y[2], y[3]);
  qgemm_store4(row + blk0 + unit_elem<QT>(u, 1), y[4], y[5], y[6], y[7]);
}

// out [N, K] (T, contiguous, 16-byte aligned) = the decoded W (as dequant_unit / gguf, rounded once to T).
// cudaErrorInvalidValue for K ≥ 2^31 - 8, cudaErrorMisalignedAddress for w not aligned to kUnitAlign<QT>.
template <typename T, int32_t QT>
cudaError_t launch_quant_dequantize(T* out, const uint8_t* w, const float* scales, int64_t N, int64_t K,
                                    cudaStream_t stream) {
  if (N == 0 || K == 0) return cudaSuccess;
  if (K > 0x7fffffff - 8) return cudaErrorInvalidValue;
  if (QT != kInt8Rowwise && (reinterpret_cast<uintptr_t>(w) % kUnitAlign<QT>) != 0) return cudaErrorMisalignedAddress;
  if (!aligned16(out)) return cudaErrorMisalignedAddress;
  const int64_t R = QT == kInt8Rowwise ? K : K / qformat(QT).block * qformat(QT).bytes;
  const int64_t blocks = ceil_div(N * ((K + 7) / 8), 256);
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  return simt::launch(quant_dequantize_kernel<T, QT>, dim3(static_cast<unsigned>(blocks)), dim3(256), 0, stream, out,
                      w, scales, N, K, R);
}

// ---- split-K launch plan (8 < M ≤ kQGemmDequantRows: few output tiles, long K) ------------------------------
// One block per 64 × 64 output tile leaves the GPU nearly idle at small M: M = 32, N = 4096 is 64 blocks for
// 132 SMs, each walking all of K. The plan splits K into S ranges of whole 64-wide K tiles so that the
// (n tile, m tile, split) grid has about kQGemmBlocksPerSm blocks per SM (4 is what the registers and shared
// memory keep resident: ~128 registers × 128 threads, 36,864 B), each range at least kQGemmMinSplitTiles tiles
// (the fp32 partial tile a block writes, M·64·4 bytes, stays below the packed bytes it reads from 4 tiles on,
// Q4_K: 64 rows × 256 weights × 0.5625 B = 9.2 KB vs 8 KB at M = 32). Each split writes its fp32 sums to a
// workspace [S][M][N]; qgemm_splitk_reduce_kernel adds the S partials in split order (deterministic: no
// atomics) and rounds once to T.
//   tiles = ceil(N / 64) · ceil(M / 64); KT = ceil(K / 64); want = ceil(4 · SMs / tiles)
//   tps = max(3, ceil(KT / want)) K tiles per split; S = ceil(KT / tps) (no split empty; the last may be short)
// Worked example, 132 SMs (want = ceil(528 / tiles)):
//   M 32, N 4096,  K 4096:  64 tiles, KT 64:  want 9, tps 8,  S 8  → 512 blocks; workspace 8·32·4096·4 = 4 MiB
//   M 32, N 14336, K 4096:  224 tiles:        want 3, tps 22, S 3  → 672 blocks; 5.25 MiB
//   M 32, N 4096,  K 14336: 64 tiles, KT 224: want 9, tps 25, S 9  → 576 blocks; 4.5 MiB
//   M 16, N 1024,  K 4096:  16 tiles:         want 33, tps 3, S 22 → 352 blocks; 1.4 MiB
// (the workspace is written and read back through the 50–60 MB L2 of an H100 / H200). Above
// kQGemmDequantRows, or when the grid is already full, S = 1: no workspace, no reduce.
inline constexpr int64_t kQGemmBlocksPerSm = 4;
inline constexpr int64_t kQGemmMinSplitTiles = 3;

struct QGemmPlan {
  int64_t splits;           // S ≥ 1 (≤ 65535: grid.z)
  int64_t tiles_per_split;  // K tiles of 64 per split (the last split may have fewer, never none)
  int64_t workspace_floats; // S · M · N when S > 1, else 0
};

inline QGemmPlan qgemm_plan(int64_t M, int64_t N, int64_t K, int64_t sm_count) {
  constexpr int64_t B = QGemmTile<float>::BN;  // BM = BN = BK = 64 for every T
  const int64_t KT = ceil_div(K, B);
  const QGemmPlan one{1, KT, 0};
  if (M <= 0 || N <= 0 || K <= 0 || M > kQGemmDequantRows || KT < 2 * kQGemmMinSplitTiles) return one;
  const int64_t tiles = ceil_div(N, B) * ceil_div(M, B);
  const int64_t want = ceil_div(kQGemmBlocksPerSm * (sm_count > 1 ? sm_count : 1), tiles);
  if (want <= 1) return one;
  int64_t tps = ceil_div(KT, want);
  if (tps < kQGemmMinSplitTiles) tps = kQGemmMinSplitTiles;
  if (tps < ceil_div(KT, 65535)) tps = ceil_div(KT, 65535);
  const int64_t S = ceil_div(KT, tps);
  if (S <= 1) return one;
  return {S, tps, S * M * N};
}

template <typename T, int32_t QT>
__global__ void __launch_bounds__(QGemmTile<T>::THREADS, QGemmTile<T>::MIN_BLOCKS)
quant_gemm_kernel(T* __restrict__ out, const T* __restrict__ x, const uint8_t* __restrict__ w,
                  const float* __restrict__ scales, int64_t M, int64_t N, int64_t K, int64_t R, bool x_vec,
                  int64_t tiles_per_split, float* __restrict__ workspace) {
  // split z: K tiles z·tps … min(KT, (z+1)·tps) - 1, fp32 sums to workspace [z] (when set)
  const int64_t KT = ceil_div(K, QGemmTile<T>::BK), kt0 = static_cast<int64_t>(blockIdx.z) * tiles_per_split;
  const int64_t kt1 = kt0 + tiles_per_split < KT ? kt0 + tiles_per_split : KT;
  quant_gemm_tile<T, QT>(out, N, x, w, scales, M, N, K, R, x_vec, static_cast<int64_t>(blockIdx.y) * QGemmTile<T>::BM,
                         static_cast<int64_t>(blockIdx.x) * QGemmTile<T>::BN, kt0, kt1,
                         workspace ? workspace + static_cast<int64_t>(blockIdx.z) * M * N : nullptr);
}

// out [i] = T(Σ_{s < S} ws [s][i]) for i < MN, the splits added in order 0 … S-1 (one thread per element).
template <typename T>
__global__ void __launch_bounds__(256) qgemm_splitk_reduce_kernel(T* __restrict__ out, const float* __restrict__ ws,
                                                                   int64_t MN, int64_t S) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;
  if (i >= MN) return;
  float s = 0.f;
  for (int64_t z = 0; z < S; ++z) s += ws[z * MN + i];
  out[i] = simt::from_float<T>(s);
}

// out [M, N] = x [M, K] · Wᵀ for any M (QT, R, scales as launch_quant_gemv). plan: qgemm_plan (default: no
// split); workspace: plan.workspace_floats fp32 when plan.splits > 1. cudaErrorMisalignedAddress for w not
// 4-byte aligned (kQTileAlign) or x not 16-byte aligned (block formats; INT8_ROWWISE: any), cudaErrorInvalidValue for K ≥ 2^31 - 64 or a split plan
// without its workspace; M beyond 65535 tiles is launched in slices (never split).
template <typename T, int32_t QT>
cudaError_t launch_quant_gemm(T* out, const T* x, const uint8_t* w, const float* scales, int64_t M, int64_t N,
                              int64_t K, cudaStream_t stream, QGemmPlan plan = {1, 0, 0}, float* workspace = nullptr) {
  using C = QGemmTile<T>;
  if (M == 0 || N == 0) return cudaSuccess;
  if (K > 0x7fffffff - 64) return cudaErrorInvalidValue;
  if (QT != kInt8Rowwise && (reinterpret_cast<uintptr_t>(w) % kQTileAlign) != 0) return cudaErrorMisalignedAddress;
  const int64_t R = QT == kInt8Rowwise ? K : K / qformat(QT).block * qformat(QT).bytes;
  const bool x_vec = aligned16(x) && K % C::VE == 0;
  if (kQTileFormat<QT> && !x_vec) return cudaErrorMisalignedAddress;
  const int64_t n_tiles = ceil_div(N, C::BN), KT = ceil_div(K, C::BK);
  if (n_tiles > 0x7fffffff) return cudaErrorInvalidConfiguration;
  constexpr int64_t kMaxTiles = 65535;  // grid.y
  if (plan.splits > 1) {
    if (workspace == nullptr || plan.splits > kMaxTiles || plan.tiles_per_split < 1 ||
        plan.splits != ceil_div(KT, plan.tiles_per_split) || M > kMaxTiles * C::BM)
      return cudaErrorInvalidValue;
    const dim3 grid(static_cast<unsigned>(n_tiles), static_cast<unsigned>(ceil_div(M, C::BM)),
                    static_cast<unsigned>(plan.splits));
    cudaError_t err = simt::launch(quant_gemm_kernel<T, QT>, grid, dim3(C::THREADS), C::smem_bytes(), stream, out, x, w,
                                   scales, M, N, K, R, x_vec, plan.tiles_per_split, workspace);
    if (err != cudaSuccess) return err;
    const int64_t blocks = ceil_div(M * N, 256);
    if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
    return simt::launch(qgemm_splitk_reduce_kernel<T>, dim3(static_cast<unsigned>(blocks)), dim3(256), 0, stream, out,
                        static_cast<const float*>(workspace), M * N, plan.splits);
  }
  for (int64_t r0 = 0; r0 < M; r0 += kMaxTiles * C::BM) {
    const int64_t rows = M - r0 < kMaxTiles * C::BM ? M - r0 : kMaxTiles * C::BM;
    const dim3 grid(static_cast<unsigned>(n_tiles), static_cast<unsigned>(ceil_div(rows, C::BM)));
    const bool vec = x_vec && aligned16(x + r0 * K);
    const cudaError_t err = simt::launch(quant_gemm_kernel<T, QT>, grid, dim3(C::THREADS), C::smem_bytes(), stream,
                                         out + r0 * N, x + r0 * K, w, scales, rows, N, K, R, vec, KT,
                                         static_cast<float*>(nullptr));
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace mk::inline MK_ABI
