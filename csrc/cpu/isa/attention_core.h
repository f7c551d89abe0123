// cpu/isa/attention_core.h — the inner loop of the native CPU paged attention (decode and prefill).
//
// Shapes: R query rows handled together (the q heads of one GQA group × a few query tokens), D head_dim,
// S block_size, Hkv kv heads, C keys per chunk (kChunk).
//
// One call streams the keys [kbeg, kend) of one sequence and one kv head (a PagedKV view, csrc/kernels/
// common.cuh) through the flash (online softmax) state of R rows: for each chunk of ≤ C keys inside one
// physical block it
//   1. converts the chunk's K rows to fp32 once and computes all R×C scores (dot products vectorised
//      over D; the K row is read once for the whole GQA group),
//   2. updates each row's OnlineSoftmax state (running max m and sum l, fp32), rescaling its accumulator
//      when m grows,
//   3. converts the chunk's V rows once and accumulates p·v into every row with p ≠ 0.
// Row r only sees keys lo[r] ≤ j < hi[r] (causal / sliding window); masked keys get p = 0 and are never
// multiplied, so NaN/garbage in cache slots outside the visible ranges cannot reach the output. A NaN
// score of a visible key poisons the row's state (OnlineSoftmax, csrc/kernels/common.cuh: NaN rule), so
// the row's output is NaN, as on the GPU; the caller's store (OnlineSoftmax::normalizer) gives 0 only to rows
// that saw no key.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "../../kernels/common.cuh"
#include "attention_avx512.h"
#include "attention_tiled.h"
#include "target.h"
#include "vec_math.h"

MK_ISA_BEGIN
namespace attn {

inline constexpr int64_t kChunk = 32;
inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The exponential of the softmax rescale factors and of merges (the probabilities use exp_f / exp16).
inline float std_exp(float x) { return std::exp(x); }

// Dot product with 16 independent fp32 lanes (vectorises to two AVX2 / one AVX-512 register);
// the lanes are summed in a fixed order, so the result is deterministic.
inline float dot(const float* __restrict a, const float* __restrict b, int64_t n) {
  float lane[16] = {0.f};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int u = 0; u < 16; ++u) lane[u] += a[i + u] * b[i + u];
  float s = 0.f;
  for (; i < n; ++i) s += a[i] * b[i];
  for (int u = 0; u < 8; ++u) lane[u] += lane[u + 8];
  for (int u = 0; u < 4; ++u) lane[u] += lane[u + 4];
  return s + ((lane[0] + lane[2]) + (lane[1] + lane[3]));
}

// Four dot products of q with k[0..3] in one pass: q is loaded once and the four independent 16-lane
// accumulators hide the FMA latency (a single dot is one dependent chain). Lane sums in fixed order.
inline void dot4(const float* __restrict q, const float* __restrict k0, const float* __restrict k1,
                 const float* __restrict k2, const float* __restrict k3, int64_t n, float* out) {
  float a0[16] = {0.f}, a1[16] = {0.f}, a2[16] = {0.f}, a3[16] = {0.f};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int u = 0; u < 16; ++u) {
      const float x = q[i + u];
      a0[u] += x * k0[i + u];
      a1[u] += x * k1[i + u];
      a2[u] += x * k2[i + u];
      a3[u] += x * k3[i + u];
    }
  float t[4] = {0.f, 0.f, 0.f, 0.f};
  for (; i < n; ++i) {
    t[0] += q[i] * k0[i];
    t[1] += q[i] * k1[i];
    t[2] += q[i] * k2[i];
    t[3] += q[i] * k3[i];
  }
  float* acc[4] = {a0, a1, a2, a3};
  for (int c = 0; c < 4; ++c) {
    float* a = acc[c];
    for (int u = 0; u < 8; ++u) a[u] += a[u + 8];
    for (int u = 0; u < 4; ++u) a[u] += a[u + 4];
    out[c] = t[c] + ((a[0] + a[2]) + (a[1] + a[3]));
  }
}

// acc[0:D] += Σ_c p[c] · v[c][0:D] over the n keys of a chunk (p[c] = 0 skipped: masked keys are never
// multiplied). 64-float slices of acc stay in registers across the keys.
inline void accumulate_pv(float* __restrict acc, const float* p, const float* const* v, int64_t n, int64_t D) {
  int64_t d0 = 0;
  for (; d0 + 64 <= D; d0 += 64) {
    float t[64];
    for (int u = 0; u < 64; ++u) t[u] = acc[d0 + u];
    for (int64_t c = 0; c < n; ++c) {
      if (p[c] == 0.f) continue;
      const float pc = p[c];
      const float* __restrict vc = v[c] + d0;
      for (int u = 0; u < 64; ++u) t[u] += pc * vc[u];
    }
    for (int u = 0; u < 64; ++u) acc[d0 + u] = t[u];
  }
  for (int64_t c = 0; c < n; ++c) {
    if (p[c] == 0.f) continue;
    for (int64_t d = d0; d < D; ++d) acc[d] += p[c] * v[c][d];
  }
}

// Per-thread buffers for one scan (the caller's): scores [R][kChunk], converted K/V rows [kChunk][D]
// (16-bit caches only).
struct Scratch {
  float* scores;
  float* kbuf;
  float* vbuf;
};

// State of R rows: q [R][D] (pre-multiplied by the softmax scale), acc [R][D], softmax states st [R],
// visible key ranges [lo[r], hi[r]).
struct Rows {
  int64_t R, D;
  const float* q;
  float* acc;
  OnlineSoftmax* st;
  const int64_t* lo;
  const int64_t* hi;
  // Optional (bf16 caches): the same q rows unscaled in bf16 [R][D], q = qb · qscale. The AVX-512 BF16
  // scan uses them (exact bf16 products); the portable scan uses q.
  const bf16* qb = nullptr;
  float qscale = 1.f;
};

// Rows of `n` keys starting at `base` (stride `stride` elements) as fp32 pointers; bf16 / f16 are converted
// into buf.
template <typename T>
inline void rows_as_float(const T* base, int64_t stride, int64_t n, int64_t D, float* buf, const float** ptrs) {
  if constexpr (std::is_same_v<T, float>) {
    (void)buf;
    for (int64_t c = 0; c < n; ++c) ptrs[c] = base + c * stride;
  } else {
    for (int64_t c = 0; c < n; ++c) {
      const T* src = base + c * stride;
      float* dst = buf + c * D;
      for (int64_t d = 0; d < D; ++d) dst[d] = to_f(src[d]);
      ptrs[c] = dst;
    }
  }
}

// Software prefetch of n cache rows (the next chunk lives in another physical block: the hardware
// prefetcher cannot guess it).
template <typename T>
inline void prefetch_rows(const T* base, int64_t stride, int64_t n, int64_t D) {
  const int64_t bytes = D * static_cast<int64_t>(sizeof(T));
  for (int64_t c = 0; c < n; ++c) {
    const char* p = reinterpret_cast<const char*>(base + c * stride);
    for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off, 0, 0);
  }
}

// Stream keys [kbeg, kend) of one sequence and one kv head (kv) through `rows`. The block ids of the
// keys read were validated by check::paged_indices_cpu (kv.slot never returns -1 here). fp32 caches with
// 8 … 32 rows (prefill tiles) at AVX-512 take attention_tiled.h; at AVX-512 the others take scan_keys_vec (bf16
// with AVX512_BF16, fp32 with D = 64 or 128); the rest this portable loop.
#if MK_CPU_ATTN_AVX512
// scan_keys with AVX-512 (attention_avx512.h): bf16 caches QV = D/32 (D % 64 == 0, AVX-512 BF16), fp32 caches
// QV = D/16 (D = 64, 128). Chunks of ≤ 16 keys inside one physical block: scores of every row, one softmax
// update per row and chunk, then P·V in tiles of ≤ 4 rows.
template <typename T, int QV>
void scan_keys_vec(const Rows& rows, const PagedKV<const T>& kv, int64_t kbeg, int64_t kend, Scratch& sc) {
  namespace v = avx512;
  constexpr int64_t C = v::kVecChunk;
  const int64_t R = rows.R, D = rows.D, S = kv.block_size, key_stride = kv.slot_stride;
  float* P = sc.scores;  // [R][kChunk], kChunk ≥ C
  uint32_t row_live[4];
  int64_t j = kbeg;
  while (j < kend) {
    const int64_t n = std::min({C, S - j % S, kend - j});  // keys of this chunk, inside one block
    const int64_t slot0 = kv.slot(j);
    if (j + n < kend) {
      const int64_t jn = j + n, nn = std::min({C, S - jn % S, kend - jn}), slotn = kv.slot(jn);
      prefetch_rows(kv.k + kv.row(slotn), key_stride, nn, D);
      prefetch_rows(kv.v + kv.row(slotn), key_stride, nn, D);
    }
    const T* k0 = kv.k + kv.row(slot0);
    const T* v0 = kv.v + kv.row(slot0);
    for (int64_t r0 = 0; r0 < R; r0 += 4) {
      const int nr = static_cast<int>(std::min<int64_t>(4, R - r0));
      uint32_t live = 0;
      for (int t = 0; t < nr; ++t) {
        const int64_t r = r0 + t;
        float* p = P + r * kChunk;
        const int64_t c0 = std::clamp<int64_t>(rows.lo[r] - j, 0, n), c1 = std::clamp<int64_t>(rows.hi[r] - j, 0, n);
        row_live[t] = 0;
        if (c0 >= c1) {
          _mm512_storeu_ps(p, _mm512_setzero_ps());
          continue;
        }
        __m512 s;
        if constexpr (std::is_same_v<T, float>) {
          __m512 q[QV];
          for (int i = 0; i < QV; ++i) q[i] = _mm512_loadu_ps(rows.q + r * D + 16 * i);
          s = v::row_scores<QV>(q, k0, key_stride, c0, c1);
        } else {
#if MK_CPU_ATTN_AVX512BF16
          __m512bh q[QV];
          for (int i = 0; i < QV; ++i) q[i] = (__m512bh)_mm512_loadu_si512(rows.qb + r * D + 32 * i);
          s = v::row_scores<QV>(q, k0, key_stride, c0, c1, rows.qscale);
#else
          static_assert(std::is_same_v<T, float>, "scan_keys_vec: 16-bit caches need AVX512_BF16");
#endif
        }
        // reduce_max's NaN handling is order-dependent: a NaN score poisons the row explicitly
        const float cmax = _mm512_cmp_ps_mask(s, s, _CMP_UNORD_Q) ? std::numeric_limits<float>::quiet_NaN()
                                                                  : _mm512_reduce_max_ps(s);
        OnlineSoftmax& st = rows.st[r];
        const float alpha = st.rescale(cmax, std_exp);  // 0 when nothing was seen before
        const __m512 e = v::exp16(_mm512_sub_ps(s, _mm512_set1_ps(st.shift())));
        _mm512_storeu_ps(p, e);
        float* acc = rows.acc + r * D;
        if (alpha != 1.f)
          for (int64_t d = 0; d < D; ++d) acc[d] *= alpha;
        st.add(alpha, _mm512_reduce_add_ps(e));
        row_live[t] = ((1u << c1) - 1u) & ~((1u << c0) - 1u);
        live |= row_live[t];
      }
      if (live == 0) continue;
      float* acc = rows.acc + r0 * D;
      const float* p = P + r0 * kChunk;
      switch (nr) {
        case 4: v::tile_pv<4>(acc, D, p, kChunk, v0, key_stride, live, row_live); break;
        case 3: v::tile_pv<3>(acc, D, p, kChunk, v0, key_stride, live, row_live); break;
        case 2: v::tile_pv<2>(acc, D, p, kChunk, v0, key_stride, live, row_live); break;
        default: v::tile_pv<1>(acc, D, p, kChunk, v0, key_stride, live, row_live); break;
      }
    }
    j += n;
  }
}
#endif

template <typename T>
void scan_keys(const Rows& rows, const PagedKV<const T>& kv, int64_t kbeg, int64_t kend, Scratch& sc) {
  const int64_t R = rows.R, D = rows.D, S = kv.block_size, key_stride = kv.slot_stride;
#if MK_CPU_ATTN_AVX512BF16
  if constexpr (std::is_same_v<T, bf16>) {
    if (rows.qb != nullptr) {  // D: multiples of 64 that the register tiles cover (QV = D/32)
      switch (D) {
        case 64: return scan_keys_vec<bf16, 2>(rows, kv, kbeg, kend, sc);
        case 128: return scan_keys_vec<bf16, 4>(rows, kv, kbeg, kend, sc);
        case 256: return scan_keys_vec<bf16, 8>(rows, kv, kbeg, kend, sc);
        default: break;
      }
    }
  }
#endif
#if MK_CPU_ATTN_TILED
  if constexpr (std::is_same_v<T, float>) {  // prefill tiles: rows in lanes (attention_tiled.h)
    if (R >= tiled::kMinRows && R <= tiled::kMaxRows && D % 4 == 0 && D <= tiled::kMaxD) {
      // Q^T and O^T [D][16·NV] live in the K / V conversion buffers ([kChunk][D] each, unused for fp32)
      static_assert(kChunk >= tiled::kMaxRows);
      if (R <= 16) return tiled::scan<1>(R, D, rows.q, rows.acc, rows.st, rows.lo, rows.hi, kv, kbeg, kend, sc.kbuf, sc.vbuf);
      return tiled::scan<2>(R, D, rows.q, rows.acc, rows.st, rows.lo, rows.hi, kv, kbeg, kend, sc.kbuf, sc.vbuf);
    }
  }
#endif
#if MK_CPU_ATTN_AVX512
  if constexpr (std::is_same_v<T, float>) {  // decode rows: D = 64, 128 (QV = D/16 registers of q)
    switch (D) {
      case 64: return scan_keys_vec<float, 4>(rows, kv, kbeg, kend, sc);
      case 128: return scan_keys_vec<float, 8>(rows, kv, kbeg, kend, sc);
      default: break;
    }
  }
#endif
  const float* kp[kChunk];
  const float* vp[kChunk];
  float* scores = sc.scores;
  int64_t j = kbeg;
  while (j < kend) {
    const int64_t n = std::min({kChunk, S - j % S, kend - j});  // keys of this chunk, inside one block
    const int64_t slot0 = kv.slot(j);
    if (j + n < kend) {  // prefetch the next chunk while this one computes
      const int64_t jn = j + n, nn = std::min({kChunk, S - jn % S, kend - jn}), slotn = kv.slot(jn);
      prefetch_rows(kv.k + kv.row(slotn), key_stride, nn, D);
      prefetch_rows(kv.v + kv.row(slotn), key_stride, nn, D);
    }
    rows_as_float(kv.k + kv.row(slot0), key_stride, n, D, sc.kbuf, kp);
    bool any = false;
    for (int64_t r = 0; r < R; ++r) {
      float* s = scores + r * kChunk;
      const float* q = rows.q + r * D;
      const int64_t lo = rows.lo[r], hi = rows.hi[r];
      // Visible keys of this row in the chunk: [c0, c1) (ranges are contiguous).
      const int64_t c0 = std::clamp<int64_t>(lo - j, 0, n), c1 = std::clamp<int64_t>(hi - j, 0, n);
      int64_t c = c0;
      for (; c + 4 <= c1; c += 4) dot4(q, kp[c], kp[c + 1], kp[c + 2], kp[c + 3], D, s + c);
      for (; c < c1; ++c) s[c] = dot(q, kp[c], D);
      if (c0 >= c1) {  // nothing visible for this row in the chunk
        std::fill(s, s + n, 0.f);
        continue;
      }
      float cmax = kNegInf;
      for (c = 0; c < n; ++c) {
        if (c < c0 || c >= c1) s[c] = kNegInf;
        cmax = OnlineSoftmax::nan_max(cmax, s[c]);  // a NaN score poisons the row
      }
      any = true;
      OnlineSoftmax& st = rows.st[r];
      const float alpha = st.rescale(cmax, std_exp);  // 0 when nothing was seen before
      float* acc = rows.acc + r * D;
      if (alpha != 1.f)
        for (int64_t d = 0; d < D; ++d) acc[d] *= alpha;
      const float shift = st.shift();
      float sum = 0.f;
      for (int64_t c = 0; c < n; ++c) {
        s[c] = exp_f(s[c] - shift);  // vectorised polynomial exp; masked: exp(-inf) = 0
        sum += s[c];
      }
      st.add(alpha, sum);
    }
    if (any) {
      rows_as_float(kv.v + kv.row(slot0), key_stride, n, D, sc.vbuf, vp);
      for (int64_t r = 0; r < R; ++r) {
        accumulate_pv(rows.acc + r * D, scores + r * kChunk, vp, n, D);
      }
    }
    j += n;
  }
}

}  // namespace attn
MK_ISA_END
