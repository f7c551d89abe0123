// paged_decode.cuh — paged decode attention: one query per sequence over its paged K/V cache, native
// GQA, sliding window, split-K (flash-decoding) with a deterministic second reduction pass (CUDA,
// framework-free).
//
// Shapes: B sequences, Hq / Hkv heads, G = Hq/Hkv, D head_dim, N num_blocks, S block_size, M max_blocks,
// P partitions, PS keys per partition, GC q heads per block (the GQA group, or a slice of 8 of it).
//   q [B, Hq, D] (token stride q_stride), out [B, Hq, D] contiguous,
//   k_cache / v_cache [N, S, Hkv, D], block_tables int32 [B, M], seq_lens int32 [B],
//   split-K workspace (P > 1): part_out f32 [B, Hq, P, D], part_m / part_l f32 [B, Hq, P].
// The query of sequence b sits at pos = seq_lens[b]-1 and sees keys first ≤ j ≤ pos with
// first = first_visible_key(pos, W) (common.cuh). Partition z covers keys [first + z·PS, first + (z+1)·PS).
//
// Grid (Hkv·ceil(G/GC), B, P), 4 warps. Each block streams its partition's K/V rows ONCE for all GC q
// heads of its kv head (native GQA: q heads held in registers). Within a warp, a key is handled by TPK
// lanes (TPK = D/VEC rounded up to a power of two), each loading 16-byte vectors (VEC = 16/sizeof(T)
// elements) of K and V, so a warp reads 32/TPK whole rows per step and the 4 warps interleave steps:
// fully coalesced, no shared memory or barrier in the main loop. Every lane group keeps its own
// online-softmax state (OnlineSoftmax: running max m, sum l; accumulator acc, fp32); the states are merged with
// shuffles across groups, then across warps through shared memory — a fixed order, so the result is
// bit-identical run to run. With P > 1 each block writes its normalised partial output and (m, l);
// paged_decode_reduce_kernel merges the P partials in partition order.
// Keys outside [first, pos] are never loaded: garbage/NaN in unused cache slots cannot leak.
//
// Roofline: memory-bound. Bytes = Σ_b visible_keys_b · Hkv · D · 2 · sizeof(T) (K and V, read once) +
// 2·B·Hq·D·sizeof(T); FLOPs ≈ 4 · that/sizeof(T) · G/2 — arithmetic intensity ≈ G/sizeof(T) FLOP/byte
// (≤ 4 for bf16, G ≤ 8), far below an A100's ~150 FLOP/byte, so the bound is HBM bandwidth: a 4k-token
// context with Hkv = 8, D = 128, bf16 moves 16.8 MB per layer ≈ 8.4 µs at 2 TB/s. Split-K adds
// B·Hq·P·D·4·2 bytes of workspace traffic (≪ K/V for PS = 512) and keeps ≥ ~2 blocks per SM busy
// when B·Hkv alone would not fill the GPU.
#pragma once

#include "../simt/portable.cuh"
#include "common.cuh"

namespace mk::inline MK_ABI {

inline constexpr int kDecodeWarps = 4;
inline constexpr int64_t kDecodeAutoPartition = 512;  // keys per partition when the caller passes 0

// Partitions needed for the longest possible visible range (block-table capacity, or the window).
// Host-side, from shapes only: no device sync.
MK_HD int64_t decode_num_partitions(int64_t capacity, int64_t window, int64_t part_size) {
  const int64_t w = effective_window(window, capacity), range = w > 0 ? w : capacity;
  return range <= part_size ? 1 : ceil_div(range, part_size);
}

// The cache fields (k_cache, v_cache, block_tables, Hkv, S, M, N) come from PagedCache; window is
// effective_window(W, M·S).
template <typename T>
struct DecodeParams : PagedCache<T> {
  T* out;
  const T* q;
  const int32_t* seq_lens;
  float* part_out;  // [B, Hq, P, D]   (P > 1 only)
  float* part_m;    // [B, Hq, P]
  float* part_l;    // [B, Hq, P]
  int64_t q_stride;
  int B, Hq, window, part_size, P;
  float scale;
};

constexpr int pow2_at_least(int n) { return n <= 1 ? 1 : 2 * pow2_at_least((n + 1) / 2); }

template <typename T, int D>
struct DecodeLayout {
  static constexpr int VEC = kVec16<T>;                          // elements per 16-byte vector
  static constexpr int NV = D / VEC;                             // vectors per K/V row
  static constexpr int TPK = NV >= 32 ? 32 : pow2_at_least(NV);  // lanes per key
  static constexpr int VPL = (NV + TPK - 1) / TPK;               // vectors per lane
  static constexpr int KPW = 32 / TPK;                           // keys per warp step
  static_assert(D % VEC == 0, "head_dim must be a multiple of the 16-byte vector");
};

template <typename T, int D, int GC>
__global__ void __launch_bounds__(kDecodeWarps * 32)
paged_decode_kernel(const DecodeParams<T> p) {
  using Lay = DecodeLayout<T, D>;
  using V = Vec<T, Lay::VEC>;
  constexpr int NW = kDecodeWarps, VEC = Lay::VEC, VPL = Lay::VPL, TPK = Lay::TPK, KPW = Lay::KPW;
  constexpr float kNegInf = -INFINITY;
  const auto fast_exp = [](float x) { return __expf(x); };
  __shared__ float s_acc[NW][GC][D];
  __shared__ float s_m[NW][GC];
  __shared__ float s_l[NW][GC];

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int sub = lane % TPK, kslot = lane / TPK;
  const int G = p.Hq / p.Hkv, groups = (G + GC - 1) / GC;
  const int kvh = blockIdx.x / groups;
  const int h0 = kvh * G + (blockIdx.x % groups) * GC;  // first q head of this block
  const int nh = min(GC, kvh * G + G - h0);             // q heads of this block that exist
  const int b = blockIdx.y, part = blockIdx.z;
  const int64_t len = p.seq_lens[b];
  const int64_t first = first_visible_key(len - 1, p.window);
  const int64_t kbeg = first + static_cast<int64_t>(part) * p.part_size;
  const int64_t kend = min(len, kbeg + p.part_size);

  float q[GC][VPL][VEC], acc[GC][VPL][VEC];
  OnlineSoftmax st[GC];
#pragma unroll
  for (int g = 0; g < GC; ++g) {
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
      const int v = sub + i * TPK;
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        acc[g][i][e] = 0.f;
        q[g][i][e] = (g < nh && v < Lay::NV)
                         ? simt::to_float(p.q[b * p.q_stride + static_cast<int64_t>(h0 + g) * D + v * VEC + e]) *
                               p.scale
                         : 0.f;
      }
    }
  }

  const PagedKV<const T> kv = p.sequence(b, kvh, D);
  // j0 is uniform across the warp: every lane runs the same iterations (full-warp shuffles inside).
  for (int64_t j0 = kbeg + warp * KPW; j0 < kend; j0 += NW * KPW) {
    const int64_t j = j0 + kslot;
    const int64_t slot = j < kend ? kv.slot(j) : -1;  // -1 for block ids outside [0, N) too
    const bool valid = slot >= 0;
    const int64_t base = valid ? kv.row(slot) : 0;
    V kr[VPL];
#pragma unroll
    for (int i = 0; i < VPL; ++i) {
      const int v = sub + i * TPK;
      if (valid && v < Lay::NV) {
        kr[i] = *reinterpret_cast<const V*>(kv.k + base + v * VEC);
      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) kr[i].v[e] = simt::from_float<T>(0.f);
      }
    }
    float s[GC];
#pragma unroll
    for (int g = 0; g < GC; ++g) {
      float d = 0.f;
#pragma unroll
      for (int i = 0; i < VPL; ++i)
#pragma unroll
        for (int e = 0; e < VEC; ++e) d += q[g][i][e] * simt::to_float(kr[i].v[e]);
#pragma unroll
      for (int mask = TPK / 2; mask > 0; mask >>= 1) d += simt::shfl_xor(d, mask);
      s[g] = d;
    }
    if (valid) {
      V vv[VPL];
#pragma unroll
      for (int i = 0; i < VPL; ++i) {
        const int v = sub + i * TPK;
        if (v < Lay::NV) {
          vv[i] = *reinterpret_cast<const V*>(kv.v + base + v * VEC);
        } else {
#pragma unroll
          for (int e = 0; e < VEC; ++e) vv[i].v[e] = simt::from_float<T>(0.f);
        }
      }
#pragma unroll
      for (int g = 0; g < GC; ++g) {
        const float alpha = st[g].rescale(s[g], fast_exp);  // 0 on the first key
        const float pr = fast_exp(s[g] - st[g].shift());
        st[g].add(alpha, pr);
#pragma unroll
        for (int i = 0; i < VPL; ++i)
          if (sub + i * TPK < Lay::NV)
#pragma unroll
            for (int e = 0; e < VEC; ++e) acc[g][i][e] = acc[g][i][e] * alpha + pr * simt::to_float(vv[i].v[e]);
      }
    }
  }

  // Merge the KPW lane groups of the warp (butterfly over the key-slot bits of the lane id).
#pragma unroll
  for (int mask = TPK; mask < 32; mask <<= 1) {
#pragma unroll
    for (int g = 0; g < GC; ++g) {
      const float mo = simt::shfl_xor(st[g].m, mask), lo = simt::shfl_xor(st[g].l, mask);
      const OnlineSoftmax::Weights w = st[g].merge(mo, lo, fast_exp);
#pragma unroll
      for (int i = 0; i < VPL; ++i)
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const float ao = simt::shfl_xor(acc[g][i][e], mask);
          acc[g][i][e] = acc[g][i][e] * w.self + ao * w.other;
        }
    }
  }
  if (kslot == 0) {
#pragma unroll
    for (int g = 0; g < GC; ++g) {
#pragma unroll
      for (int i = 0; i < VPL; ++i) {
        const int v = sub + i * TPK;
        if (v < Lay::NV)
#pragma unroll
          for (int e = 0; e < VEC; ++e) s_acc[warp][g][v * VEC + e] = acc[g][i][e];
      }
      if (lane == 0) {
        s_m[warp][g] = st[g].m;
        s_l[warp][g] = st[g].l;
      }
    }
  }
  __syncthreads();
  // Merge the warps in warp order; thread → (head, dim).
  for (int idx = threadIdx.x; idx < GC * D; idx += blockDim.x) {
    const int g = idx / D, d = idx % D;
    if (g >= nh) continue;
    float mx = kNegInf;
#pragma unroll
    for (int w = 0; w < NW; ++w) mx = fmaxf(mx, s_m[w][g]);
    float o = 0.f, lsum = 0.f;
#pragma unroll
    for (int w = 0; w < NW; ++w) {
      const float wt = OnlineSoftmax::weight(s_m[w][g], mx, fast_exp);
      lsum += wt * s_l[w][g];
      o += wt * s_acc[w][g][d];
    }
    const float val = o * OnlineSoftmax::normalizer(lsum);
    const int64_t bh = static_cast<int64_t>(b) * p.Hq + h0 + g;
    if (p.P == 1) {
      p.out[bh * D + d] = simt::from_float<T>(val);
    } else {
      p.part_out[(bh * p.P + part) * D + d] = val;
      if (d == 0) {
        p.part_m[bh * p.P + part] = mx;
        p.part_l[bh * p.P + part] = lsum;
      }
    }
  }
}

// Second pass of split-K: the P partial states merged in partition order (deterministic):
// out[b, h] = Σ_z w_z · part_out[b, h, z] / Σ_z w_z, w_z = l_z · OnlineSoftmax::weight(m_z, max m) (part_out
// is normalised, so its accumulator is part_out · l_z). Grid (Hq, B), threads over D.
template <typename T>
__global__ void __launch_bounds__(128) paged_decode_reduce_kernel(const DecodeParams<T> p, int D) {
  const auto fast_exp = [](float x) { return __expf(x); };
  const int h = blockIdx.x, b = blockIdx.y;
  const int64_t bh = static_cast<int64_t>(b) * p.Hq + h;
  const float* pm = p.part_m + bh * p.P;
  const float* pl = p.part_l + bh * p.P;
  float mx = -INFINITY;
  for (int z = 0; z < p.P; ++z) mx = fmaxf(mx, pm[z]);  // empty partitions: -inf
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float o = 0.f, lsum = 0.f;
    for (int z = 0; z < p.P; ++z) {
      const float w = OnlineSoftmax::weight(pm[z], mx, fast_exp) * pl[z];
      lsum += w;
      o += w * p.part_out[(bh * p.P + z) * D + d];
    }
    p.out[bh * D + d] = simt::from_float<T>(o * OnlineSoftmax::normalizer(lsum));
  }
}

template <typename T, int D>
cudaError_t launch_paged_decode_d(const DecodeParams<T>& p, cudaStream_t stream) {
  const int G = p.Hq / p.Hkv;
  const int GC = G == 1 ? 1 : G <= 4 ? 4 : 8;
  const dim3 grid(static_cast<unsigned>(p.Hkv * ((G + GC - 1) / GC)), static_cast<unsigned>(p.B),
                  static_cast<unsigned>(p.P));
  const dim3 block(kDecodeWarps * 32);
  cudaError_t err;
  if (GC == 1)
    err = simt::launch(paged_decode_kernel<T, D, 1>, grid, block, 0, stream, p);
  else if (GC == 4)
    err = simt::launch(paged_decode_kernel<T, D, 4>, grid, block, 0, stream, p);
  else
    err = simt::launch(paged_decode_kernel<T, D, 8>, grid, block, 0, stream, p);
  if (err != cudaSuccess || p.P == 1) return err;
  return simt::launch(paged_decode_reduce_kernel<T>, dim3(static_cast<unsigned>(p.Hq), static_cast<unsigned>(p.B)),
                      dim3(128), 0, stream, p, D);
}

// p.P / p.part_size from decode_num_partitions; workspace pointers valid when p.P > 1. The caches
// must be 16-byte aligned (else cudaErrorMisalignedAddress); q is read with scalar loads (any stride).
template <typename T>
cudaError_t launch_paged_decode(const DecodeParams<T>& p, int D, cudaStream_t stream) {
  if (p.B == 0 || p.Hq == 0) return cudaSuccess;
  if (!aligned16(p.k_cache) || !aligned16(p.v_cache)) return cudaErrorMisalignedAddress;
  return with_head_dim(D, cudaErrorInvalidValue,
                       [&](auto d) { return launch_paged_decode_d<T, decltype(d)::value>(p, stream); });
}

}  // namespace mk::inline MK_ABI
