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
// power of two; a lane group), each handling 16-byte vectors (VEC = 16/sizeof(T) elements) of K and V, so a
// warp step covers KPW = 32/TPK whole rows.
// Main loop: warp w walks chunks of CW = U·KPW consecutive keys (U ≤ 4 keys per lane group: a chunk is
// ≤ 4 KiB of K+V, 8 keys at D 128 in 16 bits), the 4 warps side by side (c0 = kbeg + w·CW, then + 4·CW).
// Staging: every lane copies its own 16-byte vectors of the chunk's K and V rows into its warp's shared
// stage with cp.async (zero-filled for an invalid key), two stages per warp: chunk i+1 is in flight while
// chunk i is computed; a lane reads back only what it copied, so no barrier is needed.
// Per chunk: the lane's partial q·k dot products of all NP = GC·U (head, key) pairs are reduce-scattered
// over the lane group (NP - 1 shuffles, ScatterLayout), so each lane ends with whole scores; the chunk's
// max per head over its valid keys and its NaN check (the sum of the valid scores is NaN iff one is, or
// +inf meets -inf) are taken once; every lane of the group then does one rescale per head
// (rescale_checked: branch-free) and computes the p of the pairs it holds, which are broadcast back over
// the group (shfl_group); the accumulator is rescaled once per chunk — skipped by a warp vote when no
// head's max moved (alpha = 1 exactly) — and P·V is a plain FMA per key and element.
// Block table: each lane holds one block id of a 32-block window of the sequence's table row (one
// coalesced warp read when a chunk leaves the window: once per block and warp, not per key); a key's
// block id comes by a shuffle, its block by FastDiv (fast_div.h: a multiply and a shift, no divide), its
// byte offset by one 32×32 → 64-bit multiply.
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
// Design estimate (made before the first GPU run, measured figures below; benchmarks/bench_attention.py --device cuda
// measures it). Mistral 7B (32 layers, Hkv = 8, D = 128, bf16: 4 KiB of K+V per token and layer):
//   B = 1, 4k context: K+V 16.8 MB per layer (537 MB per decode step, 32 layers) + split-K workspace
//     (43 partitions · 32 heads · 130 · 4 B, written and read) 1.4 MB (8 %) → ≈ 5.4 µs per layer at an
//     H100's ~3.35 TB/s;
//   B = 64, 4k context: 1.07 GB per layer → ≈ 320 µs at 3.35 TB/s; one partition per block (no workspace).
// In flight per SM (D = 128 bf16): 3 blocks (__launch_bounds__; ptxas sm_80 / sm_90: ≤ 168 registers for
// every instance, no spills; 32 KiB of shared stages per block) · 4 warps · one 4 KiB chunk in flight =
// 48 KiB, about 3× what Little's law asks at ~3.35 TB/s and ~0.6 µs latency over 132 SMs (≈ 15 KiB per SM).
// Issue (SASS, nvcc 13.0, sm_90, bf16, D 128, GC 4; counted with cuobjdump on the steady-state path of the
// main loop, an ESTIMATE until a GPU measures it): ≈ 643 warp-instructions per chunk of 4 KiB of K+V (675
// when a max moved), from ≈ 1,345 with the per-key rescale: 256 FFMA (q·k, p·v), 64 bf16 → f32 unpacks,
// 8 LDGSTS + 8 LDS.128, ≈ 60 reduce-scatter, ≈ 50 softmax (exp as one ex2.approx.ftz, fast_exp.cuh), ≈ 70
// addressing. That is ≈ 6.4 bytes per warp-instruction: an H100 issues ≈ 132 SMs · 4 · 1.75 GHz ≈ 0.92 T
// warp-instructions/s → ≈ 5.9 TB/s of K+V, ≈ 1.75× its HBM rate (H200, 4.8 TB/s: ≈ 1.2×). Expected: ≈ 70–80 % of HBM on an H100 for ≥ 2k-key
// contexts at B ≥ 16 (≥ 2 blocks per SM busy; attention_plan.h plans the partitions for that), less on an
// H200, where issue nearly binds (the ≥ 2× headroom target, ≈ 500 per 4 KiB, needs the q·k FMAs on tensor
// cores: a GQA-group mma decode, not built yet); the split-K workspace and the reduce launch cost the rest
// at batch 1. Below ~512 keys the step is launch- and latency-bound (a few µs whatever the kernel does):
// the CUDA graphs of mistral_kernels/decode_graphs.py remove the launch overhead there.
// Measured (NVIDIA H200, 2026-11-27, L2 flushed, % of the 4221 GB/s copy bandwidth measured in the same run;
// benchmarks/results/gpu_kernels.md), bf16, D 128, Hq 32 / Hkv 8: B = 32 × 4096 keys 182 µs = 70 %;
// B = 64 × 1024 57 %; B = 1 × 32768 56 %; B = 1 × 4096 24.2 µs = 16 % (the estimate above: ≈ 4 µs at the
// H200's rate — batch 1 at mid contexts is latency-bound on the split-K partitions and the reduce launch, the
// largest gap to the estimate); B = 1 × 512 14.9 µs (launch-bound). The ≥ 2k-key, B ≥ 16 figure (70 %) sits at
// the estimate's "less on an H200" end: issue nearly binds there, as counted above.
#pragma once

#include "../simt/fast_exp.cuh"
#include "../simt/portable.cuh"
#include "attention_plan.h"
#include "common.cuh"
#include "fast_div.h"

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
constexpr int log2_pow2(int n) { return n <= 1 ? 0 : 1 + log2_pow2(n / 2); }
constexpr int clamp_int(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

template <typename T, int D>
struct DecodeLayout {
  static constexpr int VEC = kVec16<T>;                          // elements per 16-byte vector
  static constexpr int NV = D / VEC;                             // vectors per K/V row
  static constexpr int TPK = NV >= 32 ? 32 : pow2_at_least(NV);  // lanes per key (a lane group)
  static constexpr int VPL = (NV + TPK - 1) / TPK;               // vectors per lane
  static constexpr int KPW = 32 / TPK;                           // keys per warp step (lane groups)
  // Keys per lane group and chunk: a warp's chunk is ≤ 4 KiB of K+V (8 keys at D 128, 16-bit), ≤ 4.
  static constexpr int U = clamp_int(4096 / (KPW * 2 * D * static_cast<int>(sizeof(T))), 1, 4);
  static constexpr int CW = U * KPW;               // keys per warp and chunk
  static constexpr int STAGE = 2 * U * VPL * 32;  // 16-byte vectors of one warp's stage: K, then V
  static_assert(D % VEC == 0, "head_dim must be a multiple of the 16-byte vector");
};

// Lane i gets v of lane (i & ~(WIDTH - 1)) + src: the src-th lane of its own aligned group of WIDTH lanes
// (a compile-time src then needs no lane arithmetic). Full warp, as simt::shfl.
template <int WIDTH, typename T>
__device__ __forceinline__ T shfl_group(T v, int src) {
  static_assert(WIDTH >= 1 && WIDTH <= 32 && (WIDTH & (WIDTH - 1)) == 0, "WIDTH: a power of two ≤ 32");
  return __shfl_sync(simt::kFullMask, v, src, WIDTH);
}

// OnlineSoftmax::rescale without a branch, for a chunk max that already carries the chunk's NaN check
// (the kernel tests once per chunk: the max is NaN when a score is). m + chunk_max is NaN iff one of them
// is NaN or they are +inf and -inf; a +inf max makes the row NaN anyway (its key's p = exp(inf - inf)),
// so the state is poisoned exactly where rescale() would poison it or where l becomes NaN regardless.
template <typename Exp>
__device__ __forceinline__ float rescale_checked(OnlineSoftmax& st, float chunk_max, Exp exp) {
  const float sum = st.m + chunk_max;
  const float m_new = sum != sum ? sum : fmaxf(st.m, chunk_max);
  const float alpha = exp(st.m - OnlineSoftmax::shift_of(m_new));
  st.m = m_new;
  return alpha;
}

// The VEC elements of a 16-byte vector as floats. bf16 → f32 is a 16-bit shift: one integer operation per
// element from the packed pairs (the generic conversion spends two on the upper half).
template <typename T, int VEC>
__device__ __forceinline__ void unpack(const Vec<T, VEC>& x, float (&f)[VEC]) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    static_assert(VEC % 2 == 0, "bf16 vectors hold pairs");
    const auto* w = reinterpret_cast<const uint32_t*>(x.v);
#pragma unroll
    for (int e = 0; e < VEC / 2; ++e) {
      f[2 * e] = __uint_as_float(w[e] << 16);
      f[2 * e + 1] = __uint_as_float(w[e] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int e = 0; e < VEC; ++e) f[e] = simt::to_float(x.v[e]);
  }
}

// The NP = GC·U scores of a chunk (pair index g·U + u: head g, the lane group's key u) after a
// reduce-scatter over the TPK lanes of a lane group: lane `sub` of the group holds R of them, value i being
// pair i + R·(sub >> SH); with fewer pairs than lanes (R = 1) each pair sits in 2^SH lanes.
template <int NP, int TPK>
struct ScatterLayout {
  static constexpr int LH = log2_pow2(NP < TPK ? NP : TPK);  // halving levels
  static constexpr int R = NP > TPK ? NP / TPK : 1;         // pairs per lane
  static constexpr int SH = log2_pow2(TPK) - LH;
  MK_HD static int pair(int sub, int i) { return i + R * (sub >> SH); }
  static constexpr int lane_of(int pair) { return (pair / R) << SH; }  // within the group
};

// Reduce-scatter of v[0..N) (N a power of two) over the lanes of a lane group (xor masks < TPK): at each
// level a lane keeps one half of its values, sends the other to its partner and adds what it receives,
// so N values cost N - 1 shuffles instead of N·log2(TPK); when one value is left the remaining levels are
// a plain butterfly. Afterwards v[0..R) hold the full sums of ScatterLayout<N, TPK>'s pairs.
template <int N, int MASK>
__device__ __forceinline__ void reduce_scatter(float* v, int sub) {
  if constexpr (MASK > 0) {
    if constexpr (N > 1) {
      const bool hi = (sub & MASK) != 0;
#pragma unroll
      for (int i = 0; i < N / 2; ++i) {
        const float send = hi ? v[i] : v[i + N / 2];
        const float keep = hi ? v[i + N / 2] : v[i];
        v[i] = keep + simt::shfl_xor(send, MASK);
      }
      reduce_scatter<N / 2, MASK / 2>(v, sub);
    } else {
      v[0] += simt::shfl_xor(v[0], MASK);
      reduce_scatter<1, MASK / 2>(v, sub);
    }
  }
}

template <typename T, int D, int GC>
__global__ void __launch_bounds__(kDecodeWarps * 32, 3)  // ≥ 3 blocks per SM (ptxas: ≤ 168 registers)
paged_decode_kernel(const DecodeParams<T> p) {
  using Lay = DecodeLayout<T, D>;
  using V = Vec<T, Lay::VEC>;
  constexpr int NW = kDecodeWarps, VEC = Lay::VEC, VPL = Lay::VPL, TPK = Lay::TPK, KPW = Lay::KPW;
  constexpr int U = Lay::U, CW = Lay::CW, STAGE = Lay::STAGE, NP = GC * U;
  using SL = ScatterLayout<NP, TPK>;
  constexpr int R = SL::R;
  constexpr float kNegInf = -INFINITY;
  const auto fast_exp = [](float x) { return simt::exp_ftz(x); };  // two instructions (fast_exp.cuh)
  // One buffer: the warps' cp.async stages in the main loop, then the cross-warp merge (after a barrier).
  constexpr int kStageVecs = NW * 2 * STAGE;
  constexpr int kMergeFloats = NW * GC * (D + 2);
  constexpr int kBufVecs = kStageVecs > kMergeFloats / 4 ? kStageVecs : (kMergeFloats + 3) / 4;
  __shared__ V s_buf[kBufVecs];

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
  // chunk, lane group kslot takes keys c0 + u·KPW + kslot (u < U). c0 is uniform across the warp: every
  // lane runs the same iterations (full-warp shuffles inside); a key past kend is invalid.
  // Staging: each lane copies its own 16-byte vectors of the chunk's K and V rows into its warp's stage
  // with cp.async (2 stages: the next chunk is in flight while this one is computed) and reads back only
  // what it copied itself, so the warps need no barrier; an invalid key is zero-filled.
  // Block table: lane l holds the id of logical block tb + l (a window of 32 blocks, int32, loaded with one
  // coalesced warp read when the chunk leaves it — once per block and warp, not per key), -1 past the
  // sequence's blocks or outside [0, N). A key j then needs only 32-bit math: lb = j / S (FastDiv: a
  // wide multiply and a shift), offset j - lb·S, its block id by a shuffle from lane lb - tb.
  static_assert(CW <= 32, "a chunk spans at most CW blocks: the 32-block window always holds them");
  const int S = kv.block_size;
  const FastDiv div_s(S);
  const auto block_of = [&](int j) { return div_s.div(j); };  // j ≥ 0
  const int nblk = kend > 0 ? block_of(kend - 1) + 1 : 0;  // logical blocks holding keys < kend
  int tb = -64, bid = -1;                   // window start (none yet: the first chunk loads it)
  V* const stages = s_buf + warp * 2 * STAGE;
  // This lane's vectors of slot 0's K and V rows; a slot's byte offset is slot · slot_stride · sizeof(T)
  // (32-bit operands: N·S slots and a slot's Hkv·D elements fit, one wide multiply).
  const auto* const k_lane = reinterpret_cast<const char*>(kv.k + sub * VEC);
  const auto* const v_lane = reinterpret_cast<const char*>(kv.v + sub * VEC);
  const auto stride_bytes = static_cast<uint32_t>(kv.slot_stride * sizeof(T));
  // Issues the copies of chunk c0 into `stage`; returns the valid keys' bit mask (bit u: key u).
  const auto issue = [&](int c0, V* stage) {
    if (block_of(min(c0 + CW, kend) - 1) >= tb + 32) {  // warp-uniform
      tb = block_of(c0);
      const int lb = tb + lane;
      bid = lb < nblk ? kv.block_table[lb] : -1;
      if (bid >= kv.num_blocks) bid = -1;
    }
    unsigned vm = 0;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = c0 + u * KPW + kslot;
      const int lb = block_of(j), off = j - lb * S;
      const int blk = simt::shfl(bid, (lb - tb) & 31);  // all lanes shuffle; used only for j < kend
      const bool ok = j < kend && blk >= 0;
      vm |= static_cast<unsigned>(ok) << u;
      const uint64_t row = static_cast<uint64_t>(static_cast<uint32_t>(ok ? blk * S + off : 0)) * stride_bytes;
      const unsigned bytes = ok ? 16u : 0u;
#pragma unroll
      for (int i = 0; i < VPL; ++i) {
        if (sub + i * TPK < Lay::NV) {
          V* dst = stage + (u * VPL + i) * 32 + lane;
          simt::cp_async_16_zfill(dst, k_lane + row + i * 16 * TPK, bytes);
          simt::cp_async_16_zfill(dst + STAGE / 2, v_lane + row + i * 16 * TPK, bytes);
        }
      }
    }
    return vm;
  };

  int c0 = kbeg + warp * CW;
  unsigned vm_next = c0 < kend ? issue(c0, stages) : 0u;
  simt::cp_async_commit();
  for (int stg = 0; c0 < kend; c0 += NW * CW, stg ^= 1) {
    const unsigned vm = vm_next;
    vm_next = c0 + NW * CW < kend ? issue(c0 + NW * CW, stages + (stg ^ 1) * STAGE) : 0u;
    simt::cp_async_commit();
    simt::cp_async_wait<1>();  // this chunk's copies (the next chunk's may still be in flight)
    const V* cur = stages + stg * STAGE;
    V kr[U][VPL], vr[U][VPL];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int i = 0; i < VPL; ++i) {
        if (sub + i * TPK < Lay::NV) {
          kr[u][i] = cur[(u * VPL + i) * 32 + lane];
          vr[u][i] = cur[STAGE / 2 + (u * VPL + i) * 32 + lane];
        } else {
#pragma unroll
          for (int e = 0; e < VEC; ++e) kr[u][i].v[e] = vr[u][i].v[e] = simt::from_float<T>(0.f);
        }
      }
    float kf[U][VPL][VEC];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int i = 0; i < VPL; ++i) unpack(kr[u][i], kf[u][i]);
    // Scores: this lane's partial dot products of all NP pairs, reduce-scattered over the lane group.
    float sc[NP];
#pragma unroll
    for (int g = 0; g < GC; ++g)
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float d = 0.f;
#pragma unroll
        for (int i = 0; i < VPL; ++i)
#pragma unroll
          for (int e = 0; e < VEC; ++e) d += q[g][i][e] * kf[u][i][e];
        sc[g * U + u] = d;
      }
    reduce_scatter<NP, TPK / 2>(sc, sub);
    // Chunk max per head over its valid keys (-inf: none), first over the pairs this lane holds, then
    // across the lanes that hold the head's other keys; NaN check once per chunk: the sum of the valid
    // scores is NaN iff one is NaN or +inf and -inf meet (a +inf score makes the row NaN anyway), and then
    // the chunk's max is NaN, which poisons the state.
    bool ok[R];
    float hm[R], hs[R];
#pragma unroll
    for (int i = 0; i < R; ++i) ok[i] = (vm >> (SL::pair(sub, i) % U)) & 1u;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      hm[i] = kNegInf;
      hs[i] = 0.f;
#pragma unroll
      for (int j = 0; j < R; ++j)
        if ((i ^ j) < U) {
          hm[i] = fmaxf(hm[i], ok[j] ? sc[j] : kNegInf);
          hs[i] += ok[j] ? sc[j] : 0.f;
        }
    }
#pragma unroll
    for (int t = 0; (R << t) < U; ++t)
#pragma unroll
      for (int i = 0; i < R; ++i) {
        hm[i] = fmaxf(hm[i], simt::shfl_xor(hm[i], TPK >> (SL::LH - t)));
        hs[i] += simt::shfl_xor(hs[i], TPK >> (SL::LH - t));
      }
#pragma unroll
    for (int i = 0; i < R; ++i) hm[i] = hs[i] != hs[i] ? hs[i] : hm[i];
    // One rescale per head and chunk (every lane of the group keeps the same state).
    float alpha[GC], shift[GC];
#pragma unroll
    for (int g = 0; g < GC; ++g) {
      const float mc = shfl_group<TPK>(hm[(g * U) % R], SL::lane_of(g * U));
      alpha[g] = rescale_checked(st[g], mc, fast_exp);  // 0 on the first visible key
      shift[g] = st[g].shift();
    }
    float ph[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int gi = SL::pair(sub, i) / U;
      float sh = shift[0];
#pragma unroll
      for (int g = 1; g < GC; ++g) sh = gi == g ? shift[g] : sh;
      ph[i] = ok[i] ? fast_exp(sc[i] - sh) : 0.f;
    }
    float pr[NP];
#pragma unroll
    for (int x = 0; x < NP; ++x) pr[x] = shfl_group<TPK>(ph[x % R], SL::lane_of(x));
    float vf[U][VPL][VEC];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int i = 0; i < VPL; ++i) unpack(vr[u][i], vf[u][i]);
    // PV: one rescale of the accumulator per chunk — skipped when no head's max moved (alpha = 1 exactly
    // in every lane: the identity; the common case once the maxima settle; a warp-uniform vote) — then a
    // plain FMA per key.
    bool moved = false;
#pragma unroll
    for (int g = 0; g < GC; ++g) {
      float psum = 0.f;
#pragma unroll
      for (int u = 0; u < U; ++u) psum += pr[g * U + u];
      st[g].add(alpha[g], psum);
      moved |= alpha[g] != 1.f;
    }
    if (simt::any(moved)) {
#pragma unroll
      for (int g = 0; g < GC; ++g)
#pragma unroll
        for (int i = 0; i < VPL; ++i)
#pragma unroll
          for (int e = 0; e < VEC; ++e) acc[g][i][e] *= alpha[g];
    }
#pragma unroll
    for (int g = 0; g < GC; ++g)
#pragma unroll
      for (int i = 0; i < VPL; ++i)
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          float a = acc[g][i][e];
#pragma unroll
          for (int u = 0; u < U; ++u) a += pr[g * U + u] * vf[u][i][e];
          acc[g][i][e] = a;
        }
  }
  simt::cp_async_wait<0>();  // the last (empty) group: nothing in flight past the loop

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
  // The stages are free once every warp has left its loop.
  __syncthreads();
  float* const s_acc = reinterpret_cast<float*>(s_buf);  // [NW][GC][D]
  float* const s_m = s_acc + NW * GC * D;                  // [NW][GC]
  float* const s_l = s_m + NW * GC;                        // [NW][GC]
  if (kslot == 0) {
#pragma unroll
    for (int g = 0; g < GC; ++g) {
#pragma unroll
      for (int i = 0; i < VPL; ++i) {
        const int v = sub + i * TPK;
        if (v < Lay::NV)
#pragma unroll
          for (int e = 0; e < VEC; ++e) s_acc[(warp * GC + g) * D + v * VEC + e] = acc[g][i][e];
      }
      if (lane == 0) {
        s_m[warp * GC + g] = st[g].m;
        s_l[warp * GC + g] = st[g].l;
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
    for (int w = 0; w < NW; ++w) mx = fmaxf(mx, s_m[w * GC + g]);
    float o = 0.f, lsum = 0.f;
#pragma unroll
    for (int w = 0; w < NW; ++w) {
      const float wt = OnlineSoftmax::weight(s_m[w * GC + g], mx, fast_exp);
      lsum += wt * s_l[w * GC + g];
      o += wt * s_acc[(w * GC + g) * D + d];
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
