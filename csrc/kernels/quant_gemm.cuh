// quant_gemm.cuh — dequantizing GEMM for prefill (CUDA, framework-free): out [M, N] = x [M, K] · Wᵀ with W
// [N, K] in a quantized format of quant_blocks.h, for any M (the glue sends kGemvMaxRows < M ≤
// kQGemmDequantRows here), and the one-pass dequantization W → T [N, K] the glue runs above kQGemmDequantRows
// before a dense GEMM (cuBLAS): the tile GEMM below decodes each weight again per 64-row M tile (its k-loop,
// sm_90 SASS: ~1,220 instructions per 32 HMMA for Q4_K, 2.6 % HMMA), so from about one M tile on decoding once
// (~0.2 warp-instructions per weight, plus the 2-byte temporary written and read back) and the library GEMM
// are ahead by the instruction counts (estimate: ~5× at M = 4096 on an H100).
//
// Shapes: M rows, N out features, K in features, R packed bytes per row; BM = BN = 64 output tile, BK = 64
// (one K tile = 8 units of every weight row, quant_blocks.h), LD the padded shared row (elements).
// x, out contiguous; qweight [N, R] aligned to kUnitAlign<QT>; scales fp32 [N] (INT8_ROWWISE only).
//
// Grid (ceil(N / 64), ceil(M / 64)), 4 warps. Per K tile, 2 stages in shared memory:
//   X tile [BM][LD] of T: cp.async 16-byte copies (zero-filled past M / K; rows whose K·sizeof(T) is not a
//     multiple of 16 — INT8_ROWWISE with odd K — use plain loads instead);
//   W tile [BN][LD]: each thread decodes 4 units (dequant_unit, registers) and stores the 8 weights
//     converted to the smem type — the quantized bytes are read from HBM once per M tile.
//   The tile kt+1 is issued (x copies, W decode) before tile kt is computed.
// Compute: fp16 / bf16 x → the W tile holds T (the dequantized fp32 weight rounded once to T) and each
//   warp computes a 32×32 quarter with mma.sync.m16n8k16 (fp32 accumulation): A = x rows via ldmatrix.x4,
//   B = W rows via ldmatrix.x4 (a W row is a column of Wᵀ: mma's "col" layout), the fragment helpers of
//   tc_fragments.cuh. LD = 72: a row is 36 words ≡ 4 (mod 32), conflict-free ldmatrix (the argument of
//   paged_prefill_tc.cuh's header). fp32 x → a SIMT path, no conversion: the W tile holds fp32 weights
//   (exactly gguf's values) and each thread accumulates 8 rows × 4 columns of outputs with FMAs (LD = 68).
// Shared memory: 2 stages × (BM + BN) × LD × sizeof: 16-bit 36,864 B, fp32 69,632 B (dynamic, opt-in).
// Registers (nvcc 13, sm_80 / sm_90, 0 spills; tests/test_nvcc_ptxas.py): fp16 / bf16 116–143, fp32 119–128; the
// dequantization 19–32.
// Estimate (from the SASS counts above, unmeasured): the k-loop is issue-bound on the W decode (~1.2 warp-
//   instructions per weight per M tile), 2.6 % of its instructions HMMA: ~5–10 % of the mma.sync peak, which is
//   why it only serves 8 < M ≤ 64 (one M tile, where it reads the packed bytes once and needs no temporary).
//   fp32: the CUDA-core FMA rate, like grouped_gemm.cuh.
#pragma once

#include <type_traits>

#include "../simt/portable.cuh"
#include "common.cuh"
#include "tc_fragments.cuh"
#include "quant_blocks.h"
#include "quant_gemv.cuh"

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

// One block's output tile (quant_gemm_kernel, and the grouped moe_qgemm_kernel of moe_qgemm.cuh): rows
// m0 … m0+63 below M of x (row stride K) times weight rows n0 … n0+63 below N of w, written to out (row
// stride ldo).
template <typename T, int32_t QT>
__device__ __forceinline__ void quant_gemm_tile(T* __restrict__ out, int64_t ldo, const T* __restrict__ x,
                                                const uint8_t* __restrict__ w, const float* __restrict__ scales,
                                                int64_t M, int64_t N, int64_t K, int64_t R, bool x_vec, int64_t m0,
                                                int64_t n0) {
  using C = QGemmTile<T>;
  using S = typename C::S;
  constexpr int BM = C::BM, BN = C::BN, BK = C::BK, LD = C::LD, VE = C::VE, THREADS = C::THREADS;
  SIMT_DYN_SMEM(S, smem);  // [2 stages][X [BM][LD], W [BN][LD]]
  const int tid = threadIdx.x;
  const int64_t KT = ceil_div(K, BK);

  // X tile kt → stage st (x_vec: cp.async, committed by the caller).
  auto load_x = [&](int64_t kt, int st) {
    S* Xs = smem + st * C::stage_elems;
    const int64_t k0 = kt * BK;
    if (x_vec) {
      for (int idx = tid; idx < BM * (BK / VE); idx += THREADS) {
        const int r = idx / (BK / VE), c = idx % (BK / VE);
        const int64_t m = m0 + r, k = k0 + c * VE;
        const bool ok = m < M && k < K;  // x_vec: K % VE == 0, a vector is all in or all out
        simt::cp_async_16_zfill(Xs + r * LD + c * VE, ok ? x + m * K + k : x, ok ? 16u : 0u);
      }
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
  // W tile kt → stage st: 8 units per weight row, 4 per thread; rows ≥ N and weights ≥ K hold 0 (units
  // past K — the second half of the last tile when K is an odd multiple of 32 — are never read).
  auto load_w = [&](int64_t kt, int st) {
    S* Ws = smem + st * C::stage_elems + BM * LD;
#pragma unroll
    for (int i = 0; i < BN * 8 / THREADS; ++i) {
      const int idx = tid + i * THREADS, r = idx / 8, v = idx % 8;
      const int64_t n = n0 + r;
      const int U = static_cast<int>(kt) * 8 + v;  // K < 2^31 (the launcher's rule)
      float y[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
      if (n < N && U * 8 < K) gemv_unit<QT>(w + n * R, U, K, QT == kInt8Rowwise ? scales[n] : 1.f, y);
      // tile-relative elements of the two groups: the unit's block start minus the tile start
      const int blk0 = QT == kInt8Rowwise ? 8 * U : (U / kUnits<QT>) * qformat(QT).block;
      const int u = U % kUnits<QT>;
      const int base = blk0 - static_cast<int>(kt) * BK;
      qgemm_store4(Ws + r * LD + base + unit_elem<QT>(u, 0), y[0], y[1], y[2], y[3]);
      qgemm_store4(Ws + r * LD + base + unit_elem<QT>(u, 1), y[4], y[5], y[6], y[7]);
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

  load_x(0, 0);
  load_w(0, 0);
  simt::cp_async_commit();
  for (int64_t kt = 0; kt < KT; ++kt) {
    const int st = static_cast<int>(kt & 1);
    if (kt + 1 < KT) {  // the other stage was released by the trailing barrier of iteration kt-1
      load_x(kt + 1, st ^ 1);
      load_w(kt + 1, st ^ 1);
    }
    simt::cp_async_commit();
    simt::cp_async_wait<1>();  // tile kt's copies landed
    __syncthreads();
    const S* Xs = smem + st * C::stage_elems;
    const S* Ws = Xs + BM * LD;
    if constexpr (C::TC) {
      const int wm = warp >> 1, wn = warp & 1;
#pragma unroll
      for (int ks = 0; ks < BK / 16; ++ks) {
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
    __syncthreads();  // every warp is done with stage st before iteration kt+1 refills it
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
          if (m < M && n < N) out[m * ldo + n] = simt::from_float<T>(acc[i][j][e]);
        }
  } else {
    const int ty = tid >> 4, tx = tid & 15;
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t m = m0 + ty + 8 * i, n = n0 + tx + 16 * j;
        if (m < M && n < N) out[m * ldo + n] = simt::from_float<T>(acc[i][j][0]);
      }
  }
}

// ---- dequantize once (the glue's path above kQGemmDequantRows: W → T [N, K], then a dense GEMM) ----------
// Rows M above which qlinear dequantizes W once and multiplies densely (cuBLAS on the GPU) instead of running
// the tile GEMM below: the tile GEMM decodes every weight again per 64-row M tile (~1.2 warp-instructions per
// weight per tile, 2.6 % of its k-loop HMMA), the dequantization once per call (~0.2 warp-instructions and
// 2 + bytes/QK bytes of memory per weight); from about one M tile on, once wins (docs/kernels.md).
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

template <typename T, int32_t QT>
__global__ void __launch_bounds__(QGemmTile<T>::THREADS, QGemmTile<T>::MIN_BLOCKS)
quant_gemm_kernel(T* __restrict__ out, const T* __restrict__ x, const uint8_t* __restrict__ w,
                  const float* __restrict__ scales, int64_t M, int64_t N, int64_t K, int64_t R, bool x_vec) {
  quant_gemm_tile<T, QT>(out, N, x, w, scales, M, N, K, R, x_vec, static_cast<int64_t>(blockIdx.y) * QGemmTile<T>::BM,
                         static_cast<int64_t>(blockIdx.x) * QGemmTile<T>::BN);
}

// out [M, N] = x [M, K] · Wᵀ for any M (QT, R, scales as launch_quant_gemv). cudaErrorMisalignedAddress for
// w not aligned to kUnitAlign<QT>, cudaErrorInvalidValue for K ≥ 2^31 - 64; M beyond 65535 tiles is launched in
// slices.
template <typename T, int32_t QT>
cudaError_t launch_quant_gemm(T* out, const T* x, const uint8_t* w, const float* scales, int64_t M, int64_t N,
                              int64_t K, cudaStream_t stream) {
  using C = QGemmTile<T>;
  if (M == 0 || N == 0) return cudaSuccess;
  if (K > 0x7fffffff - 64) return cudaErrorInvalidValue;
  if (QT != kInt8Rowwise && (reinterpret_cast<uintptr_t>(w) % kUnitAlign<QT>) != 0) return cudaErrorMisalignedAddress;
  const int64_t R = QT == kInt8Rowwise ? K : K / qformat(QT).block * qformat(QT).bytes;
  const bool x_vec = aligned16(x) && K % C::VE == 0;
  const int64_t n_tiles = ceil_div(N, C::BN);
  if (n_tiles > 0x7fffffff) return cudaErrorInvalidConfiguration;
  constexpr int64_t kMaxTiles = 65535;  // grid.y
  for (int64_t r0 = 0; r0 < M; r0 += kMaxTiles * C::BM) {
    const int64_t rows = M - r0 < kMaxTiles * C::BM ? M - r0 : kMaxTiles * C::BM;
    const dim3 grid(static_cast<unsigned>(n_tiles), static_cast<unsigned>(ceil_div(rows, C::BM)));
    const bool vec = x_vec && aligned16(x + r0 * K);
    const cudaError_t err = simt::launch(quant_gemm_kernel<T, QT>, grid, dim3(C::THREADS), C::smem_bytes(), stream,
                                         out + r0 * N, x + r0 * K, w, scales, rows, N, K, R, vec);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace mk::inline MK_ABI
