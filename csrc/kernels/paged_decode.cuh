// paged_decode.cuh — paged decode attention: one query per sequence over its paged K/V cache, native
// GQA, sliding window, split-K (flash-decoding) with a deterministic second reduction pass (CUDA,
// framework-free).
//
// Shapes: B sequences, Hq / Hkv heads, G = Hq/Hkv, D head_dim, N num_blocks, S block_size, M max_blocks,
// P partitions, PS keys per partition, GC q heads per block (1, or a slice of 4 of the GQA group).
//   q [B, Hq, D] (token stride q_stride), out [B, Hq, D] contiguous,
//   k_cache / v_cache [N, S, Hkv, D], block_tables int32 [B, M], seq_lens int32 [B],
//   split-K workspace (P > 1): part_out f32 [B, Hq, P, D], part_m / part_l f32 [B, Hq, P].
// The query of sequence b sits at pos = seq_lens[b]-1 and sees keys first ≤ j ≤ pos with
// first = first_visible_key(pos, W) (common.cuh). Partition z covers keys [first + z·PS, first + (z+1)·PS),
// PS = decode_partition_size: the caller's partition_size, or (automatic, p.part_size = 0) the sequence's
// own visible keys split over the P planned partitions, in multiples of 32 keys — so a short sequence in
// a table planned for a long capacity (the static buffers of the CUDA-graph runner) still spreads over
// the partitions instead of leaving all but the first one idle.
//
// Grid (Hkv·ceil(G/GC), B, P), 4 warps (B in chunks of ≤ 65535 launches, p.b0 the chunk's first sequence;
// P and the partition size from decode_plan, attention_plan.h; partitions past a sequence's keys exit at
// once). Each block streams its partition's K/V rows ONCE for all GC q heads of its kv head (native GQA:
// q heads held in registers). Within a warp, a key is handled by TPK lanes (TPK = D/VEC rounded up to a
// power of two), each loading 16-byte vectors (VEC = 16/sizeof(T) elements) of K and V, so a warp step
// reads KPW = 32/TPK whole rows; no shared memory or barrier in the main loop.
// Main loop: warp w walks chunks of CW = U·KPW consecutive keys (U = 4 steps), the 4 warps side by side
// (chunk c0 = kbeg + w·CW, then + 4·CW). Per chunk every lane first issues the K and V loads of all U
// steps — 2·U·VPL independent 16-byte loads in flight before the first dependent FMA — then does the
// math. Block table: each lane holds one block id of a 32-block window of the sequence's table row (one
// coalesced warp read when a chunk leaves the window: once per block and warp, not per key); a key's
// block id comes by a shuffle, its block and in-block offset by 32-bit math (j / S, j - lb·S), only the
// element offset of the row is 64-bit.
// Every lane group keeps its own online-softmax state (OnlineSoftmax: running max m, sum l; accumulator
// acc, fp32); the states are merged with shuffles across groups, then across warps through shared memory
// — a fixed order, so the result is bit-identical run to run. With P > 1 each block writes its normalised
// partial output and (m, l); paged_decode_reduce_kernel merges the P partials in partition order.
// Keys outside [first, pos] are never loaded: garbage/NaN in unused cache slots cannot leak.
//
// Roofline: memory-bound. Bytes per call = Σ_b visible_keys_b · Hkv · D · 2 · sizeof(T) (K and V, read
// once; GC = 4 of a G = 8 group: the second block's reads mostly hit L2) + 2·B·Hq·D·sizeof(T) (q, out)
// + with P > 1 the workspace, written and read once: 2 · B·Hq·P·(D + 2)·4. FLOPs ≈ 4 · Σ_b keys_b · Hq · D:
// arithmetic intensity ≈ G / sizeof(T) FLOP/byte (≤ 4 for bf16, G ≤ 8), far below an A100's ~150
// FLOP/byte, so the bound is HBM bandwidth.
//
// Design estimate (NOT measured: no GPU has run this version; benchmarks/bench_attention.py --device cuda
// measures it). Mistral 7B (32 layers, Hkv = 8, D = 128, bf16: 4 KiB of K+V per token and layer):
//   B = 1, 4k context: K+V 16.8 MB per layer (537 MB per decode step, 32 layers) + split-K workspace
//     (43 partitions · 32 heads · 130 · 4 B, written and read) 1.4 MB (8 %) → ≈ 5.4 µs per layer at an
//     H100's ~3.35 TB/s;
//   B = 64, 4k context: 1.07 GB per layer → ≈ 320 µs at 3.35 TB/s; one partition per block (no workspace).
// In flight per SM (D = 128 bf16, VPL = 1): 3 blocks (__launch_bounds__; ptxas sm_80 / sm_90: ≤ 168
// registers for every instance, no spills) · 128 threads · 8 loads · 16 B = 48 KiB, about 3× what Little's
// law asks at ~3.35 TB/s and ~0.6 µs latency over 132 SMs (≈ 15 KiB per SM). Expected: 70–85 % of the HBM
// bandwidth (the range a streaming copy kernel reaches) for ≥ 2k-key contexts once ≥ 2 blocks per SM are
// busy (attention_plan.h plans the partitions for that); the split-K workspace and the reduce launch cost
// the rest at batch 1. Below ~512 keys the step is launch- and latency-bound (a few µs whatever the kernel
// does): the CUDA graphs of mistral_kernels/decode_graphs.py remove the launch overhead there.
#pragma once

#include "../simt/portable.cuh"
#include "attention_plan.h"
#include "common.cuh"

namespace mk::inline MK_ABI {

inline constexpr int kDecodeWarps = 4;

// Keys per partition of a sequence with `keys` visible keys: the fixed size, or 0 → automatic (see the
// header): ceil(keys / P) rounded up to 32, so at most P partitions are used.
MK_HD int64_t decode_partition_size(int64_t fixed, int64_t keys, int P) {
  if (fixed > 0) return fixed;
  const int64_t per = ceil_div(keys > 0 ? keys : 1, P);
  return ceil_div(per, kDecodeMinPartition) * kDecodeMinPartition;
}

// The longest possible visible range of a query: the block-table capacity, or the window (the `range` of
// decode_plan). Host-side, from shapes only: no device sync.
MK_HD int64_t decode_key_range(int64_t capacity, int64_t window) {
  const int64_t w = effective_window(window, capacity);
  return w > 0 ? w : capacity;
}

// q heads one block serves (GC): 1 without GQA, else slices of 4 of the group. A GC = 8 instance needs
// ~246 registers (2 blocks per SM) or spills under a 3-blocks-per-SM bound; G = 8 therefore runs two
// blocks per kv head, which read the same K/V rows (the second one mostly from L2).
MK_HD int decode_group_chunk(int G) { return G == 1 ? 1 : 4; }

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
  int B, Hq, window, part_size, P;  // part_size 0: automatic per sequence (decode_partition_size)
  int b0;  // first sequence of this launch (B is split into chunks of ≤ 65535: grid.y)
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
__global__ void __launch_bounds__(kDecodeWarps * 32, 3)  // ≥ 3 blocks per SM (ptxas: ≤ 168 registers)
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
  const int b = p.b0 + static_cast<int>(blockIdx.y), part = blockIdx.z;
  const int len = p.seq_lens[b];
  const int first = static_cast<int>(first_visible_key(len - 1, p.window));
  const int64_t part_size = decode_partition_size(p.part_size, len - first, p.P);
  const int64_t kbeg64 = first + static_cast<int64_t>(part) * part_size;
  // A partition past the sequence's keys does nothing (the reduce never reads it); partition 0 always
  // runs so that a sequence without keys still writes its zeros. Block-uniform.
  if (part > 0 && kbeg64 >= len) return;
  const int kbeg = static_cast<int>(kbeg64);  // < len: 32-bit key indices from here on
  const int kend = static_cast<int>(min(static_cast<int64_t>(len), kbeg64 + part_size));

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
  // Warp w walks chunks of CW = U·KPW consecutive keys, c0 = kbeg + w·CW, + NW·CW per iteration; within a
  // chunk, step u covers keys c0 + u·KPW + [0, KPW), lane group kslot takes one. Every lane first issues the
  // K and V loads of all U steps (2·U·VPL 16-byte loads in flight), then does the math. c0 is uniform across
  // the warp: every lane runs the same iterations and steps (full-warp shuffles inside); a key past kend is
  // invalid, its lanes load nothing.
  // Block table: lane l holds the id of logical block tb + l (a window of 32 blocks, int32, loaded with one
  // coalesced warp read when the chunk leaves it — once per block and warp, not per key), -1 past the
  // sequence's blocks or outside [0, N). A key j then needs only 32-bit math: lb = j / S, offset j - lb·S,
  // its block id by a shuffle from lane lb - tb; the 64-bit element offset comes last.
  constexpr int U = 4, CW = U * KPW;
  static_assert(CW <= 32, "a chunk spans at most CW blocks: the 32-block window always holds them");
  const int S = kv.block_size;
  const int nblk = (kend - 1) / S + 1;  // logical blocks holding keys < kend
  int tb = -64, bid = -1;               // window start (none yet: the first chunk loads it)
  for (int c0 = kbeg + warp * CW; c0 < kend; c0 += NW * CW) {
    if ((min(c0 + CW, kend) - 1) / S >= tb + 32) {  // warp-uniform
      tb = c0 / S;
      const int lb = tb + lane;
      bid = lb < nblk ? kv.block_table[lb] : -1;
      if (bid >= kv.num_blocks) bid = -1;
    }
    V kr[U][VPL], vr[U][VPL];
    bool valid[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = c0 + u * KPW + kslot;
      const int lb = j / S;
      const int blk = simt::shfl(bid, (lb - tb) & 31);  // all lanes shuffle; used only for j < kend
      valid[u] = j < kend && blk >= 0;
      const int64_t base = valid[u] ? kv.row(static_cast<int64_t>(blk) * S + (j - lb * S)) : 0;
#pragma unroll
      for (int i = 0; i < VPL; ++i) {
        const int v = sub + i * TPK;
        if (valid[u] && v < Lay::NV) {
          kr[u][i] = *reinterpret_cast<const V*>(kv.k + base + v * VEC);
          vr[u][i] = *reinterpret_cast<const V*>(kv.v + base + v * VEC);
        } else {
#pragma unroll
          for (int e = 0; e < VEC; ++e) kr[u][i].v[e] = vr[u][i].v[e] = simt::from_float<T>(0.f);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float s[GC];
#pragma unroll
      for (int g = 0; g < GC; ++g) {
        float d = 0.f;
#pragma unroll
        for (int i = 0; i < VPL; ++i)
#pragma unroll
          for (int e = 0; e < VEC; ++e) d += q[g][i][e] * simt::to_float(kr[u][i].v[e]);
#pragma unroll
        for (int mask = TPK / 2; mask > 0; mask >>= 1) d += simt::shfl_xor(d, mask);
        s[g] = d;
      }
      if (valid[u]) {
#pragma unroll
        for (int g = 0; g < GC; ++g) {
          const float alpha = st[g].rescale(s[g], fast_exp);  // 0 on the first key
          const float pr = fast_exp(s[g] - st[g].shift());
          st[g].add(alpha, pr);
#pragma unroll
          for (int i = 0; i < VPL; ++i)
            if (sub + i * TPK < Lay::NV)
#pragma unroll
              for (int e = 0; e < VEC; ++e)
                acc[g][i][e] = acc[g][i][e] * alpha + pr * simt::to_float(vr[u][i].v[e]);
        }
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

// Second pass of split-K: the partial states of the partitions that hold keys of sequence b (the
// others were skipped by the first pass and hold garbage), merged in partition order (deterministic):
// out[b, h] = Σ_z w_z · part_out[b, h, z] / Σ_z w_z, w_z = l_z · OnlineSoftmax::weight(m_z, max m) (part_out
// is normalised, so its accumulator is part_out · l_z). Grid (Hq, B chunk), threads over D.
template <typename T>
__global__ void __launch_bounds__(128) paged_decode_reduce_kernel(const DecodeParams<T> p, int D) {
  const auto fast_exp = [](float x) { return __expf(x); };
  const int h = blockIdx.x, b = p.b0 + static_cast<int>(blockIdx.y);
  const int64_t bh = static_cast<int64_t>(b) * p.Hq + h;
  const float* pm = p.part_m + bh * p.P;
  const float* pl = p.part_l + bh * p.P;
  const int len = p.seq_lens[b];
  const int64_t keys = len - first_visible_key(len - 1, p.window);  // ≤ 0 for an empty sequence
  const int used = keys <= 0 ? 1
                             : static_cast<int>(min(static_cast<int64_t>(p.P),
                                                    ceil_div(keys, decode_partition_size(p.part_size, keys, p.P))));
  float mx = -INFINITY;
  for (int z = 0; z < used; ++z) mx = fmaxf(mx, pm[z]);  // a partition that saw no key: -inf
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float o = 0.f, lsum = 0.f;
    for (int z = 0; z < used; ++z) {
      const float w = OnlineSoftmax::weight(pm[z], mx, fast_exp) * pl[z];
      lsum += w;
      o += w * p.part_out[(bh * p.P + z) * D + d];
    }
    p.out[bh * D + d] = simt::from_float<T>(o * OnlineSoftmax::normalizer(lsum));
  }
}

template <typename T, int D>
cudaError_t launch_paged_decode_d(const DecodeParams<T>& p0, cudaStream_t stream) {
  const int G = p0.Hq / p0.Hkv, GC = decode_group_chunk(G);
  const dim3 block(kDecodeWarps * 32);
  for (int b0 = 0; b0 < p0.B; b0 += static_cast<int>(kMaxGridYZ)) {  // grid.y ≤ 65535
    DecodeParams<T> p = p0;
    p.b0 = b0;
    const unsigned nb = static_cast<unsigned>(min(static_cast<int64_t>(p0.B - b0), kMaxGridYZ));
    const dim3 grid(static_cast<unsigned>(p.Hkv * ((G + GC - 1) / GC)), nb, static_cast<unsigned>(p.P));
    cudaError_t err;
    if (GC == 1)
      err = simt::launch(paged_decode_kernel<T, D, 1>, grid, block, 0, stream, p);
    else
      err = simt::launch(paged_decode_kernel<T, D, 4>, grid, block, 0, stream, p);
    if (err == cudaSuccess && p.P > 1)
      err = simt::launch(paged_decode_reduce_kernel<T>, dim3(static_cast<unsigned>(p.Hq), nb), dim3(128), 0, stream,
                         p, D);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

// p.P / p.part_size from decode_plan (attention_plan.h); workspace pointers valid when p.P > 1. The caches
// must be 16-byte aligned (else cudaErrorMisalignedAddress); q is read with scalar loads (any stride).
template <typename T>
cudaError_t launch_paged_decode(const DecodeParams<T>& p, int D, cudaStream_t stream) {
  if (p.B == 0 || p.Hq == 0) return cudaSuccess;
  if (!aligned16(p.k_cache) || !aligned16(p.v_cache)) return cudaErrorMisalignedAddress;
  return with_head_dim(D, cudaErrorInvalidValue,
                       [&](auto d) { return launch_paged_decode_d<T, decltype(d)::value>(p, stream); });
}

}  // namespace mk::inline MK_ABI
