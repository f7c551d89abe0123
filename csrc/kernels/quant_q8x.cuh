// quant_q8x.cuh — int8 activations for the quantized GEMV (CUDA, framework-free; emulated by csrc/simt): x
// quantized once per call to 16-element int8 blocks, and per weight format the dot product of one lane's
// share of a weight block with those blocks by dp4a (4 int8 products per instruction).
//
// Shapes: M rows of x (P ≥ M padded rows in the workspace, the rows past M zero), K in features (K % 16 == 0),
// QK / bytes the weight block geometry (quant_blocks.h), MR the rows a GEMV slot computes.
//
// The workspace (q8x_workspace_bytes): xq int8 [P, K] then, 16-byte aligned, xs float2 [P, K / 16]. For x
// block b = x[m, 16b … 16b + 15] with amax = max |x|:  d = amax / 127,  q_i = rint(x_i · 127 / amax) ∈ [-127, 127],
// xs = (d, d · Σ q_i). So x̂_i = d · q_i and |x_i − x̂_i| ≤ d / 2 · (1 + 5·10⁻⁵) (the rounding of d and of
// x · 127 / amax). Every format's weight block is y = a · q_w + c per 16 elements (a, c from the block's
// scales; quant_blocks.h), hence Σ y · x̂ = a · d · Σ q_w q_x + c · (d · Σ q_x): one dp4a chain and the
// precomputed sum. The GEMV's result is Σ_k W[n, k] · x̂[m, k] up to fp32 rounding: compared with the exact
// product, |out − x·Wᵀ| ≤ Σ_b d_b / 2 · Σ_{k ∈ b} |W[n, k]| (+ fp32 and output rounding) — the bound the
// tests check (tests/test_quant_cuda.py). A non-finite x in a block makes d (and the row's outputs) NaN.
//
// Lanes per weight block (kQ8Lanes) and what a lane reads (a block at `blk`, lane share `sub`):
//   Q4_0  1 lane  (18 B, 2-byte aligned): d (2-byte load), qs 16 B (aligned 4-byte loads + funnel shifts)
//   Q4_1  1 lane  (20 B, 4-byte aligned): d | m and qs as 5 aligned 4-byte loads
//   Q8_0  1 lane  (34 B, 2-byte aligned): d, qs 2 × 16 B (aligned 4-byte loads + funnel shifts)
//   Q4_K  8 lanes (144 B, 16-byte aligned): header (d, dmin, scales) one 16-byte load, qs[32p + l0 …+15] one
//                 16-byte load (p = sub / 2, l0 = 16 · (sub % 2)): elements 64p + l0 … (low nibbles, sub-block
//                 2p) and 64p + 32 + l0 … (high nibbles, 2p + 1)
//   Q5_K  8 lanes (176 B, 16-byte aligned): as Q4_K plus qh[l0 … l0+15], a third 16-byte load
//   Q6_K  4 lanes (210 B, 2-byte aligned): h = sub / 2, l0 = 16 · (sub % 2): ql[64h + l0 …], ql[64h + 32 + l0 …],
//                 qh[32h + l0 …] (16 B each, aligned 4-byte loads + funnel shifts), 4 int8 scales, d:
//                 elements 128h + 32c + l0 … (c = 0 … 3)
// 16-byte vector loads need 16-byte aligned blocks: Q4_K / Q5_K only (144 / 176 B); the 2-byte aligned
// formats read the aligned 4-byte words around their bytes (never past the word holding the last one).
#pragma once

#include <cstdint>
#include <type_traits>

#include "../simt/portable.cuh"
#include "common.cuh"
#include "quant_blocks.h"

namespace mk::inline MK_ABI {

inline constexpr int kQ8Block = 16;      // x elements per int8 block
inline constexpr int kQ8PadRows = 8;     // zero rows after the M rows of x (a GEMV slot reads MR ≤ 8 rows)

// Lanes sharing one weight block (see the header).
template <int32_t QT>
inline constexpr int kQ8Lanes = QT == kQ4_K || QT == kQ5_K ? 8 : QT == kQ6_K ? 4 : 1;

// True when the int8-activation GEMV serves T and QT: fp16 / bf16 x (fp32 x keeps the exact kernel: its
// callers ask for fp32 results) and a GGUF block format (INT8_ROWWISE keeps the exact kernel).
template <typename T, int32_t QT>
inline constexpr bool kQ8Path = (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) && QT != kInt8Rowwise;

MK_HD int64_t q8x_rows(int64_t M) { return M + kQ8PadRows; }
MK_HD int64_t q8x_scales_offset(int64_t M, int64_t K) { return (q8x_rows(M) * K + 15) / 16 * 16; }
// Bytes of the workspace of x [M, K].
inline int64_t q8x_workspace_bytes(int64_t M, int64_t K) {
  return q8x_scales_offset(M, K) + q8x_rows(M) * (K / kQ8Block) * static_cast<int64_t>(sizeof(float2));
}

struct Q8X {
  const int8_t* q;   // [P, K]
  const float2* s;   // [P, K / 16]
  int64_t K;
};
inline Q8X q8x_view(const void* ws, int64_t M, int64_t K) {
  const auto* base = static_cast<const uint8_t*>(ws);
  return {reinterpret_cast<const int8_t*>(base), reinterpret_cast<const float2*>(base + q8x_scales_offset(M, K)), K};
}

// One thread per x block: rows ≥ M are written as zeros.
template <typename T>
__global__ void __launch_bounds__(256) quantize_x_q8_kernel(void* ws, const T* __restrict__ x, int64_t M, int64_t K) {
  const int64_t nb = K / kQ8Block, b = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;
  if (b >= q8x_rows(M) * nb) return;
  const int64_t m = b / nb, k0 = (b % nb) * kQ8Block;
  auto* xq = static_cast<int8_t*>(ws);
  auto* xs = reinterpret_cast<float2*>(static_cast<uint8_t*>(ws) + q8x_scales_offset(M, K));
  float v[kQ8Block];
  float amax = 0.f;
  bool finite = true;
#pragma unroll
  for (int i = 0; i < kQ8Block; ++i) {
    v[i] = m < M ? simt::to_float(x[m * K + k0 + i]) : 0.f;
    const float a = fabsf(v[i]);
    finite = finite && a <= 3.402823466e38f;  // false for ±inf and NaN
    amax = fmaxf(amax, a);
  }
  const float inv = finite && amax > 0.f ? 127.f / amax : 0.f;
  uint32_t words[4] = {0u, 0u, 0u, 0u};
  int sum = 0;
#pragma unroll
  for (int i = 0; i < kQ8Block; ++i) {
    const int q = __float2int_rn(v[i] * inv);
    sum += q;
    words[i / 4] |= static_cast<uint32_t>(q & 255) << (8 * (i % 4));
  }
  *reinterpret_cast<uint4*>(xq + m * K + k0) = make_uint4(words[0], words[1], words[2], words[3]);
  const float d = finite ? amax / 127.f : __int_as_float(0x7fc00000);  // NaN: the row's outputs become NaN
  xs[b] = make_float2(d, d * static_cast<float>(sum));
}

// x [M, K] (contiguous, K % 16 == 0) → the workspace at ws (q8x_workspace_bytes(M, K) bytes, 16-byte aligned).
template <typename T>
cudaError_t launch_quantize_x_q8(void* ws, const T* x, int64_t M, int64_t K, cudaStream_t stream) {
  const int64_t blocks = ceil_div(q8x_rows(M) * (K / kQ8Block), 256);
  if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
  return simt::launch(quantize_x_q8_kernel<T>, dim3(static_cast<unsigned>(blocks)), dim3(256), 0, stream, ws, x, M,
                      K);
}

// ---- loads ---------------------------------------------------------------------------------------------
__device__ __forceinline__ uint4 q8_ld16(const void* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ uint32_t q8_ld4(const void* p) { return *reinterpret_cast<const uint32_t*>(p); }
__device__ __forceinline__ uint32_t q8_funnel(uint32_t lo, uint32_t hi, unsigned sh) {
#if defined(__CUDA_ARCH__)
  return __funnelshift_r(lo, hi, sh);
#else
  return static_cast<uint32_t>((static_cast<uint64_t>(hi) << 32 | lo) >> sh);
#endif
}
// 16 bytes at a 2-byte aligned p: the aligned words around them, funnel-shifted (reads up to the word holding
// p[15], never past it).
__device__ __forceinline__ void q8_ld16_a2(const uint8_t* p, uint32_t (&w)[4]) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint32_t* b = reinterpret_cast<const uint32_t*>(a & ~static_cast<uintptr_t>(3));
  const uint32_t last = *reinterpret_cast<const uint32_t*>((a + 15) & ~static_cast<uintptr_t>(3));
  const unsigned sh = static_cast<unsigned>(a & 3) * 8;
  const uint32_t v0 = b[0], v1 = b[1], v2 = b[2], v3 = b[3];
  w[0] = q8_funnel(v0, v1, sh);
  w[1] = q8_funnel(v1, v2, sh);
  w[2] = q8_funnel(v2, v3, sh);
  w[3] = q8_funnel(v3, last, sh);
}
__device__ __forceinline__ float q8_half_lo(uint32_t w) { return fp16_to_float(static_cast<uint16_t>(w & 0xffffu)); }
__device__ __forceinline__ float q8_half_hi(uint32_t w) { return fp16_to_float(static_cast<uint16_t>(w >> 16)); }

// Σ_i w_i · x_i over 16 elements: 4 weight words (4 signed bytes each) and 16 int8 x at xq (16-byte aligned).
__device__ __forceinline__ float q8_dot16(const uint32_t (&w)[4], const int8_t* xq) {
  const uint4 x = q8_ld16(xq);
  int s = simt::dp4a(static_cast<int>(w[0]), static_cast<int>(x.x), 0);
  s = simt::dp4a(static_cast<int>(w[1]), static_cast<int>(x.y), s);
  s = simt::dp4a(static_cast<int>(w[2]), static_cast<int>(x.z), s);
  s = simt::dp4a(static_cast<int>(w[3]), static_cast<int>(x.w), s);
  return static_cast<float>(s);
}

// acc[m] += Σ over the lane's share of the weight block at blk (format QT, lane share sub) of W · x̂[m] for
// m < MR; xq / xs: row 0's int8 x and scales at the block's first element, row stride K / (K / 16).
template <int32_t QT, int MR>
__device__ __forceinline__ void q8_lane_dot(const uint8_t* __restrict__ blk, int sub, const int8_t* __restrict__ xq,
                                            const float2* __restrict__ xs, int64_t K, float (&acc)[MR]) {
  const int64_t KS = K / kQ8Block;
  if constexpr (QT == kQ4_0 || QT == kQ4_1 || QT == kQ8_0) {
    uint32_t lo[4], hi[4];  // elements 0-15, 16-31 (Q8_0: signed bytes; Q4: nibbles 0 … 15)
    float d, c;             // y = d · q + c
    if constexpr (QT == kQ4_1) {
      const uint32_t dm = q8_ld4(blk);
      d = q8_half_lo(dm);
      c = q8_half_hi(dm);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t q = q8_ld4(blk + 4 + 4 * i);
        lo[i] = q & 0x0F0F0F0Fu;
        hi[i] = (q >> 4) & 0x0F0F0F0Fu;
      }
    } else if constexpr (QT == kQ4_0) {
      d = load_fp16(blk);
      c = -8.f * d;
      uint32_t q[4];
      q8_ld16_a2(blk + 2, q);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        lo[i] = q[i] & 0x0F0F0F0Fu;
        hi[i] = (q[i] >> 4) & 0x0F0F0F0Fu;
      }
    } else {
      d = load_fp16(blk);
      c = 0.f;
      q8_ld16_a2(blk + 2, lo);
      q8_ld16_a2(blk + 18, hi);
    }
#pragma unroll
    for (int m = 0; m < MR; ++m) {
      const float4 s = *reinterpret_cast<const float4*>(xs + m * KS);  // x blocks 0, 1 of the weight block
      const float dot = s.x * q8_dot16(lo, xq + m * K) + s.z * q8_dot16(hi, xq + m * K + 16);
      acc[m] = fmaf(d, dot, acc[m]);
      if constexpr (QT != kQ8_0) acc[m] = fmaf(c, s.y + s.w, acc[m]);
    }
  } else if constexpr (QT == kQ4_K || QT == kQ5_K) {
    const int p = sub >> 1, half = sub & 1;
    const uint4 hdr = q8_ld16(blk);
    const uint4 qs = q8_ld16(blk + (QT == kQ5_K ? 48 : 16) + 32 * p + 16 * half);
    // 6-bit scales and mins of sub-blocks 2p, 2p + 1 (scale_min_k4): bytes 2(p % 2), +1 of the three words
    const unsigned sh = 16u * static_cast<unsigned>(p & 1);
    const uint32_t a = hdr.y >> sh, b = hdr.z >> sh, cw = hdr.w >> sh;
    const bool upper = p >= 2;
    const uint32_t sc2 = upper ? (cw & 0x0F0Fu) | ((a >> 2) & 0x3030u) : a & 0x3F3Fu;
    const uint32_t mn2 = upper ? ((cw >> 4) & 0x0F0Fu) | ((b >> 2) & 0x3030u) : b & 0x3F3Fu;
    const float d = q8_half_lo(hdr.x), dmin = q8_half_hi(hdr.x);
    const float ds0 = d * small_u2f(sc2 & 255u), ds1 = d * small_u2f(sc2 >> 8);
    const float ms0 = dmin * small_u2f(mn2 & 255u), ms1 = dmin * small_u2f(mn2 >> 8);
    uint32_t lo[4] = {qs.x & 0x0F0F0F0Fu, qs.y & 0x0F0F0F0Fu, qs.z & 0x0F0F0F0Fu, qs.w & 0x0F0F0F0Fu};
    uint32_t hi[4] = {(qs.x >> 4) & 0x0F0F0F0Fu, (qs.y >> 4) & 0x0F0F0F0Fu, (qs.z >> 4) & 0x0F0F0F0Fu,
                      (qs.w >> 4) & 0x0F0F0F0Fu};
    if constexpr (QT == kQ5_K) {  // bit 2p (low) / 2p + 1 (high) of qh[l0 + …] → bit 4 of each byte
      const uint4 qh = q8_ld16(blk + 16 + 16 * half);
      const uint32_t h[4] = {qh.x, qh.y, qh.z, qh.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        lo[i] |= ((h[i] >> (2 * p)) & 0x01010101u) << 4;
        hi[i] |= ((h[i] >> (2 * p + 1)) & 0x01010101u) << 4;
      }
    }
    const int e0 = 64 * p + 16 * half;  // first element of the low group; the high group is at e0 + 32
#pragma unroll
    for (int m = 0; m < MR; ++m) {
      const float2 s0 = xs[m * KS + e0 / 16], s1 = xs[m * KS + e0 / 16 + 2];
      acc[m] = fmaf(ds0 * s0.x, q8_dot16(lo, xq + m * K + e0), acc[m]);
      acc[m] = fmaf(ds1 * s1.x, q8_dot16(hi, xq + m * K + e0 + 32), acc[m]);
      acc[m] = fmaf(-ms0, s0.y, acc[m]);
      acc[m] = fmaf(-ms1, s1.y, acc[m]);
    }
  } else if constexpr (QT == kQ6_K) {
    const int h = sub >> 1, half = sub & 1;
    uint32_t A[4], B[4], H[4];
    q8_ld16_a2(blk + 64 * h + 16 * half, A);
    q8_ld16_a2(blk + 64 * h + 32 + 16 * half, B);
    q8_ld16_a2(blk + 128 + 32 * h + 16 * half, H);
    const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192 + 8 * h + half);
    const float d = load_fp16(blk + 208);
    float ds[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) ds[c] = d * static_cast<float>(sc[2 * c]);
    uint32_t q[4][4];  // group c (elements 128h + 32c + l0 …): 4 low bits from ql, 2 high bits from qh
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      q[0][i] = (A[i] & 0x0F0F0F0Fu) | ((H[i] << 4) & 0x30303030u);
      q[1][i] = (B[i] & 0x0F0F0F0Fu) | ((H[i] << 2) & 0x30303030u);
      q[2][i] = ((A[i] >> 4) & 0x0F0F0F0Fu) | (H[i] & 0x30303030u);
      q[3][i] = ((B[i] >> 4) & 0x0F0F0F0Fu) | ((H[i] >> 2) & 0x30303030u);
    }
    const int e0 = 128 * h + 16 * half;
#pragma unroll
    for (int m = 0; m < MR; ++m) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {  // y = d · sc · (q − 32): Σ y x̂ = d·sc·(dx · Σ q q_x − 32 · s)
        const float2 s = xs[m * KS + e0 / 16 + 2 * c];
        acc[m] = fmaf(ds[c], fmaf(s.x, q8_dot16(q[c], xq + m * K + e0 + 32 * c), -32.f * s.y), acc[m]);
      }
    }
  }
}

}  // namespace mk::inline MK_ABI
