// paged_prefill_tc.cuh — tensor-core paged prefill attention for fp16 / bf16 (FlashAttention-2 style):
// mma.sync.m16n8k16 with fp32 accumulation, ldmatrix (.trans for V) into fragments, cp.async double
// buffering of the K/V tiles gathered through the block table. Same arguments and semantics as
// paged_prefill.cuh (which keeps fp32 and is the fallback); the glue picks this kernel when
// paged_prefill_tc_supported() holds.
//
// Shapes: Tq packed queries, B sequences, Hq / Hkv heads, G = Hq/Hkv, D head_dim, N num_blocks,
// S block_size, M max_blocks; BM = 64 query rows per block (16 per warp), BN keys per K/V tile
// (64 for D = 64 and 128, else 32), LD = D + 8 the padded shared-memory row (elements).
//   q [Tq, Hq, D] (token stride q_stride), out [Tq, Hq, D] contiguous, k_cache / v_cache [N, S, Hkv, D],
//   block_tables int32 [B, M], cu_seqlens_q int32 [B+1], seq_lens int32 [B].
// Sequence b's q_b new tokens sit at positions seq_lens[b]-q_b … seq_lens[b]-1; the query at position p
// sees keys first_visible_key(p, W) ≤ j ≤ p (common.cuh; W = window, 0 = none).
//
// Grid (ceil(Tq·G/BM), Hkv), 4 warps; block x runs the items x, x + grid, ... of the work list of
// attention_plan.h (exactly the (sequence, tile) pairs that exist; prefill_find_item, paged_prefill.cuh):
// no block is empty. GQA packing: the rows of a
// block are (token, q head) pairs of ONE kv head, token-major (row r → token r / G, head r % G), so the G
// q heads of a kv head share every K/V tile loaded into shared memory.
// Tile skipping: the keys any row of the block sees form one range [kstart, kend) (first row's window
// start … last row's position); the K/V tiles start at kstart and stop at kend, so a tile fully outside
// the causal / window mask is never loaded, and a warp whose 16 rows see no key of a loaded tile skips
// its mma work on it. Keys ≥ kend inside the last tile are zero-filled by cp.async (never read from the
// cache: NaN-poisoned or foreign blocks stay unread) and masked.
//
// Per tile, warp w (rows 16w … 16w+15):
//   S[16×BN] = Q·Kᵀ  : A = Q rows (ldmatrix.x4; held in registers for D ≤ 128, re-read from shared memory
//                       for D = 256 to stay within 255 registers), B = K rows via ldmatrix.x4 (non-trans: a
//                       K row is a column of Kᵀ, i.e. exactly mma's "col" B layout), D/16 k-steps.
//   online softmax (OnlineSoftmax) on the S accumulator fragments (lane holds rows g = lane/4 and g+8, columns
//   2·(lane%4)+{0,1} of every 8-wide tile; row max / sum over the row's 4 lanes = 2 xor-shuffles), in the
//   log2 domain (scale·log2 e folded into the scores, exp2).
//   O[16×D] += P·V   : the S accumulators of n-tiles 2k, 2k+1 ARE the A fragment of k-step k (re-packed to
//                       16 bit, no shared-memory round trip), B = V rows via ldmatrix.x4.trans.
// Epilogue: O / l is staged (as T) in the warp's own Q rows of shared memory, then written with 16-byte
// coalesced stores.
//
// Shared memory layout and bank conflicts: Q [BM][LD], then 2 stages × (K [BN][LD], V [BN][LD]), with
// LD = D + 8 (16 bytes of padding per row). A row is LD/2 = D/2 + 4 32-bit words; D is a multiple of 16,
// so D/2 ≡ 0 (mod 8) and the row stride ≡ 4, 12, 20 or 28 (mod 32) words — an odd multiple of 4. One
// 8×8 ldmatrix phase reads 16 bytes (4 banks) from 8 consecutive rows at the same column: the rows start
// at banks 4·(k·odd mod 8), k = 0…7, which are 8 distinct multiples of 4, so the 8 rows cover all 32 banks
// exactly once: conflict-free for Q, K and V (plain and .trans read the same bytes). The cp.async stores
// (8 consecutive threads → 8 consecutive 16-byte chunks of a row) are conflict-free when D/8 ≥ 8 chunks
// and the phase stays in one row (D = 64, 128, 256); for D = 80 / 96 a phase straddling two rows can hit
// a 2-way conflict on the (asynchronous) store side only. The epilogue's 4-byte fragment stores: rows g,
// words 4g'+t with g' = stride·g mod 8 distinct → conflict-free.
// Shared memory bytes = (BM + 4·BN)·LD·2: D 64: 45 KiB, 80: 33 KiB, 96: 39 KiB, 128: 85 KiB, 256: 99 KiB
// (D 128: 2 blocks per SM on an H100, 1 on an A100 or an sm_86 / sm_89 part).
//
// Roofline (per block and K/V tile): FLOPs = 4·BM·BN·D (Q·Kᵀ and P·V, 2 per MAC): D 128, BN 64 → 2.1 MFLOP.
// Shared-memory traffic: cp.async writes 2·BN·D·2 B (32 KiB at D 128) and every warp ldmatrix-reads the
// whole K and V tile, 4 warps × 2·BN·D·2 B (128 KiB at D 128) — 16 FLOP per byte read, independent of BN
// and D (each warp owns 16 rows: 4·16·BN·D FLOP / (4·BN·D) B). Global: K/V once per (kv head, block) =
// 2·BN·D·2 B per tile (64 FLOP/B; repeated reads by the other query blocks of the same kv head hit L2).
//   A100 (sm_80): 312 TFLOP/s dense fp16/bf16 mma vs ~19.5 TB/s shared memory (108 SMs × 128 B/clk ×
//     1.41 GHz) → ridge 16 FLOP/B: this tiling sits at the ridge; expect 50–65 % of peak for long
//     prefills (FA2 reports 50–73 % with 128-row blocks); at D 128 one block (4 warps) per SM fits A100's
//     164 KiB with BN 64 (two on an H100) — latency hiding rests on the cp.async prefetch and ILP there.
//   H100 (sm_90, mma.sync, no wgmma): ~660 TFLOP/s reachable with mma.sync vs ~31 TB/s shared memory
//     (132 SMs × 128 B/clk × 1.83 GHz) → ridge ~21 FLOP/B: shared-memory-bound at ≈ 16/21 of the mma.sync
//     rate (~500 TFLOP/s, ~50 % of the 990 TFLOP/s wgmma peak); wgmma/TMA are outside what the emulator verifies.
// Registers (per lane): O D/2 fp32, S BN/2 fp32, Q fragments D/4 (D ≤ 128). nvcc 13 / sm_80 (fp16): D 64 163,
// 80 154, 96 160, 128 230 (BN 64; 2 blocks/SM, see MIN_BLOCKS), 256 255 registers, 0 spills (sm_90: 164,
// 156, 158, 228, 249); checked by tests/test_nvcc_ptxas.py.
// Issue (SASS, nvcc 13.0, sm_90, bf16, D 128, counted with cuobjdump on the steady-state path of an interior
// tile: no mask, finite V, prefetch issued; an ESTIMATE until a GPU measures it): per warp and 64-key tile
// 739 warp-instructions, 128 of them HMMA (803 when a row's max moved and O is rescaled), i.e. 4.8 other
// instructions per HMMA; the BN 32 tile before it took 827 with 64 HMMA (11.9 per HMMA). An m16n8k16 HMMA
// holds a sub-core's tensor pipe ~8 issue cycles (A100: 256 FMA per cycle and sub-core), so the HMMA share
// of issue cycles is 8·128 / (8·128 + 611) ≈ 63 % (60 % with the rescale), from 40 %. What it took: the K/V
// gather with a FastDiv per key (no divide) and 32-bit slot math in a compile-time chunk loop; the mask only
// on tiles some row of the warp does not see in full; scores scaled inside the exp2 FMA; exp2 as one
// ex2.approx.ftz (fast_exp.cuh); the O rescale skipped by a warp vote when no row's max moved; BN 64.
// Measured (NVIDIA H200, 2026-11-27, benchmarks/results/gpu_kernels.md; bf16, D 128, Hq 32 / Hkv 8, causal):
// 4096 new tokens 687 µs = 200 TFLOP/s (20 % of the 989 TFLOP/s dense peak, ≈ 30 % of the ~660 mma.sync
// rate); 16 × 512 new 124 TFLOP/s; 128 new on 2048 cached 63 TFLOP/s. About 0.4× of the shared-memory-bound
// figure above: the 63 % HMMA issue share is not what limits it on the GPU (latency of the K/V gather and
// the two barriers per tile with 2 blocks per SM are the suspects; ncu was not run).
// NaN / Inf: masks are selects on S; P·V skips keys a row cannot see whenever a masked key of the tile
// holds a non-finite V (tc_masked_v_nonfinite), so nothing leaks through 0·NaN (common.cuh, NaN rule).
//
// Fallback rule (paged_prefill_tc_supported): fp16 / bf16, D in MK_HEAD_DIMS (common.cuh; any multiple of
// 16 ≤ 256 tiles, these are the instantiated ones), out 16-byte aligned. Everything else — fp32 above
// all — runs the SIMT kernel of paged_prefill.cuh.
#pragma once

#include <type_traits>

#include "../simt/fast_exp.cuh"
#include "../simt/portable.cuh"
#include "common.cuh"
#include "fast_div.h"
#include "paged_prefill.cuh"
#include "tc_fragments.cuh"

namespace mk::inline MK_ABI {

template <typename T>
inline constexpr bool kPrefillTcType = kTcType<T>;

template <int D>
struct PrefillTcTile {
  static_assert(D % 16 == 0 && D <= 256, "head_dim must be a multiple of 16, at most 256");
  static constexpr int BM = 64, WARPS = 4, THREADS = WARPS * 32;
  static constexpr int BN = D <= 64 || D == 128 ? 64 : 32;  // keys per K/V tile
  static constexpr int LD = D + 8;              // padded shared row (elements), see the header
  static constexpr int CH = D / 8;              // 16-byte chunks per row
  static constexpr int KSTEPS = D / 16;         // k-steps of Q·Kᵀ
  static constexpr int NT = BN / 8;             // 8-key column tiles of S
  static constexpr int OT = D / 8;              // 8-wide column tiles of O
  static constexpr bool Q_IN_REGS = D <= 128;   // D = 256: Q fragments re-read per tile (register budget)
  // Resident blocks per SM the register allocation is sized for: 3 (≤ 170 registers per thread) at
  // D ≤ 96, matching the 3 blocks A100's 164 KiB of shared memory holds; 2 (≤ 255, i.e. no cap) at D 128
  // and 256. D 128 fitted 168 registers until the exact P·V path (NaN rule) and the work-list grid met in
  // one kernel: at 3 blocks ptxas spilled 64 bytes, so D 128 trades 12 for 8 resident warps per SM (a
  // design estimate, unmeasured on a GPU). Without the hint ptxas picked 128 registers + spills for D 96.
  static constexpr int MIN_BLOCKS = D <= 96 ? 3 : 2;
  template <typename T>
  static constexpr size_t smem_bytes() {
    return static_cast<size_t>(BM + 4 * BN) * LD * sizeof(T);
  }
};

// True (warp-uniform) when a key of the V tile Vs [BN][LD] (keys n0 …) that some valid row of the warp cannot
// see — keys < lo_all (the window start of the warp's last row) or > hi_all (the position of its first
// row) — holds a NaN or Inf: only then may the mma's p = 0 products leak (0·NaN). A tile every row sees
// in full costs one comparison.
template <typename T, int BN, int LD, int CH>
__device__ __forceinline__ bool tc_masked_v_nonfinite(const T* Vs, int n0, int lane, int64_t lo_all, int64_t hi_all) {
  if (n0 >= lo_all && n0 + BN - 1 <= hi_all) return false;  // warp-uniform
  // exponent bits of a 16-bit float (all ones: Inf or NaN), in both halves of a 32-bit word
  constexpr uint32_t kExp = std::is_same_v<T, __half> ? 0x7C00u : 0x7F80u;
  bool bad = false;
  for (int idx = lane; idx < BN * CH; idx += 32) {
    const int c = idx / CH, key = n0 + c;
    if (key >= lo_all && key <= hi_all) continue;  // seen by every row: the mma is exact for it
    const uint32_t* w = reinterpret_cast<const uint32_t*>(Vs + c * LD + (idx % CH) * 8);
#pragma unroll
    for (int i = 0; i < 4; ++i)
      bad |= (w[i] & kExp) == kExp || ((w[i] >> 16) & kExp) == kExp;
  }
  return simt::any(bad);
}

// One work item: (sequence b, tile) of kv head blockIdx.y (see the header).
template <typename T, int D>
__device__ __forceinline__ void paged_prefill_tc_tile(const PrefillParams<T>& p, int b, int tile, T* smem) {
  using C = PrefillTcTile<D>;
  constexpr int BM = C::BM, BN = C::BN, LD = C::LD, CH = C::CH, NT = C::NT, OT = C::OT;
  constexpr float kNegInf = -INFINITY, kLog2e = 1.4426950408889634f;
  using V16 = Vec<T, 8>;
  T* Qs = smem;             // [BM][LD]
  T* KVs = Qs + BM * LD;    // [2 stages][K, V][BN][LD]

  const int kvh = blockIdx.y;
  const int G = p.Hq / p.Hkv;
  const int q0 = p.cu_seqlens_q[b], qlen = p.cu_seqlens_q[b + 1] - q0;
  const int rows = qlen * G, r0 = tile * BM;
  const int pos0 = p.seq_lens[b] - qlen;  // position of the sequence's first new token
  const int last = min(r0 + BM, rows) - 1;
  const int kstart = static_cast<int>(first_visible_key(pos0 + r0 / G, p.window)), kend = pos0 + last / G + 1;
  const int ntiles = static_cast<int>(ceil_div(kend - kstart, BN));
  const int tid = threadIdx.x;
  const PagedKV<const T> kv = p.sequence(b, kvh, D);

  // Q tile (rows past the sequence zero-filled) and K/V tile 0 form the first cp.async group.
  for (int idx = tid; idx < BM * CH; idx += C::THREADS) {
    const int r = idx / CH, c = idx % CH, R = r0 + r;
    const T* src = p.q;
    unsigned bytes = 0;
    if (R < rows) {
      src = p.q + static_cast<int64_t>(q0 + R / G) * p.q_stride + static_cast<int64_t>(kvh * G + R % G) * D + c * 8;
      bytes = 16;
    }
    simt::cp_async_16_zfill(Qs + r * LD + c * 8, src, bytes);
  }
  // K/V tile `t` (keys kstart + t·BN …) gathered through the block table into stage `stage`. Per item: the
  // block size as a FastDiv (a key's block by a multiply and a shift instead of a divide) and the byte
  // stride of a slot; per chunk only 32-bit key math, one block-table load and one wide multiply.
  const FastDiv div_s(kv.block_size);
  const auto stride_bytes = static_cast<uint32_t>(kv.slot_stride * sizeof(T));
  const auto* const k_bytes = reinterpret_cast<const char*>(kv.k);
  const auto* const v_bytes = reinterpret_cast<const char*>(kv.v);
  auto load_kv = [&](int t, int stage) {
    T* Ks = KVs + stage * 2 * BN * LD;
    T* Vs = Ks + BN * LD;
    const int n0 = kstart + t * BN;
    constexpr int CHUNKS = BN * CH, PER_THREAD = (CHUNKS + C::THREADS - 1) / C::THREADS;
#pragma unroll
    for (int i = 0; i < PER_THREAD; ++i) {  // a compile-time trip count: c, v below are per-item constants
      const int idx = tid + i * C::THREADS;
      if (CHUNKS % C::THREADS != 0 && idx >= CHUNKS) break;
      const int c = idx / CH, v = idx % CH, j = n0 + c;
      // Past kend and for block ids outside [0, N) (validated by the host; never read regardless):
      // zero-filled, the source address unused.
      const int lb = div_s.div(j);
      const int blk = j < kend ? kv.block_table[lb] : -1;
      const bool ok = blk >= 0 && blk < kv.num_blocks;
      const uint64_t off =
          static_cast<uint64_t>(static_cast<uint32_t>(ok ? blk * kv.block_size + (j - lb * kv.block_size) : 0)) *
              stride_bytes +
          v * 16u;
      const unsigned bytes = ok ? 16 : 0;
      simt::cp_async_16_zfill(Ks + c * LD + v * 8, k_bytes + off, bytes);
      simt::cp_async_16_zfill(Vs + c * LD + v * 8, v_bytes + off, bytes);
    }
  };
  load_kv(0, 0);
  simt::cp_async_commit();

  const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;
  const int wr0 = r0 + warp * 16;  // this warp's first row
  const bool warp_rows = wr0 < rows;
  // keys any row of this warp sees: [wlo, whi]
  const int wlo = static_cast<int>(first_visible_key(pos0 + wr0 / G, p.window));
  const int whi = pos0 + (min(wr0 + 15, rows - 1)) / G;
  int rpos[2], rlo[2];  // this lane's two rows: position (-1: padding row) and first visible key
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int R = wr0 + g + 8 * h;
    rpos[h] = R < rows ? pos0 + R / G : -1;
    rlo[h] = static_cast<int>(first_visible_key(rpos[h], p.window));
  }
  const float sl = p.scale * kLog2e;
  const auto ex2 = [](float x) { return simt::ex2_ftz(x); };  // one MUFU (fast_exp.cuh)

  float o[OT][4];
  OnlineSoftmax st[2];  // log2 domain; l: this lane's partial sum, the row's 4 lanes summed in the epilogue
#pragma unroll
  for (int t = 0; t < OT; ++t) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.f;
  uint32_t qf[C::Q_IN_REGS ? C::KSTEPS : 1][4];
  bool q_loaded = false;
  const T* Qw = Qs + warp * 16 * LD;

  for (int it = 0; it < ntiles; ++it) {
    // Prefetch tile it+1 into the other stage (freed by the trailing barrier of iteration it-1), then
    // wait for tile it's group: at most the just-committed one stays in flight.
    if (it + 1 < ntiles) load_kv(it + 1, (it + 1) & 1);
    simt::cp_async_commit();
    simt::cp_async_wait<1>();
    __syncthreads();

    const int n0 = kstart + it * BN;
    if (warp_rows && n0 <= whi && n0 + BN - 1 >= wlo) {  // warp-uniform
      const T* Ks = KVs + (it & 1) * 2 * BN * LD;
      const T* Vs = Ks + BN * LD;
      if constexpr (C::Q_IN_REGS) {
        if (!q_loaded) {  // first tile this warp computes on: fetch its Q fragments once
#pragma unroll
          for (int kk = 0; kk < C::KSTEPS; ++kk) simt::ldmatrix_x4(qf[kk], tc_a_row(Qw + kk * 16, LD, lane));
          q_loaded = true;
        }
      }
      // S = Q·Kᵀ
      float s[NT][4];
#pragma unroll
      for (int j = 0; j < NT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < C::KSTEPS; ++kk) {
        uint32_t a[4];
        if constexpr (C::Q_IN_REGS) {
#pragma unroll
          for (int e = 0; e < 4; ++e) a[e] = qf[kk][e];
        } else {
          simt::ldmatrix_x4(a, tc_a_row(Qw + kk * 16, LD, lane));
        }
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
          uint32_t bk[4];
          simt::ldmatrix_x4(bk, tc_b_nk_row(Ks + np * 16 * LD + kk * 16, LD, lane));
          const uint32_t b0[2] = {bk[0], bk[1]}, b1[2] = {bk[2], bk[3]};
          tc_mma<T>(s[2 * np], a, b0);
          tc_mma<T>(s[2 * np + 1], a, b1);
        }
      }
      // Mask (causal + window; keys ≥ kend lie past every row's position): only on a tile that some row of
      // the warp does not see in full (the diagonal and window-edge tiles; warp-uniform test), a select per
      // score. Padding rows (zero Q) see the interior tiles unmasked: their results are never stored.
      const int lo_all = static_cast<int>(first_visible_key(whi, p.window)), hi_all = pos0 + wr0 / G;
      if (n0 < lo_all || n0 + BN - 1 > hi_all) {
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int h = e >> 1, key = n0 + j * 8 + 2 * t4 + (e & 1);
            s[j][e] = key >= rlo[h] && key <= rpos[h] ? s[j][e] : kNegInf;
          }
      }
      // Online softmax per row in the log2 domain (scores · sl; the max of the raw scores, scaled once —
      // sl > 0 and rounding is monotonic, so it is the max of the scaled ones); the row's 4 lanes reduce
      // with xor 1, 2.
      float alpha[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = kNegInf;
#pragma unroll
        for (int j = 0; j < NT; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * h], s[j][2 * h + 1]));
        mx = fmaxf(mx, simt::shfl_xor(mx, 1));
        mx = fmaxf(mx, simt::shfl_xor(mx, 2));
        alpha[h] = st[h].rescale(mx * sl, ex2);  // nothing visible yet: everything stays 0
        const float shift = st[h].shift();
        float rs = 0.f;
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int e = 2 * h; e < 2 * h + 2; ++e) {
            s[j][e] = ex2(fmaf(s[j][e], sl, -shift));  // masked: exp2(-inf) = 0
            rs += s[j][e];
          }
        st[h].add(alpha[h], rs);
      }
      // O ·= alpha, skipped when no row's max moved (alpha = 1 exactly for every row of the warp: the
      // multiplication would be the identity; the common case once the maxima settle). Warp-uniform vote.
      if (!simt::all(alpha[0] == 1.f && alpha[1] == 1.f)) {
#pragma unroll
        for (int t = 0; t < OT; ++t) {
          o[t][0] *= alpha[0];
          o[t][1] *= alpha[0];
          o[t][2] *= alpha[1];
          o[t][3] *= alpha[1];
        }
      }
      // O += P·V. The mma multiplies every key of the tile into every row, p = 0 included, and 0·NaN = NaN:
      // a NaN / Inf in the V row of a key that some of this warp's rows cannot see (diagonal and window-edge
      // tiles) would leak into them. Such tiles (rare: non-finite V) take the exact path, which skips
      // invisible keys per row (common.cuh, NaN rule); every other tile runs the mma.
      if (tc_masked_v_nonfinite<T, BN, LD, CH>(Vs, n0, lane, lo_all, hi_all)) {
        // One key per iteration; the key loop inside an 8-key column tile is not unrolled, so this path does
        // not raise the register budget of the mma path.
#pragma unroll
        for (int j = 0; j < NT; ++j) {
#pragma unroll 1
          for (int cc = 0; cc < 8; ++cc) {
            const int c = j * 8 + cc, key = n0 + c;
            const T* vrow = Vs + c * LD + 2 * t4;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              // P[row g + 8h][c] is s[j][2h + c%2] of lane 4g + cc/2
              const float pv = simt::shfl((cc & 1) ? s[j][2 * h + 1] : s[j][2 * h], (lane & ~3) | (cc >> 1));
              if (key < rlo[h] || key > rpos[h]) continue;  // invisible to this row: never multiplied
#pragma unroll
              for (int t = 0; t < OT; ++t) {
                o[t][2 * h] += pv * simt::to_float(vrow[t * 8]);
                o[t][2 * h + 1] += pv * simt::to_float(vrow[t * 8 + 1]);
              }
            }
          }
        }
      } else {
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
          uint32_t a[4];
          tc_acc_to_a<T>(a, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
          for (int dp = 0; dp < OT / 2; ++dp) {
            uint32_t bv[4];
            simt::ldmatrix_x4_trans(bv, tc_b_kn_row(Vs + kk * 16 * LD + dp * 16, LD, lane));
            const uint32_t b0[2] = {bv[0], bv[1]}, b1[2] = {bv[2], bv[3]};
            tc_mma<T>(o[2 * dp], a, b0);
            tc_mma<T>(o[2 * dp + 1], a, b1);
          }
        }
      }
    }
    __syncthreads();  // every warp is done with this stage before iteration it+1 refills it
  }

  // Every cp.async group must have landed before the epilogue overwrites Qs: with an empty key range
  // (ntiles = 0, e.g. seq_lens < q_b from unchecked inputs) the loop never waited for the Q group.
  simt::cp_async_wait<0>();
  __syncthreads();
  if (!warp_rows) return;  // warp-uniform; no block barrier follows
  // Epilogue: O / l as T into this warp's own Q rows, then 16-byte stores of whole rows.
  T* Ow = Qs + warp * 16 * LD;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float lt = st[h].l;
    lt += simt::shfl_xor(lt, 1);
    lt += simt::shfl_xor(lt, 2);
    const float inv = OnlineSoftmax::normalizer(lt);
#pragma unroll
    for (int t = 0; t < OT; ++t)
      *reinterpret_cast<uint32_t*>(Ow + (g + 8 * h) * LD + t * 8 + 2 * t4) =
          tc_pack<T>(o[t][2 * h] * inv, o[t][2 * h + 1] * inv);
  }
  __syncwarp();
  for (int idx = lane; idx < 16 * CH; idx += 32) {
    const int r = idx / CH, c = idx % CH, R = wr0 + r;
    if (R >= rows) break;  // idx grows with r
    T* dst = p.out + (static_cast<int64_t>(q0 + R / G) * p.Hq + static_cast<int64_t>(kvh) * G + R % G) * D + c * 8;
    *reinterpret_cast<V16*>(dst) = *reinterpret_cast<const V16*>(Ow + r * LD + c * 8);
  }
}

// True when launch_paged_prefill_tc handles this call (see the fallback rule in the header).
template <typename T>
inline bool paged_prefill_tc_supported(const PrefillParams<T>& p, int D) {
  return kPrefillTcType<T> && head_dim_supported(D) && aligned16(p.out);
}

// Grid (prefill_grid, Hkv): block x runs the work items x, x + gridDim.x, ... (never none, see the header).
template <typename T, int D>
__global__ void __launch_bounds__(PrefillTcTile<D>::THREADS, PrefillTcTile<D>::MIN_BLOCKS)
paged_prefill_tc_kernel(const PrefillParams<T> p, int B) {
  SIMT_DYN_SMEM(T, smem);
  const int G = p.Hq / p.Hkv;
  int b, tile;
#pragma unroll 1
  for (int t = blockIdx.x; prefill_find_item(p.cu_seqlens_q, B, t, G, PrefillTcTile<D>::BM, b, tile);
       t += gridDim.x) {
    if (t != static_cast<int>(blockIdx.x)) __syncthreads();  // the previous item's epilogue is done with shared memory
    paged_prefill_tc_tile<T, D>(p, b, tile, smem);
  }
}

template <typename T, int D>
cudaError_t launch_paged_prefill_tc_d(const PrefillParams<T>& p, int64_t Tq, int B, cudaStream_t stream) {
  using C = PrefillTcTile<D>;
  const int G = p.Hq / p.Hkv;
  const dim3 grid(static_cast<unsigned>(prefill_grid(Tq, G, C::BM)), static_cast<unsigned>(p.Hkv));
  return simt::launch(paged_prefill_tc_kernel<T, D>, grid, dim3(C::THREADS), C::template smem_bytes<T>(), stream, p,
                      B);
}

// Same arguments as launch_paged_prefill (Tq = q.shape[0]); cudaErrorInvalidValue when
// paged_prefill_tc_supported(p, D) is false, cudaErrorMisalignedAddress for rows unfit for 16-byte copies.
template <typename T>
cudaError_t launch_paged_prefill_tc(const PrefillParams<T>& p, int64_t Tq, int B, int D, cudaStream_t stream) {
  if constexpr (!kPrefillTcType<T>) {
    return cudaErrorInvalidValue;
  } else {
    if (!paged_prefill_tc_supported(p, D)) return cudaErrorInvalidValue;
    if (Tq == 0 || B == 0 || p.Hq == 0) return cudaSuccess;
    if (!aligned16(p.q) || p.q_stride % 8 != 0 || !aligned16(p.k_cache) || !aligned16(p.v_cache))
      return cudaErrorMisalignedAddress;
    return with_head_dim(D, cudaErrorInvalidValue,
                         [&](auto d) { return launch_paged_prefill_tc_d<T, decltype(d)::value>(p, Tq, B, stream); });
  }
}

}  // namespace mk::inline MK_ABI
