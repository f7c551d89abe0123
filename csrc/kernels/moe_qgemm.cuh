// moe_qgemm.cuh — grouped GEMMs on quantized expert stacks over row segments whose bounds stay on the device
// (CUDA, framework-free; emulated by csrc/simt): the expert projections of Mixtral-style MoE layers with packed
// experts (GGUF ffn_*_exps blocks, INT8_ROWWISE), op moe_qgemm (glue: csrc/glue/moe_quant.h).
//
// Shapes: M rows (permuted, grouped by expert), G experts, N outputs, K in features, R packed bytes per
// weight row (quant_blocks.h), MR rows per GEMV slot (1, 2, 4, 8).
//   x [M, K] contiguous, offsets int64 [≥ G+1] on the device, W [G, N, R] (INT8_ROWWISE: int8 [G, N, K] and
//   scales fp32 [G, N]); segment g = rows [offsets[g], offsets[g+1]).
//   plain:  out[r, n] = Σ_κ x[r, κ] · W[g, n, κ]                                     (w2: N = H, K = I)
//   gated:  out[r, n] = swiglu(round(Σ_κ x[r, κ]·W[g, n, κ]), round(Σ_κ x[r, κ]·W3[g, n, κ]))   (w1 | w3: N = I)
//           round = to T and back, where the unfused path stores h13 (so the fusion moves no rounding point).
//   Rows outside every segment are not written (the glue zeroes them).
//
// The blocks find their expert and rows from the device offsets (grouped_tile of grouped_gemm.cuh: no host
// sync, so a decode step with packed experts can be a CUDA graph); slots past the last tile exit at once.
// Two kernels, both the per-block bodies of the dense-expert qlinear kernels with the grid mapped to segments:
//   moe_qgemv_kernel / moe_qgemv_q8_kernel (few rows per expert: decode): quant_gemv_block / for fp16 / bf16 x
//     the int8-activation quant_gemv_q8_block of quant_gemv.cuh (x of all M rows quantized once per call into
//     the workspace; rows row0 … of a slot read from there). Grid (slots of MR
//     rows, ceil(N / columns per block)); slots run fastest, so the blocks of an expert's slots that read the
//     same weight rows are resident together and share them through L2. Gated: a block decodes the gate rows
//     c0, c0+1 and the up rows c0, c0+1 (4 weight rows, as the plain GEMV) and writes silu(gate)·up for its 2
//     columns: w1 | w3 is ONE launch, h13 [M, 2I] is never written.
//   moe_qgemm_kernel (many rows per expert: prefill; for fp16 / bf16 up to 64 per expert, see below):
//     quant_gemm_tile of quant_gemm.cuh (64 × 64 tiles, W tiles dequantized into shared memory, mma.sync for
//     fp16 / bf16). Grid (slots of 64 rows, N-tiles).
//     Gated runs as two plain launches into h13 halves + silu_and_mul (the glue): the gate and up
//     accumulators of a column would sit in different warps of the tile; at prefill sizes the h13 round trip is
//     a small share of the GEMM.
// Which kernel: moe_qgemv_rows(M, G) — expected rows per expert ceil(M / G) ≤ kGemvMaxRows (8) runs the GEMV
// with MR the next power of two ≥ that; above, the GEMM. Chosen from shapes only (no sync).
//
// Bound (design estimate, made before the first GPU run): a decode step reads the packed bytes of the touched experts once
// from HBM (every slot of an expert reads its weight rows; with T·k ≤ G rows spread over distinct experts
// there is one slot per touched expert, and further slots of one expert hit L2). Mixtral-8x7B in Q4_K
// (144 B per 256 weights), T = 1, k = 2: 2 experts × 3 × 14336 × 4096 × 144 / 256 B = 198 MB per layer, 59 µs
// at H100's 3.35 TB/s, 99 µs at A100's 2.0 TB/s; the GEMV body's estimate applies (quant_gemv.cuh: int8 path 75–85 % of
// HBM bandwidth at MR = 1, 50–70 % at MR = 8). Measured (NVIDIA H200, 2026-11-27, gpu_kernels.md, Q4_K gated
// w1 + w3): T = 1 (2 experts) 73.8 µs = 42 % of the 4221 GB/s copy bandwidth, T = 16 (8 experts) 559 µs = 22 %.
// Grid at T = 1:
// w1 | w3 I / 2 = 7168 column blocks × 2 working slots; w2 H / 4 = 1024 column blocks × 2 working slots.
// Prefill: the quant_gemm.cuh tile (its W decode of quant_tile.cuh: 250–380 sm_90 warp-instructions per K tile
// per warp for 32 HMMA by format, Q4_K 289: an HMMA issue share of 50–76 %; no split-K here: the expert slots
// fill the grid)
// serves fp32 and 8 < rows per expert ≤ 64; above, for fp16 / bf16, the glue (glue/moe_quant.h,
// moe_dequant_tc) dequantizes every expert once (G·N·K elements of T per projection, written and read back
// once) and runs the tensor-core grouped GEMM of grouped_gemm_tc.cuh (gated: SwiGLU in its epilogue).
// Registers and spills: the same bodies as quant_gemv / quant_gemm; tests/test_nvcc_ptxas.py checks them.
#pragma once

#include "../simt/portable.cuh"
#include "common.cuh"
#include "grouped_gemm.cuh"
#include "quant_blocks.h"
#include "quant_gemm.cuh"
#include "quant_gemv.cuh"

namespace mk::inline MK_ABI {

template <typename T>
struct MoeQArgs {
  T* out;
  int64_t ldo;                // out row stride (≥ N)
  const T* x;                 // [M, K] contiguous
  const uint8_t* w;           // [G, N, R]; gated: the gate projection (w1)
  const uint8_t* w3;          // gated: the up projection [G, N, R] (w3); plain: nullptr
  const float* scales;        // INT8_ROWWISE: [G, N] of w; else nullptr
  const float* scales3;       // INT8_ROWWISE, gated: [G, N] of w3
  const int64_t* offsets;     // [≥ G+1] on the device
  int G;
  int64_t M, N, K;
};

// True when the expected rows per expert, ceil(M / G), are few enough for the GEMV (the glue's rule).
inline bool moe_qgemv_rows(int64_t M, int64_t G) { return G > 0 && ceil_div(M, G) <= kGemvMaxRows; }

template <typename T, int32_t QT>
inline int64_t moe_q_row_bytes(int64_t K) {
  return QT == kInt8Rowwise ? K : K / qformat(QT).block * qformat(QT).bytes;
}

template <typename T, int32_t QT, int MR, bool GATED>
__global__ void __launch_bounds__(kGemvThreads, kGemvMinBlocks<MR>)
moe_qgemv_kernel(const MoeQArgs<T> p, int64_t R) {
  int g;
  int64_t row0, row_end;
  if (!grouped_tile(p.offsets, p.G, p.M, MR, blockIdx.x, g, row0, row_end)) return;  // block-uniform
  const int rows = row_end - row0 < MR ? static_cast<int>(row_end - row0) : MR;
  const int64_t wo = static_cast<int64_t>(g) * p.N;  // the expert's first weight row
  quant_gemv_block<T, QT, MR, GATED>(p.out + row0 * p.ldo, p.ldo, p.x + row0 * p.K, p.w + wo * R,
                                     GATED ? p.w3 + wo * R : nullptr, p.scales ? p.scales + wo : nullptr,
                                     GATED && p.scales3 ? p.scales3 + wo : nullptr, rows, p.N, p.K, R, blockIdx.y);
}

// The int8-activation GEMV body (quant_gemv_q8_block) over the segments: x rows from the quantized workspace.
template <typename T, int32_t QT, int MR, bool GATED>
__global__ void __launch_bounds__(kGemvThreads, kGemvQ8MinBlocks<MR>)
moe_qgemv_q8_kernel(const MoeQArgs<T> p, const Q8X xq, int64_t R) {
  int g;
  int64_t row0, row_end;
  if (!grouped_tile(p.offsets, p.G, p.M, MR, blockIdx.x, g, row0, row_end)) return;  // block-uniform
  const int rows = row_end - row0 < MR ? static_cast<int>(row_end - row0) : MR;
  const int64_t wo = static_cast<int64_t>(g) * p.N;
  quant_gemv_q8_block<T, QT, MR, GATED>(p.out + row0 * p.ldo, p.ldo, xq.q + row0 * p.K,
                                        xq.s + row0 * (p.K / kQ8Block), p.w + wo * R, GATED ? p.w3 + wo * R : nullptr,
                                        rows, p.N, p.K, R, blockIdx.y);
}

template <typename T, int32_t QT>
__global__ void __launch_bounds__(QGemmTile<T>::THREADS, QGemmTile<T>::MIN_BLOCKS)
moe_qgemm_kernel(const MoeQArgs<T> p, int64_t R, bool x_vec) {
  using C = QGemmTile<T>;
  int g;
  int64_t row0, row_end;
  if (!grouped_tile(p.offsets, p.G, p.M, C::BM, blockIdx.x, g, row0, row_end)) return;  // block-uniform
  const int64_t wo = static_cast<int64_t>(g) * p.N;
  quant_gemm_tile<T, QT>(p.out, p.ldo, p.x, p.w + wo * R, p.scales ? p.scales + wo : nullptr, row_end, p.N, p.K, R,
                         x_vec, row0, static_cast<int64_t>(blockIdx.y) * C::BN);
}

template <typename T, int32_t QT, int MR>
cudaError_t launch_moe_qgemv_mr(const MoeQArgs<T>& p, int64_t R, const Q8X* xq, cudaStream_t stream) {
  const int64_t slots = grouped_slots(p.M, p.G, MR, true);
  const int64_t cols = ceil_div(p.N, p.w3 ? kGemvRowsPerBlock / 2 : kGemvRowsPerBlock);
  if (slots > 0x7fffffff || cols > 65535) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(slots), static_cast<unsigned>(cols));
  if constexpr (kQ8Path<T, QT>) {
    if (xq) {
      if (p.w3)
        return simt::launch(moe_qgemv_q8_kernel<T, QT, MR, true>, grid, dim3(kGemvThreads), 0, stream, p, *xq, R);
      return simt::launch(moe_qgemv_q8_kernel<T, QT, MR, false>, grid, dim3(kGemvThreads), 0, stream, p, *xq, R);
    }
  }
  if (p.w3)
    return simt::launch(moe_qgemv_kernel<T, QT, MR, true>, grid, dim3(kGemvThreads), gemv_smem_bytes<MR>(), stream,
                        p, R);
  return simt::launch(moe_qgemv_kernel<T, QT, MR, false>, grid, dim3(kGemvThreads), gemv_smem_bytes<MR>(), stream, p,
                      R);
}

// The common argument rule of both launchers: cudaErrorInvalidValue for K ≥ 2^31 - 64 or G < 1,
// cudaErrorMisalignedAddress for w / w3 not aligned to kUnitAlign<QT>.
template <typename T, int32_t QT>
cudaError_t moe_q_args_ok(const MoeQArgs<T>& p) {
  if (p.K > 0x7fffffff - 64 || p.G < 1) return cudaErrorInvalidValue;
  if (QT != kInt8Rowwise && ((reinterpret_cast<uintptr_t>(p.w) % kUnitAlign<QT>) != 0 ||
                             (reinterpret_cast<uintptr_t>(p.w3) % kUnitAlign<QT>) != 0))
    return cudaErrorMisalignedAddress;
  return cudaSuccess;
}

// True when launch_moe_qgemv takes the int8-activation path given a workspace (quant_gemv_q8_ok for w and w3).
template <typename T, int32_t QT>
inline bool moe_qgemv_q8_ok(const MoeQArgs<T>& p) {
  return quant_gemv_q8_ok<T, QT>(p.w) && (!p.w3 || quant_gemv_q8_ok<T, QT>(p.w3));
}

// Plain or gated (p.w3 set) over the segments with the GEMV, MR from the expected rows per expert. workspace:
// as launch_quant_gemv (nullptr: the exact body; else q8x_workspace_bytes(M, K) bytes and, where
// moe_qgemv_q8_ok, x quantized into it once and the int8-activation body).
template <typename T, int32_t QT>
cudaError_t launch_moe_qgemv(const MoeQArgs<T>& p, cudaStream_t stream, void* workspace = nullptr) {
  if (const cudaError_t err = moe_q_args_ok<T, QT>(p); err != cudaSuccess) return err;
  if (p.M == 0 || p.N == 0) return cudaSuccess;
  const int64_t R = moe_q_row_bytes<T, QT>(p.K), rows = ceil_div(p.M, static_cast<int64_t>(p.G));
  Q8X view{};
  const Q8X* xq = nullptr;
  if (workspace != nullptr && moe_qgemv_q8_ok<T, QT>(p)) {
    if (!aligned16(workspace)) return cudaErrorMisalignedAddress;
    if (const cudaError_t err = launch_quantize_x_q8(workspace, p.x, p.M, p.K, stream); err != cudaSuccess) return err;
    view = q8x_view(workspace, p.M, p.K);
    xq = &view;
  }
  if (rows <= 1) return launch_moe_qgemv_mr<T, QT, 1>(p, R, xq, stream);
  if (rows <= 2) return launch_moe_qgemv_mr<T, QT, 2>(p, R, xq, stream);
  if (rows <= 4) return launch_moe_qgemv_mr<T, QT, 4>(p, R, xq, stream);
  return launch_moe_qgemv_mr<T, QT, 8>(p, R, xq, stream);
}

// Plain only (p.w3 == nullptr) over the segments with the 64 × 64 tile GEMM (block formats: w 4-byte aligned,
// kQTileAlign, and x 16-byte aligned, else cudaErrorMisalignedAddress).
template <typename T, int32_t QT>
cudaError_t launch_moe_qgemm(const MoeQArgs<T>& p, cudaStream_t stream) {
  using C = QGemmTile<T>;
  if (p.w3) return cudaErrorInvalidValue;
  if (const cudaError_t err = moe_q_args_ok<T, QT>(p); err != cudaSuccess) return err;
  if (QT != kInt8Rowwise && reinterpret_cast<uintptr_t>(p.w) % kQTileAlign != 0) return cudaErrorMisalignedAddress;
  if (p.M == 0 || p.N == 0) return cudaSuccess;
  const int64_t R = moe_q_row_bytes<T, QT>(p.K);
  const int64_t slots = grouped_slots(p.M, p.G, C::BM, true), n_tiles = ceil_div(p.N, C::BN);
  if (slots > 0x7fffffff || n_tiles > 65535) return cudaErrorInvalidConfiguration;
  const bool x_vec = aligned16(p.x) && p.K % C::VE == 0;
  if (kQTileFormat<QT> && !x_vec) return cudaErrorMisalignedAddress;
  const dim3 grid(static_cast<unsigned>(slots), static_cast<unsigned>(n_tiles));
  return simt::launch(moe_qgemm_kernel<T, QT>, grid, dim3(C::THREADS), C::smem_bytes(), stream, p, R, x_vec);
}

}  // namespace mk::inline MK_ABI
