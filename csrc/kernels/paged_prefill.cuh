// paged_prefill.cuh — paged prefill attention: packed variable-length query chunks over their paged K/V,
// causal + optional sliding window, native GQA (CUDA, framework-free; FlashAttention-2 style tiling).
//
// Shapes: Tq packed queries, B sequences, Hq / Hkv heads, G = Hq/Hkv, D head_dim, N num_blocks,
// S block_size, M max_blocks; BM = 64 query rows per tile, BN = 32 keys per K/V tile.
//   q [Tq, Hq, D] (token stride q_stride, 16-byte aligned rows), out [Tq, Hq, D] contiguous,
//   k_cache / v_cache [N, S, Hkv, D], block_tables int32 [B, M], cu_seqlens_q int32 [B+1], seq_lens int32 [B].
// Sequence b's q_b = cu[b+1]-cu[b] new tokens sit at positions seq_lens[b]-q_b … seq_lens[b]-1; the query
// at position p sees keys first_visible_key(p, W) ≤ j ≤ p (common.cuh).
// This SIMT kernel serves fp32 and every call the tensor-core kernel (paged_prefill_tc.cuh) does not take
// (its fallback rule: paged_prefill_tc_supported).
//
// Grid (ceil(Tq·G/BM), Hkv); 4 warps. The work list of attention_plan.h holds exactly the (sequence,
// tile) pairs that exist; block x runs items x, x + grid, ... (prefill_find_item: a warp scan of
// cu_seqlens_q, no planning pass, no sync); the grid never exceeds the items, so no block is empty.
// The rows of a tile are (token, q head)
// pairs of ONE kv head, token-major (row r → token r / G, head r % G): the G heads of a GQA group share
// every K/V tile, so K/V is read once per kv head and query tile.
// Per K/V tile: the block gathers BN keys' K and V rows through the block table into shared memory
// (16-byte vectors; keys outside the tile's visible range are zero-filled and never read from the
// cache), then each warp computes its 16×BN score tile, updates its rows' online softmax (OnlineSoftmax,
// fp32; fully masked rows keep m = -inf and contribute nothing) and accumulates P·V.
// Register layout = the mma.sync.m16n8k16 accumulator fragment, as in the tensor-core kernel: lane l holds
// rows l/4 and l/4+8 of its warp's 16 rows and columns 2·(l%4)+{0,1} of every 8-wide column tile (of S:
// BN/8 tiles, of O: D/8), so a row reduction is two xor-shuffles.
//
// Bound: compute (FLOPs = 4·Σ visible(q,k)·D per head) — this scalar kernel runs at the CUDA-core FP32
// rate (~19.5 TFLOP/s A100); shared memory traffic per tile is (BM + 2·BN)·D·sizeof(T).
// Shared memory: (BM + 2·BN)·D·sizeof(T) + 4·16·BN·4 bytes (fp32, D = 256: 136 KiB, sm_80 opt-in; the glue
// raises a clear error on GPUs that allow less, e.g. sm_86 / sm_89 with 99 KiB).
#pragma once

#include "../simt/portable.cuh"
#include "attention_plan.h"
#include "common.cuh"

namespace mk::inline MK_ABI {

inline constexpr int kPrefillBM = 64, kPrefillBN = 32, kPrefillWarps = 4;

// The cache fields (k_cache, v_cache, block_tables, Hkv, S, M, N) come from PagedCache; window is
// effective_window(W, M·S).
template <typename T>
struct PrefillParams : PagedCache<T> {
  T* out;
  const T* q;
  const int32_t* cu_seqlens_q;
  const int32_t* seq_lens;
  int64_t q_stride;
  int Hq, window;
  float scale;
};

template <typename T>
__host__ __device__ constexpr size_t prefill_smem_bytes(int D) {
  return static_cast<size_t>(kPrefillBM + 2 * kPrefillBN) * D * sizeof(T) +
         static_cast<size_t>(kPrefillWarps) * 16 * kPrefillBN * sizeof(float);
}

// Work item t → (sequence b, tile) of the work list (attention_plan.h; prefill_item is the host
// reference): each warp scans cu_seqlens_q 32 sequences at a time — lane l takes sequence c + l's tile
// count, an inclusive prefix sum by shuffles, a ballot finds the sequence holding t. False when t is past
// the last item. All 32 lanes of a warp call it (warps independently: no block barrier).
template <typename Index>
__device__ __forceinline__ bool prefill_find_item(const Index* cu, int B, int t, int G, int BM, int& b, int& tile) {
  const int lane = threadIdx.x & 31;
  int base = 0;  // items of the sequences before c
  for (int c = 0; c < B; c += 32) {  // warp-uniform
    const int s = c + lane;
    const int own = s < B ? static_cast<int>(prefill_tiles(cu[s + 1] - cu[s], G, BM)) : 0;
    int incl = own;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int up = simt::shfl_up(incl, d);
      if (lane >= d) incl += up;
    }
    const int chunk = simt::shfl(incl, 31);
    if (t < base + chunk) {  // warp-uniform
      const int hit = __popc(simt::ballot(base + incl <= t));  // the lanes before the one holding t
      b = c + hit;
      tile = t - base - simt::shfl(incl - own, hit);
      return true;
    }
    base += chunk;
  }
  return false;
}

// One work item: (sequence b, tile) of kv head blockIdx.y (see the header).
template <typename T, int D>
__device__ __forceinline__ void paged_prefill_tile(const PrefillParams<T>& p, int b, int tile, unsigned char* smem) {
  constexpr int BM = kPrefillBM, BN = kPrefillBN, VEC = kVec16<T>, NV = D / VEC, NT = BN / 8, OT = D / 8;
  constexpr float kNegInf = -INFINITY;
  static_assert(D % 8 == 0 && BM == kPrefillWarps * 16, "tile shape");
  using V = Vec<T, VEC>;
  T* Qs = reinterpret_cast<T*>(smem);                   // [BM][D]
  T* Ks = Qs + BM * D;                                  // [BN][D]
  T* Vs = Ks + BN * D;                                  // [BN][D]
  float* Ps = reinterpret_cast<float*>(Vs + BN * D);    // [warps][16][BN]

  const int kvh = blockIdx.y;
  const int G = p.Hq / p.Hkv;
  const int q0 = p.cu_seqlens_q[b], qlen = p.cu_seqlens_q[b + 1] - q0;
  const int64_t len = p.seq_lens[b];
  const int rows = qlen * G, r0 = tile * BM;
  const int64_t pos0 = len - qlen;  // position of the sequence's first new token

  for (int idx = threadIdx.x; idx < BM * NV; idx += blockDim.x) {
    const int r = idx / NV, v = idx % NV, R = r0 + r;
    V val;
    if (R < rows) {
      const int64_t tok = q0 + R / G, h = static_cast<int64_t>(kvh) * G + R % G;
      val = *reinterpret_cast<const V*>(p.q + tok * p.q_stride + h * D + v * VEC);
    } else {
#pragma unroll
      for (int e = 0; e < VEC; ++e) val.v[e] = simt::from_float<T>(0.f);
    }
    reinterpret_cast<V*>(Qs)[idx] = val;
  }

  const int last = min(r0 + BM, rows) - 1;
  const int64_t kstart = first_visible_key(pos0 + r0 / G, p.window), kend = pos0 + last / G + 1;

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int cb = 2 * (lane & 3);  // first of this lane's two columns in every 8-wide tile
  int rloc[2];                    // tile-local rows of this lane
  int64_t rpos[2], rlo[2];        // their positions (-1: padding row) and first visible keys
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    rloc[h] = warp * 16 + (lane >> 2) + 8 * h;
    const int R = r0 + rloc[h];
    rpos[h] = R < rows ? pos0 + R / G : -1;
    rlo[h] = first_visible_key(rpos[h], p.window);
  }
  float o[2][OT][2];
  OnlineSoftmax st[2];  // l: this lane's partial sum; the row's 4 lanes are summed at the end
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int t = 0; t < OT; ++t) o[h][t][0] = o[h][t][1] = 0.f;

  const PagedKV<const T> kv = p.sequence(b, kvh, D);
  const auto fast_exp = [](float x) { return __expf(x); };
  float* Pw = Ps + warp * 16 * BN;

  for (int64_t n0 = kstart; n0 < kend; n0 += BN) {
    __syncthreads();  // the previous tile's K/V (and P) are consumed
    for (int idx = threadIdx.x; idx < BN * NV; idx += blockDim.x) {
      const int c = idx / NV, v = idx % NV;
      const int64_t j = n0 + c;
      V kk, vv;
      const int64_t slot = j < kend ? kv.slot(j) : -1;  // -1 for block ids outside [0, N) too
      if (slot >= 0) {
        const int64_t off = kv.row(slot) + v * VEC;
        kk = *reinterpret_cast<const V*>(kv.k + off);
        vv = *reinterpret_cast<const V*>(kv.v + off);
      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) kk.v[e] = vv.v[e] = simt::from_float<T>(0.f);
      }
      reinterpret_cast<V*>(Ks)[idx] = kk;
      reinterpret_cast<V*>(Vs)[idx] = vv;
    }
    __syncthreads();

    // S = Q·Kᵀ for this lane's 2 rows × (NT tiles × 2 columns), masked, scaled.
    float s[2][NT][2];
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int t = 0; t < NT; ++t)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = t * 8 + cb + e;
          const int64_t j = n0 + col;
          const bool vis = rpos[h] >= 0 && j >= rlo[h] && j <= rpos[h];
          float acc = 0.f;
          if (vis) {
            const T* qr = Qs + rloc[h] * D;
            const T* kr = Ks + col * D;
            for (int d = 0; d < D; ++d) acc += simt::to_float(qr[d]) * simt::to_float(kr[d]);
          }
          s[h][t][e] = vis ? acc * p.scale : kNegInf;
        }
    // Online softmax per row (the 4 lanes of a row reduce with xor 1, 2).
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = kNegInf;
#pragma unroll
      for (int t = 0; t < NT; ++t) mx = fmaxf(mx, fmaxf(s[h][t][0], s[h][t][1]));
      mx = fmaxf(mx, simt::shfl_xor(mx, 1));
      mx = fmaxf(mx, simt::shfl_xor(mx, 2));
      const float alpha = st[h].rescale(mx, fast_exp);  // fully masked so far: everything stays 0
      const float shift = st[h].shift();
      float rs = 0.f;
#pragma unroll
      for (int t = 0; t < NT; ++t)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pr = fast_exp(s[h][t][e] - shift);  // masked: exp(-inf) = 0
          rs += pr;
          Pw[((lane >> 2) + 8 * h) * BN + t * 8 + cb + e] = pr;
        }
      st[h].add(alpha, rs);
#pragma unroll
      for (int t = 0; t < OT; ++t) {
        o[h][t][0] *= alpha;
        o[h][t][1] *= alpha;
      }
    }
    __syncwarp();  // P rows are written by the 4 lanes of each row, read by all of them
    // O += P·V for this lane's rows and columns, over the keys [c_lo, c_hi) of the tile the row sees only:
    // an invisible key's V row is never multiplied (p = 0 would not do: 0·NaN = NaN, common.cuh).
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float* pr = Pw + ((lane >> 2) + 8 * h) * BN;
      const int64_t lo = rlo[h] - n0, hi = rpos[h] - n0 + 1;  // padding rows (rpos -1): hi ≤ 0
      const int c_lo = lo < 0 ? 0 : (lo > BN ? BN : static_cast<int>(lo));
      const int c_hi = hi < 0 ? 0 : (hi > BN ? BN : static_cast<int>(hi));
#pragma unroll
      for (int t = 0; t < OT; ++t)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = t * 8 + cb + e;
          float acc = 0.f;
#pragma unroll 8
          for (int c = c_lo; c < c_hi; ++c) acc += pr[c] * simt::to_float(Vs[c * D + col]);
          o[h][t][e] += acc;
        }
    }
  }

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float lt = st[h].l;
    lt += simt::shfl_xor(lt, 1);
    lt += simt::shfl_xor(lt, 2);
    const int R = r0 + rloc[h];
    if (R >= rows) continue;
    const float inv = OnlineSoftmax::normalizer(lt);
    T* orow = p.out + ((static_cast<int64_t>(q0) + R / G) * p.Hq + static_cast<int64_t>(kvh) * G + R % G) * D;
#pragma unroll
    for (int t = 0; t < OT; ++t)
#pragma unroll
      for (int e = 0; e < 2; ++e) orow[t * 8 + cb + e] = simt::from_float<T>(o[h][t][e] * inv);
  }
}

// Grid (prefill_grid, Hkv): block x runs the work items x, x + gridDim.x, ... (never none, see the header).
// 2 resident blocks: up to 255 registers. Without the hint ptxas capped fp32 D 96 at 168 registers and
// spilled once the kernel looped over work items (ptxas sm_80 / sm_90: 120-237 registers, no spills).
template <typename T, int D>
__global__ void __launch_bounds__(kPrefillWarps * 32, 2)
paged_prefill_kernel(const PrefillParams<T> p, int B) {
  SIMT_DYN_SMEM(unsigned char, smem);
  const int G = p.Hq / p.Hkv;
  int b, tile;
#pragma unroll 1
  for (int t = blockIdx.x; prefill_find_item(p.cu_seqlens_q, B, t, G, kPrefillBM, b, tile); t += gridDim.x) {
    if (t != static_cast<int>(blockIdx.x)) __syncthreads();  // the previous item is done with shared memory
    paged_prefill_tile<T, D>(p, b, tile, smem);
  }
}

template <typename T, int D>
cudaError_t launch_paged_prefill_d(const PrefillParams<T>& p, int64_t Tq, int B, cudaStream_t stream) {
  const int G = p.Hq / p.Hkv;
  const dim3 grid(static_cast<unsigned>(prefill_grid(Tq, G, kPrefillBM)), static_cast<unsigned>(p.Hkv));
  return simt::launch(paged_prefill_kernel<T, D>, grid, dim3(kPrefillWarps * 32), prefill_smem_bytes<T>(D), stream,
                      p, B);
}

// Tq = q.shape[0] = cu_seqlens_q[B] (sizes the grid without reading cu_seqlens_q on the host). q rows,
// the caches and q_stride must allow 16-byte vectors (else cudaErrorMisalignedAddress).
template <typename T>
cudaError_t launch_paged_prefill(const PrefillParams<T>& p, int64_t Tq, int B, int D, cudaStream_t stream) {
  if (Tq == 0 || B == 0 || p.Hq == 0) return cudaSuccess;
  if (!aligned16(p.q) || p.q_stride % kVec16<T> != 0 || !aligned16(p.k_cache) || !aligned16(p.v_cache))
    return cudaErrorMisalignedAddress;
  return with_head_dim(D, cudaErrorInvalidValue,
                       [&](auto d) { return launch_paged_prefill_d<T, decltype(d)::value>(p, Tq, B, stream); });
}

}  // namespace mk::inline MK_ABI
