// moe_router.cuh — top-k softmax router (CUDA, framework-free).
//
// Shapes: T tokens, E experts, k top-k (1 ≤ k ≤ min(E, 32)).
//   logits [T, E] contiguous (fp32 / fp16 / bf16)  →  weights fp32 [T, k], ids int32 [T, k]
// One warp per token, 4 warps per block. Lane l owns the experts e ≡ l (mod 32):
//   FAST (E ≤ 32): the lane's one probability lives in a register;
//   general (E > 32): the lane's probabilities live in its warp's slab of dynamic shared memory, read and
//   written only by the owning lane (no cross-lane shared-memory traffic, hence no barriers).
// softmax in fp32 (max, exp, sum by warp butterflies), then k rounds of a warp argmax on (p, id) with
// ties → lower id; the winner's owner excludes it (p = -1 < any probability). Round j's winner is kept
// by lane j, which writes weight j (divided by the sum of the k winners when renormalising).
// The probabilities are held as router_rank keys (common.cuh: NaN ranks below every number), so NaN / Inf
// logits still give k distinct experts, the same ones as the CPU router.
// Bound: memory, T·E·sizeof(T) bytes read — negligible next to the expert GEMMs.
#pragma once

#include "../simt/portable.cuh"
#include "common.cuh"

namespace mk::inline MK_ABI {

inline constexpr int kRouterWarps = 4;
inline constexpr int kRouterMaxExperts = 4096;  // general path: kRouterWarps·E floats of shared memory

// (v, i) beats (ov, oi): larger probability, ties → lower expert id.
__device__ __forceinline__ bool router_better(float v, int i, float ov, int oi) {
  return v > ov || (v == ov && i < oi);
}

template <typename T, bool FAST>
__global__ void __launch_bounds__(kRouterWarps * 32)
topk_softmax_kernel(float* __restrict__ weights, int32_t* __restrict__ ids, const T* __restrict__ logits,
                    int64_t num_tokens, int E, int k, bool renormalize) {
  SIMT_DYN_SMEM(float, slab);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouterWarps + warp;
  if (t >= num_tokens) return;  // whole warp
  const T* l = logits + t * E;
  float* p = slab + warp * E;  // general path only; entry e touched by lane e % 32 only

  float reg = -INFINITY, m = -INFINITY;
  if constexpr (FAST) {
    if (lane < E) reg = simt::to_float(l[lane]);
    m = reg;
  } else {
    for (int e = lane; e < E; e += 32) {
      const float v = simt::to_float(l[e]);
      p[e] = v;
      m = fmaxf(m, v);
    }
  }
  m = simt::warp_max(m);
  float s = 0.f;
  if constexpr (FAST) {
    reg = lane < E ? expf(reg - m) : 0.f;
    s = reg;
  } else {
    for (int e = lane; e < E; e += 32) {
      const float v = expf(p[e] - m);
      p[e] = v;
      s += v;
    }
  }
  const float inv_s = 1.f / simt::warp_sum(s);
  if constexpr (FAST) {
    reg = lane < E ? router_rank(reg * inv_s) : -2.f;  // lanes without an expert never win
  } else {
    for (int e = lane; e < E; e += 32) p[e] = router_rank(p[e] * inv_s);
  }

  float mine = 0.f, chosen = 0.f;
  int mine_id = 0;
  for (int j = 0; j < k; ++j) {
    float bv = -2.f;
    int bi = 0x7fffffff;
    if constexpr (FAST) {
      if (lane < E) bv = reg, bi = lane;
    } else {
      for (int e = lane; e < E; e += 32)
        if (p[e] > bv) bv = p[e], bi = e;  // ascending e, strict '>': ties keep the lower id
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = simt::shfl_xor(bv, off);
      const int oi = simt::shfl_xor(bi, off);
      if (router_better(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    // Lane 0's answer is everyone's (keys are never NaN, so every lane agrees anyway).
    bv = simt::shfl(bv, 0);
    bi = simt::shfl(bi, 0);
    if (bi < 0 || bi >= E) bi = 0;  // unreachable (k <= E: an unchosen expert always ranks above -1)
    if ((bi & 31) == lane) {
      if constexpr (FAST) reg = -1.f;
      else p[bi] = -1.f;
    }
    bv = router_weight(bv);
    if (lane == j) mine = bv, mine_id = bi;
    chosen += bv;
  }
  if (lane < k) {
    weights[t * k + lane] = renormalize ? mine / chosen : mine;
    ids[t * k + lane] = mine_id;
  }
}

template <typename T>
cudaError_t launch_topk_softmax(float* weights, int32_t* ids, const T* logits, int64_t num_tokens, int E, int k,
                                bool renormalize, cudaStream_t stream) {
  if (num_tokens == 0) return cudaSuccess;
  if (E < 1 || E > kRouterMaxExperts || k < 1 || k > 32 || k > E) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(ceil_div(num_tokens, kRouterWarps))), block(kRouterWarps * 32);
  if (E <= 32)
    return simt::launch(topk_softmax_kernel<T, true>, grid, block, 0, stream, weights, ids, logits, num_tokens, E, k,
                        renormalize);
  const size_t smem = sizeof(float) * kRouterWarps * static_cast<size_t>(E);
  return simt::launch(topk_softmax_kernel<T, false>, grid, block, smem, stream, weights, ids, logits, num_tokens, E,
                      k, renormalize);
}

}  // namespace mk::inline MK_ABI
