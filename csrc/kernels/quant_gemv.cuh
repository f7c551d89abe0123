// quant_gemv.cuh — dequantizing GEMV for decode (CUDA, framework-free): out [M, N] = x [M, K] · Wᵀ with W
// [N, K] in a quantized format of quant_blocks.h, for M ≤ kGemvMaxRows rows. One pass over the packed bytes.
//
// Shapes: M rows (≤ MR ≤ 8, MR the compile-time row count: 1, 2, 4 or 8), N out features, K in features,
// R packed bytes per row (K / QK · bytes; INT8_ROWWISE: K). x, out contiguous; qweight [N, R] with its first
// byte aligned to kUnitAlign<QT> (the launcher checks; the glue copies a misaligned view); scales fp32 [N]
// (INT8_ROWWISE only).
//
// Two bodies; launch_quant_gemv picks one (the glue passes a workspace for fp16 / bf16 x):
//
// int8 activations (quant_gemv_q8_block; fp16 / bf16 x, the GGUF block formats — the default GPU decode path):
// x is quantized once per call to int8 blocks of 16 (quant_q8x.cuh: scale, sum; error bound there), then warp r
// of a 4-warp block owns weight row r and runs its whole K, its lanes splitting the weight blocks
// (kQ8Lanes<QT>) and dotting the codes with the int8 x by dp4a; scales and mins enter once per 16 elements;
// warp-shuffle sum, one shared-memory exchange for the 4 rows (and the gated SwiGLU). The weight bytes are read
// once with 16-byte (Q4_K / Q5_K) or aligned 4-byte loads; x (M·K + M·K/2 bytes) from L1 / L2.
//   Hot loop (sm_90 SASS, nvcc 13, bf16; instructions per iteration and bytes of packed weights per
//   warp-instruction, before = the exact body at bf16):
//     MR 1 (2 blocks per lane per iteration, Q6_K 1):  Q4_K 135 (8.5 B; was 1.1)  Q5_K 194 (7.3; 1.3)
//       Q6_K 170 (9.9; 1.3)  Q4_0 113 (10.2; 1.8)  Q4_1 83 (15.4; 1.6)  Q8_0 117 (18.6; 3.2)
//     MR 8 (1 block per lane):  Q4_K 247 (2.3; 0.7)  Q5_K 277 (2.5; 0.8)  Q6_K 478 (3.5; 1.1)  Q4_0 216 (2.7;
//       1.0)  Q4_1 200 (3.2; 1.0)  Q8_0 213 (5.1; 1.8)
//   Estimate (made before the first GPU run): ≥ 3 B per warp-instruction leaves the H100's issue rate (132 SMs ×
//   4 schedulers × 1.83 GHz ≈ 0.97·10¹² warp-instructions/s) 2–5× above what 3.35 TB/s asks, so M = 1 is
//   memory-bound: 75–85 % of HBM bandwidth for N ≥ 1024 (registers 54–80 → ≥ 6 blocks of 4 warps per SM, each
//   lane with 1–2 blocks' loads in flight). M = 8: 8× the x loads and dp4a per weight byte, 2.3–3.5 B per
//   warp-instruction for the 4- to 6-bit formats: near the issue bound, an estimated 50–70 %.
//   Measured (NVIDIA H200, 2026-11-27, benchmarks/results/gpu_kernels.md, bf16 x, L2 flushed, % of the 4221
//   GB/s copy bandwidth): M = 1 on 14336×4096 / 4096×14336: Q8_0 45–49 %, Q4_K 39–40 %, Q4_0 38–39 %, Q6_K
//   31–34 %; on 4096×4096 19–28 % (12–17 µs: the launch and the last wave dominate); M = 8: Q8_0 17–23 %,
//   Q4_K / Q4_0 10–15 %, Q6_K 8–10 %; INT8_ROWWISE (exact path) 14–22 % at M = 1, 3 % at M = 8. Half of the
//   estimate at M = 1 and a fifth at M = 8: the bytes-per-instruction figures above are not the limit;
//   memory-level parallelism per SM is the next suspect (ncu was not run).
//
// Exact (quant_gemv_block; fp32 x, INT8_ROWWISE, Q4_K / Q5_K rows not 16-byte aligned): fp32 products of the
// bit-exactly decoded weights.
// Work split: a block of 4 warps owns kGemvRowsPerBlock = 4 consecutive output rows n0 … n0+3 and sweeps
// their K in chunks of KC = 4096 / MR elements: the block converts the chunk of x (MR rows, fp32) into
// shared memory, then each thread takes the units (8 weights, quant_blocks.h) U = tid, tid + 128, … of the
// chunk: it reads the 8 x values of each of the MR rows once (two float4 per row) and decodes the same unit
// of all 4 weight rows, FMA-ing it into 4 × MR fp32 accumulators — x is reused 4× from registers, each weight
// byte is loaded once. 32 consecutive units are 256 weights: one super-block of a K format, 8 blocks of
// Q4_0 / Q4_1 / Q8_0, contiguous bytes per weight row, so the warp's loads of a row are coalesced. At the end
// a warp-shuffle sum, then the 4 warps' partial sums add up through shared memory. Its hot loop at bf16
// (sm_90): ~1,060 instructions per 2 units × 4 rows for Q4_K (1.1 B of weights per warp-instruction): issue-
// bound, an estimated 30–40 % of HBM bandwidth; fp32 callers trade that for exact products.
//
// Bytes per call: N·R packed weights (read once) + x (L2) + M·N·sizeof(T) written. Mistral-7B's 4096×14336
// down projection, Q4_K: 33 MB of weights, x 28 KB (int8 path: 21 KB quantized).
// Registers (nvcc 13, sm_80 / sm_90, every format and dtype, 0 spills; tests/test_nvcc_ptxas.py): int8 path
// (and its grouped twin) MR 1 52–80, MR 2 76–80, MR 4 76–128, MR 8 128–168; exact path MR 1 55–122, MR 2
// 71–123, MR 4 72–117, MR 8 95–168.
#pragma once

#include <type_traits>

#include "../simt/portable.cuh"
#include "activation.cuh"
#include "common.cuh"
#include "quant_blocks.h"
#include "quant_q8x.cuh"

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

// The int8-activation body (quant_q8x.cuh; the fast path for fp16 / bf16 x): warp r of the block owns weight
// row r of the block's 4 (plain: output column n0 + r; GATED: gate rows c0, c0+1 then up rows c0, c0+1) and runs
// its whole K: lane l takes share l % L of the weight blocks l / L, l / L + 32 / L, … (L = kQ8Lanes<QT>), so a
// warp's loads of one iteration cover 32 / L consecutive blocks of the row. x comes from the quantized
// workspace (L1 / L2: every warp of the grid reads the same M·K bytes). Rows m ≥ M of the workspace are zero.
template <typename T, int32_t QT, int MR, bool GATED>
__device__ __forceinline__ void quant_gemv_q8_block(T* __restrict__ out, int64_t ldo, const int8_t* __restrict__ xq,
                                                    const float2* __restrict__ xs, const uint8_t* __restrict__ w,
                                                    const uint8_t* __restrict__ w3, int M, int64_t N, int64_t K,
                                                    int64_t R, int64_t nb) {
  constexpr int NR = kGemvRowsPerBlock, NC = GATED ? NR / 2 : NR, L = kQ8Lanes<QT>, BPI = 32 / L;
  constexpr QFormat f = qformat(QT);
  __shared__ float red[NR * MR];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t n0 = nb * NC;
  {
    const int64_t n_raw = n0 + (GATED ? warp % NC : warp);
    const int64_t n = n_raw < N ? n_raw : N - 1;  // tail rows decode row N-1 again, never stored
    const uint8_t* row = (GATED && warp >= NC ? w3 : w) + n * R;
    float acc[MR];
#pragma unroll
    for (int m = 0; m < MR; ++m) acc[m] = 0.f;
    const int nblk = static_cast<int>(K / f.block), sub = lane % L;
#pragma unroll(MR <= 2 && QT != kQ6_K ? 2 : 1)  // two blocks in flight per lane where registers are plenty
    for (int g = lane / L; g < nblk; g += BPI)
      q8_lane_dot<QT, MR>(row + static_cast<int64_t>(g) * f.bytes, sub, xq + static_cast<int64_t>(g) * f.block,
                          xs + static_cast<int64_t>(g) * (f.block / kQ8Block), K, acc);
#pragma unroll
    for (int m = 0; m < MR; ++m) {
      const float s = simt::warp_sum(acc[m]);
      if (lane == 0) red[warp * MR + m] = s;
    }
  }
  __syncthreads();
  if (tid < NC * MR) {
    const int c = tid / MR, m = tid % MR;
    const int64_t n = n0 + c;
    if (m < M && n < N) {
      float s = red[tid];
      if constexpr (GATED)  // the up row of the same column: weight row c + NC
        s = swiglu(simt::to_float(simt::from_float<T>(s)), simt::to_float(simt::from_float<T>(red[NC * MR + tid])));
      out[m * ldo + n] = simt::from_float<T>(s);
    }
  }
}

// Resident blocks per SM the q8 body's registers are sized for: 6 (≤ 80 registers) for MR ≤ 2, 4 (≤ 128) for
// MR 4, 3 (≤ 168) for MR 8 (tighter budgets spilled: every x row's loads are in flight at once).
template <int MR>
inline constexpr int kGemvQ8MinBlocks = MR >= 8 ? 3 : MR >= 4 ? 4 : 6;

template <typename T, int32_t QT, int MR>
__global__ void __launch_bounds__(kGemvThreads, kGemvQ8MinBlocks<MR>)
quant_gemv_q8_kernel(T* __restrict__ out, const Q8X xq, const uint8_t* __restrict__ w, int M, int64_t N, int64_t K,
                     int64_t R) {
  quant_gemv_q8_block<T, QT, MR, false>(out, N, xq.q, xq.s, w, nullptr, M, N, K, R, blockIdx.x);
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

template <typename T, int32_t QT, int MR>
cudaError_t launch_quant_gemv_q8_mr(T* out, const Q8X& xq, const uint8_t* w, int M, int64_t N, int64_t K, int64_t R,
                                    cudaStream_t stream) {
  const int64_t blocks = ceil_div(N, kGemvRowsPerBlock);
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  return simt::launch(quant_gemv_q8_kernel<T, QT, MR>, dim3(static_cast<unsigned>(blocks)), dim3(kGemvThreads), 0,
                      stream, out, xq, w, M, N, K, R);
}

// True when launch_quant_gemv takes the int8-activation path for these arguments given a workspace: kQ8Path and
// the alignment of the format's loads (Q4_K / Q5_K: 16-byte vectors; the others kUnitAlign).
template <typename T, int32_t QT>
inline bool quant_gemv_q8_ok(const uint8_t* w) {
  if constexpr (!kQ8Path<T, QT>) {
    return false;
  } else {
    constexpr int align = QT == kQ4_K || QT == kQ5_K ? 16 : kUnitAlign<QT>;
    return reinterpret_cast<uintptr_t>(w) % align == 0;
  }
}

// out [M, N] = x [M, K] · Wᵀ for 1 ≤ M ≤ kGemvMaxRows; QT a format of MK_QTYPES, R = qformat(QT).bytes ·
// K / QK (INT8_ROWWISE: K, with scales [N]). cudaErrorInvalidValue for M outside 1 … 8 or K ≥ 2^31 - 8,
// cudaErrorMisalignedAddress for w not aligned to kUnitAlign<QT>.
// workspace: nullptr runs the exact kernel (fp32 x products of the decoded weights); else q8x_workspace_bytes(M,
// K) bytes, 16-byte aligned, and where quant_gemv_q8_ok the int8-activation path (x quantized into it once, then
// dp4a; error bound in quant_q8x.cuh) — the glue passes one for fp16 / bf16 x.
template <typename T, int32_t QT>
cudaError_t launch_quant_gemv(T* out, const T* x, const uint8_t* w, const float* scales, int64_t M, int64_t N,
                              int64_t K, cudaStream_t stream, void* workspace = nullptr) {
  if (N == 0) return cudaSuccess;
  if (!quant_gemv_rows(M) || K > 0x7fffffff - 8) return cudaErrorInvalidValue;
  if (QT != kInt8Rowwise && (reinterpret_cast<uintptr_t>(w) % kUnitAlign<QT>) != 0) return cudaErrorMisalignedAddress;
  const int64_t R = QT == kInt8Rowwise ? K : K / qformat(QT).block * qformat(QT).bytes;
  const int m = static_cast<int>(M);
  if constexpr (kQ8Path<T, QT>) {
    if (workspace != nullptr && quant_gemv_q8_ok<T, QT>(w)) {
      if (!aligned16(workspace)) return cudaErrorMisalignedAddress;
      if (const cudaError_t err = launch_quantize_x_q8(workspace, x, M, K, stream); err != cudaSuccess) return err;
      const Q8X xq = q8x_view(workspace, M, K);
      if (M == 1) return launch_quant_gemv_q8_mr<T, QT, 1>(out, xq, w, m, N, K, R, stream);
      if (M == 2) return launch_quant_gemv_q8_mr<T, QT, 2>(out, xq, w, m, N, K, R, stream);
      if (M <= 4) return launch_quant_gemv_q8_mr<T, QT, 4>(out, xq, w, m, N, K, R, stream);
      return launch_quant_gemv_q8_mr<T, QT, 8>(out, xq, w, m, N, K, R, stream);
    }
  }
  if (M == 1) return launch_quant_gemv_mr<T, QT, 1>(out, x, w, scales, m, N, K, R, stream);
  if (M == 2) return launch_quant_gemv_mr<T, QT, 2>(out, x, w, scales, m, N, K, R, stream);
  if (M <= 4) return launch_quant_gemv_mr<T, QT, 4>(out, x, w, scales, m, N, K, R, stream);
  return launch_quant_gemv_mr<T, QT, 8>(out, x, w, scales, m, N, K, R, stream);
}

}  // namespace mk::inline MK_ABI
