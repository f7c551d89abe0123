// quant_gemv.cuh — dequantizing GEMV for decode (CUDA, framework-free): out [M, N] = x [M, K] · Wᵀ with W
// [N, K] in a quantized format of quant_blocks.h, for M ≤ kGemvMaxRows rows. One pass over the packed bytes.
//
// Shapes: M rows (≤ MR ≤ 8, MR the compile-time row count: 1, 2, 4 or 8), N out features, K in features,
// R packed bytes per row (K / QK · bytes; INT8_ROWWISE: K). x, out contiguous; qweight [N, R] with its first
// byte aligned to kUnitAlign<QT> (the launcher checks; the glue copies a misaligned view); scales fp32 [N]
// (INT8_ROWWISE only).
//
// Work split: a block of 4 warps owns kGemvRowsPerBlock = 4 consecutive output rows n0 … n0+3 and sweeps
// their K in chunks of KC = 4096 / MR elements: the block converts the chunk of x (MR rows, fp32) into
// shared memory, then each thread takes the units (8 weights, quant_blocks.h) U = tid, tid + 128, … of the
// chunk: it reads the 8 x values of each of the MR rows once (two float4 per row) and decodes the same unit
// of all 4 weight rows, FMA-ing it into 4 × MR fp32 accumulators — x is reused 4× from registers, each weight
// byte is loaded once. 32 consecutive units are 256 weights: one super-block of a K format, 8 blocks of
// Q4_0 / Q4_1 / Q8_0, contiguous bytes per weight row, so the warp's loads of a row are coalesced (the block's
// scale bytes are broadcast to its lanes; Q6_K's ql / qh bytes serve two units, lanes u and u + 8 of the same
// load instruction). INT8_ROWWISE: two 4-byte loads per unit where K % 4 == 0. At the end
// a warp-shuffle sum, then the 4 warps' partial sums add up through shared memory.
//
// Bytes per call: N·R packed weights (read once) + M·K·sizeof(T) activations per block (from L2; N/4 blocks)
// + M·N·sizeof(T) written. Mistral-7B's 4096×14336 down projection, Q4_K: 33 MB of weights, x 28 KB.
// Expected fraction of HBM bandwidth (design estimates, not measured: no GPU was reachable):
//   M = 1: memory-bound. Per weight the decode costs ~2 integer ops + 1 FMA (decode) + MR FMA; at 4.5 bits
//   per weight (Q4_K) the H100's 3.35 TB/s is 6·10¹² weights/s ≈ 20·10¹² instructions/s of the ~31·10¹² the
//   SMs issue (132 SMs × 128 lanes × 1.83 GHz), and shared memory serves 8 x floats per 4 weight rows (~25 of
//   128 B/clk per SM). Latency: 16 KiB of shared memory and 45–90 registers per thread at MR ≤ 2 let 5–10
//   blocks (20–40 warps) reside per SM, each thread with 2 units × 4 rows of loads in flight (~10–40 KiB per
//   SM, about what Little's law asks at ~600 ns latency: H100 3.35 TB/s / 132 SMs · 600 ns ≈ 15 KiB).
//   Expect 70–85 % of HBM bandwidth on A100 (1.56–2.0 TB/s) and H100 for N ≥ 1024 (≥ 256 blocks).
//   M = 8: x traffic from shared memory grows to ~200 B/clk per SM and the FMAs to ~9 per weight: compute /
//   shared-memory bound at an estimated 40–60 % of HBM bandwidth for 4-bit formats (8-bit formats carry
//   twice the bytes per weight and stay nearer the memory bound). Larger M goes to quant_gemm.cuh.
// Registers (nvcc 13, sm_80 / sm_90, every format and dtype, 0 spills; tests/test_nvcc_ptxas.py): MR 1 45–72,
// MR 2 63–90, MR 4 80–114, MR 8 128–168 (4·MR accumulators, 8·MR x values, the decode).
#pragma once

#include <type_traits>

#include "../simt/portable.cuh"
#include "activation.cuh"
#include "common.cuh"
#include "quant_blocks.h"

namespace mk::inline MK_ABI {

inline constexpr int kGemvMaxRows = 8;        // M ≤ this runs the GEMV (the glue's dispatch rule)
inline constexpr int kGemvThreads = 128;      // 4 warps
inline constexpr int kGemvRowsPerBlock = 4;   // weight rows per block (x reuse from registers)
inline constexpr int kGemvChunkFloats = 4096; // x chunk in shared memory: MR · KC floats = 16 KiB

// Resident blocks per SM the register allocation is sized for (__launch_bounds__): 4 (≤ 128 registers) for
// MR ≤ 4, 3 (≤ 168) for MR 8. Without the hint ptxas picked occupancy-friendly counts with 4–36 spilled bytes.
template <int MR>
inline constexpr int kGemvMinBlocks = MR >= 8 ? 3 : 4;

template <int MR>
inline constexpr int kGemvChunk = kGemvChunkFloats / MR;  // KC, a multiple of 256 (super-block)

template <int MR>
inline constexpr size_t gemv_smem_bytes() {
  return sizeof(float) * (static_cast<size_t>(MR) * kGemvChunk<MR> + 4 * kGemvRowsPerBlock * MR);
}

// The 8 weights of unit U (0 … ceil(K / 8) - 1) of one packed row (`row`: its first byte) → y.
// INT8_ROWWISE: `scale` is the row's scale, weights at k ≥ K read as 0.
template <int32_t QT>
__device__ __forceinline__ void gemv_unit(const uint8_t* row, int U, int64_t K, float scale, float (&y)[8]) {
  if constexpr (QT == kInt8Rowwise) {
    const uint8_t* q = row + 8 * U;
    if (8 * U + 8 <= K && (reinterpret_cast<uintptr_t>(q) & 3u) == 0) {  // two 4-byte loads
      const uint32_t w0 = load_u32(q), w1 = load_u32(q + 4);
#pragma unroll
      for (int j = 0; j < 4; ++j) {  // (b ^ 0x80) - 128 = the int8 value b
        y[j] = (small_u2f(((w0 >> (8 * j)) & 255u) ^ 128u) - 128.0f) * scale;
        y[j + 4] = (small_u2f(((w1 >> (8 * j)) & 255u) ^ 128u) - 128.0f) * scale;
      }
    } else {  // the partial last unit (K not a multiple of 8) or rows at odd addresses
#pragma unroll
      for (int j = 0; j < 8; ++j)
        y[j] = 8 * U + j < K ? static_cast<float>(reinterpret_cast<const int8_t*>(q)[j]) * scale : 0.f;
    }
  } else {
    constexpr QFormat f = qformat(QT);
    dequant_unit<QT>(row + (U / kUnits<QT>) * f.bytes, static_cast<int>(U % kUnits<QT>), y);
  }
}

// One block's work (quant_gemv_kernel, and the grouped moe_qgemv_kernel of moe_qgemm.cuh): rows 0 … M-1 of
// x (row stride K) against the block's 4 weight rows, written to out (row stride ldo).
//   plain (GATED false): output columns n0 … n0+3, n0 = 4·nb, from weight rows n0 … n0+3 of w;
//   GATED: output columns c0, c0+1, c0 = 2·nb, from the gate rows c0, c0+1 of w and the up rows c0, c0+1 of w3:
//     out = swiglu(round(gate), round(up)), round = to T and back (where the unfused path stores h13).
template <typename T, int32_t QT, int MR, bool GATED>
__device__ __forceinline__ void quant_gemv_block(T* __restrict__ out, int64_t ldo, const T* __restrict__ x,
                                                 const uint8_t* __restrict__ w, const uint8_t* __restrict__ w3,
                                                 const float* __restrict__ scales, const float* __restrict__ scales3,
                                                 int M, int64_t N, int64_t K, int64_t R, int64_t nb) {
  constexpr int NR = kGemvRowsPerBlock, KC = kGemvChunk<MR>, WARPS = kGemvThreads / 32;
  constexpr int NC = GATED ? NR / 2 : NR;  // output columns of the block
  SIMT_DYN_SMEM(float, smem);
  float* xs = smem;                // [MR][KC]: rows ≥ M and columns ≥ K hold 0
  float* red = smem + MR * KC;     // [WARPS][NR·MR] partial sums
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t n0 = nb * NC;

  // Output column of weight row r; tail columns (past N) decode column N-1 again and are never stored.
  const auto col_of = [&](int r) {
    const int64_t n = n0 + (GATED ? r % NC : r);
    return n < N ? n : N - 1;
  };
  float acc[NR][MR];
#pragma unroll
  for (int r = 0; r < NR; ++r)
#pragma unroll
    for (int m = 0; m < MR; ++m) acc[r][m] = 0.f;

  for (int c0 = 0; c0 < K; c0 += KC) {
    const int kc = K - c0 < KC ? static_cast<int>(K - c0) : KC;
    const int kc8 = (kc + 7) & ~7;  // whole units (INT8_ROWWISE's last one may be partial)
    __syncthreads();                // the previous chunk is consumed
    for (int i = tid; i < MR * kc8; i += kGemvThreads) {
      const int m = i / kc8, k = i % kc8;
      xs[m * KC + k] = m < M && k < kc ? simt::to_float(x[m * K + c0 + k]) : 0.f;
    }
    __syncthreads();
    const int u_begin = c0 / 8;
#pragma unroll(MR <= 2 ? 2 : 1)  // two units in flight per thread where registers are plenty
    for (int uc = tid; uc < kc8 / 8; uc += kGemvThreads) {
      const int U = u_begin + uc;  // K < 2^31 (the launcher's rule): unit indices are int
      // chunk-relative elements of the unit's two groups of 4 (c0 is a multiple of every block size)
      const int blk0 = QT == kInt8Rowwise ? 8 * U : (U / kUnits<QT>) * qformat(QT).block;
      const int u = U % kUnits<QT>;
      const int e0 = blk0 - c0 + unit_elem<QT>(u, 0);
      const int e1 = blk0 - c0 + unit_elem<QT>(u, 1);
      float xv[MR][8];
#pragma unroll
      for (int m = 0; m < MR; ++m) {
        const float4 a = *reinterpret_cast<const float4*>(xs + m * KC + e0);
        const float4 b = *reinterpret_cast<const float4*>(xs + m * KC + e1);
        xv[m][0] = a.x, xv[m][1] = a.y, xv[m][2] = a.z, xv[m][3] = a.w;
        xv[m][4] = b.x, xv[m][5] = b.y, xv[m][6] = b.z, xv[m][7] = b.w;
      }
#pragma unroll
      for (int r = 0; r < NR; ++r) {
        float y[8];
        const int64_t n = col_of(r);
        const bool up = GATED && r >= NC;
        gemv_unit<QT>((up ? w3 : w) + n * R, U, K, QT == kInt8Rowwise ? (up ? scales3 : scales)[n] : 1.f, y);
#pragma unroll
        for (int m = 0; m < MR; ++m)
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[r][m] = fmaf(xv[m][j], y[j], acc[r][m]);
      }
    }
  }

  // Warp sums, then the WARPS partial sums of each (row, m) through shared memory.
#pragma unroll
  for (int r = 0; r < NR; ++r)
#pragma unroll
    for (int m = 0; m < MR; ++m) {
      const float s = simt::warp_sum(acc[r][m]);
      if (lane == 0) red[warp * NR * MR + r * MR + m] = s;
    }
  __syncthreads();
  if (tid < NC * MR) {
    const int c = tid / MR, m = tid % MR;
    const int64_t n = n0 + c;
    if (m < M && n < N) {
      float s = 0.f;
#pragma unroll
      for (int wi = 0; wi < WARPS; ++wi) s += red[wi * NR * MR + tid];
      if constexpr (GATED) {
        float su = 0.f;  // the up row of the same column: weight row c + NC
#pragma unroll
        for (int wi = 0; wi < WARPS; ++wi) su += red[wi * NR * MR + NC * MR + tid];
        s = swiglu(simt::to_float(simt::from_float<T>(s)), simt::to_float(simt::from_float<T>(su)));
      }
      out[m * ldo + n] = simt::from_float<T>(s);
    }
  }
}

template <typename T, int32_t QT, int MR>
__global__ void __launch_bounds__(kGemvThreads, kGemvMinBlocks<MR>)
quant_gemv_kernel(T* __restrict__ out, const T* __restrict__ x, const uint8_t* __restrict__ w,
                  const float* __restrict__ scales, int M, int64_t N, int64_t K, int64_t R) {
  quant_gemv_block<T, QT, MR, false>(out, N, x, w, nullptr, scales, nullptr, M, N, K, R, blockIdx.x);
}

// True when quant_gemv serves M rows (the glue's GEMV / GEMM rule).
inline bool quant_gemv_rows(int64_t M) { return M >= 1 && M <= kGemvMaxRows; }

template <typename T, int32_t QT, int MR>
cudaError_t launch_quant_gemv_mr(T* out, const T* x, const uint8_t* w, const float* scales, int M, int64_t N,
                                 int64_t K, int64_t R, cudaStream_t stream) {
  const int64_t blocks = ceil_div(N, kGemvRowsPerBlock);
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  return simt::launch(quant_gemv_kernel<T, QT, MR>, dim3(static_cast<unsigned>(blocks)), dim3(kGemvThreads),
                      gemv_smem_bytes<MR>(), stream, out, x, w, scales, M, N, K, R);
}

// out [M, N] = x [M, K] · Wᵀ for 1 ≤ M ≤ kGemvMaxRows; QT a format of MK_QTYPES, R = qformat(QT).bytes ·
// K / QK (INT8_ROWWISE: K, with scales [N]). cudaErrorInvalidValue for M outside 1 … 8 or K ≥ 2^31 - 8,
// cudaErrorMisalignedAddress for w not aligned to kUnitAlign<QT>.
template <typename T, int32_t QT>
cudaError_t launch_quant_gemv(T* out, const T* x, const uint8_t* w, const float* scales, int64_t M, int64_t N,
                              int64_t K, cudaStream_t stream) {
  if (N == 0) return cudaSuccess;
  if (!quant_gemv_rows(M) || K > 0x7fffffff - 8) return cudaErrorInvalidValue;
  if (QT != kInt8Rowwise && (reinterpret_cast<uintptr_t>(w) % kUnitAlign<QT>) != 0) return cudaErrorMisalignedAddress;
  const int64_t R = QT == kInt8Rowwise ? K : K / qformat(QT).block * qformat(QT).bytes;
  const int m = static_cast<int>(M);
  if (M == 1) return launch_quant_gemv_mr<T, QT, 1>(out, x, w, scales, m, N, K, R, stream);
  if (M == 2) return launch_quant_gemv_mr<T, QT, 2>(out, x, w, scales, m, N, K, R, stream);
  if (M <= 4) return launch_quant_gemv_mr<T, QT, 4>(out, x, w, scales, m, N, K, R, stream);
  return launch_quant_gemv_mr<T, QT, 8>(out, x, w, scales, m, N, K, R, stream);
}

}  // namespace mk::inline MK_ABI
