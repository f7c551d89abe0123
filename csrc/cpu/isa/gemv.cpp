// cpu/isa/gemv.cpp — gemv_rows (gemv.h) for one ISA level.
//
// Decode matmuls are memory-bound GEMVs: every weight byte is read once per step. For each group of NB
// rows of W the loop keeps MB × NB accumulators in registers and walks all row blocks of x over that
// group before moving on, so W is streamed from memory exactly once whatever M is (the group, NB·K
// elements, stays in L1 across the row blocks of x). Each dot product x[m]·w[n] is computed the same way
// whatever M, the tiling or the thread split are (one accumulation order per level).
//   avx512bf16  bf16: `vdpbf16ps` (32 products per instruction, fp32 accumulation); fp32 / fp16: FMA
//   avx512      16-lane FMA; bf16 / fp16 converted to fp32 on load (masked tails)
//   avx2        8-lane FMA; bf16 / fp16 converted on load; scalar tail of K % 8
//   generic     scalar code with 16 partial sums (auto-vectorised for the baseline)
#include "gemv.h"

#include <algorithm>
#include <type_traits>

#include "target.h"

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

MK_ISA_BEGIN
namespace {

// Memory access order (measured, benchmarks/results/cpu_kernels.md; every order computes the same sums):
//   M ≤ 2, short rows (K · sizeof(T) ≤ kRowwiseMaxBytes: SmolLM2, and K = 2048 in bf16 / fp32): the rows of
//     a group one after the other, so the slice (contiguous in W) is read strictly in address order and the
//     hardware prefetcher streams it (2× the interleaved order at K = 576, ~90 % of the read bandwidth);
//   M ≤ 2, long rows: the NB rows interleaved per K step, no software prefetch (it measured slower);
//   M ≥ 3: interleaved, each load also touching the same offset kPrefetchGroups groups further on.
// The first kHeadBytes of a call's slice are prefetched up front (the loop starts cold).
#if !defined(MK_GEMV_PREFETCH_GROUPS)
#define MK_GEMV_PREFETCH_GROUPS 1
#endif
#if !defined(MK_GEMV_ROWWISE_MAX_BYTES)
#define MK_GEMV_ROWWISE_MAX_BYTES 8192
#endif
constexpr int64_t kPrefetchGroups = MK_GEMV_PREFETCH_GROUPS;
constexpr int64_t kRowwiseMaxBytes = MK_GEMV_ROWWISE_MAX_BYTES;
constexpr int64_t kHeadBytes = 4096;

inline void prefetch(const void* p) { __builtin_prefetch(p, 0, 3); }

// The rows of a group are passed as NB pointers: a tail group (fewer than NB columns left) repeats its last
// row, computes all NB and stores the valid ones, so every output column is computed by the same instructions
// whatever the split of the columns (thread count, slice boundaries) and the tail.
template <typename T, int NB>
struct Rows {
  const T* p[NB];
};

#if defined(__AVX512F__) && defined(__AVX512BW__)

inline __m512 load_f32x16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load_f32x16(const bf16* p, __mmask16 m) {
  const __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline __m512 load_f32x16(const f16* p, __mmask16 m) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }

using Acc = __m512;
inline Acc acc_zero() { return _mm512_setzero_ps(); }

// acc[m][r] += Σ_k x[m, k] · w[r, k] over K in chunks of 16 (fp32, fp16; bf16 without AVX512-BF16), or of 32
// with vdpbf16ps (bf16 on AVX512-BF16: 32 products per instruction, fp32 accumulation).
template <typename T, int MB, int NB, bool ROWWISE>
inline void dot_block(const T* x, int64_t ldx, const Rows<T, NB>& w, int64_t K, Acc (&acc)[MB][NB], int64_t pf) {
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<T, bf16>) {
    if constexpr (ROWWISE) {
    for (int r = 0; r < NB; ++r)
      for (int64_t k = 0; k < K; k += 32) {
        const __mmask32 mask = K - k >= 32 ? __mmask32(0xffffffffu) : __mmask32((1ull << (K - k)) - 1);
        const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(mask, w.p[r] + k);
        if (pf) prefetch(reinterpret_cast<const char*>(w.p[r] + k) + pf);
        for (int m = 0; m < MB; ++m)
          acc[m][r] = _mm512_dpbf16_ps(acc[m][r], (__m512bh)_mm512_maskz_loadu_epi16(mask, x + m * ldx + k), wv);
      }
    return;
    }
    for (int64_t k = 0; k < K; k += 32) {
      const __mmask32 mask = K - k >= 32 ? __mmask32(0xffffffffu) : __mmask32((1ull << (K - k)) - 1);
      __m512bh wv[NB];
      for (int r = 0; r < NB; ++r) {
        wv[r] = (__m512bh)_mm512_maskz_loadu_epi16(mask, w.p[r] + k);
        if (pf) prefetch(reinterpret_cast<const char*>(w.p[r] + k) + pf);
      }
      for (int m = 0; m < MB; ++m) {
        const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mask, x + m * ldx + k);
        for (int r = 0; r < NB; ++r) acc[m][r] = _mm512_dpbf16_ps(acc[m][r], xv, wv[r]);
      }
    }
    return;
  }
#endif
  if constexpr (ROWWISE) {
  for (int r = 0; r < NB; ++r)
    for (int64_t k = 0; k < K; k += 16) {
      const __mmask16 mask = K - k >= 16 ? __mmask16(0xffff) : __mmask16((1u << (K - k)) - 1);
      const __m512 wv = load_f32x16(w.p[r] + k, mask);
      if (pf && (sizeof(T) == 4 || k % 32 == 0)) prefetch(reinterpret_cast<const char*>(w.p[r] + k) + pf);
      for (int m = 0; m < MB; ++m) acc[m][r] = _mm512_fmadd_ps(load_f32x16(x + m * ldx + k, mask), wv, acc[m][r]);
    }
  return;
  }
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 mask = K - k >= 16 ? __mmask16(0xffff) : __mmask16((1u << (K - k)) - 1);
    __m512 wv[NB];
    for (int r = 0; r < NB; ++r) {
      wv[r] = load_f32x16(w.p[r] + k, mask);
      if (pf && (sizeof(T) == 4 || k % 32 == 0)) prefetch(reinterpret_cast<const char*>(w.p[r] + k) + pf);
    }
    for (int m = 0; m < MB; ++m) {
      const __m512 xv = load_f32x16(x + m * ldx + k, mask);
      for (int r = 0; r < NB; ++r) acc[m][r] = _mm512_fmadd_ps(xv, wv[r], acc[m][r]);
    }
  }
}

// The lane sums of 8 accumulators, sum i in lane i of the result: a transposing tree (3 shuffle + add levels,
// ~20 instructions for 8 sums instead of ~8 each). Every sum is added in the same order,
// ((l0 + l8) + (l4 + l12)) + ((l2 + l10) + (l6 + l14)) + … for lanes lj, whichever slot it occupies.
inline __m256 reduce8(const Acc (&v)[8]) {
  __m512 t[4], u[2];
  for (int i = 0; i < 4; ++i)  // [a.q0 + a.q2, a.q1 + a.q3, b.q0 + b.q2, b.q1 + b.q3] (q: 128-bit quarters)
    t[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  for (int i = 0; i < 2; ++i)  // quarter j: the 4 partial sums of input 4i + j
    u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(t[2 * i], t[2 * i + 1], 0xDD));
  // quarter j: [in j: p0 + p2, p1 + p3, in 4 + j: p0 + p2, p1 + p3]
  const __m512 w = _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], 0x44), _mm512_shuffle_ps(u[0], u[1], 0xEE));
  const __m512 z = _mm512_add_ps(w, _mm512_shuffle_ps(w, w, 0xB1));  // in j at 4j, in 4 + j at 4j + 2
  return _mm512_castps512_ps256(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 0, 0, 0, 0, 0,
                                                                         0, 0, 0), z));
}

// Groups of 8 rows of W at M = 1 and 2 (2 × 8 accumulators + 8 W vectors fit the 32 zmm registers); for
// M ≥ 3 row blocks of 4 over groups of 4 (4 × 4 + 4).
constexpr int kNB1 = 8, kNB2 = 8, kNarrowNB = 4, kRowBlock = 4;

#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const bf16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m256 load8(const f16* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

using Acc = __m256;
inline Acc acc_zero() { return _mm256_setzero_ps(); }

// acc[m][r] += Σ_k x[m, k] · w[r, k] over the first K & ~7 elements, 8 at a time (the rest: tail_dot).
template <typename T, int MB, int NB, bool ROWWISE>
inline void dot_block(const T* x, int64_t ldx, const Rows<T, NB>& w, int64_t K, Acc (&acc)[MB][NB], int64_t pf) {
  const int64_t K8 = K & ~int64_t{7};
  if constexpr (ROWWISE) {
  for (int r = 0; r < NB; ++r)
    for (int64_t k = 0; k < K8; k += 8) {
      const __m256 wv = load8(w.p[r] + k);
      if (pf && (k * sizeof(T)) % 64 == 0) prefetch(reinterpret_cast<const char*>(w.p[r] + k) + pf);
      for (int m = 0; m < MB; ++m) acc[m][r] = _mm256_fmadd_ps(load8(x + m * ldx + k), wv, acc[m][r]);
    }
  return;
  }
  for (int64_t k = 0; k < K8; k += 8) {
    __m256 wv[NB];
    for (int r = 0; r < NB; ++r) {
      wv[r] = load8(w.p[r] + k);
      if (pf && (k * sizeof(T)) % 64 == 0) prefetch(reinterpret_cast<const char*>(w.p[r] + k) + pf);
    }
    for (int m = 0; m < MB; ++m) {
      const __m256 xv = load8(x + m * ldx + k);
      for (int r = 0; r < NB; ++r) acc[m][r] = _mm256_fmadd_ps(xv, wv[r], acc[m][r]);
    }
  }
}

// The lane sums of 8 accumulators, sum i in lane i: ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)) for
// every input.
inline __m256 reduce8(const Acc (&v)[8]) {
  const __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));  // [0 1 2 3 | 0 1 2 3]
  const __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));  // [4 5 6 7 | 4 5 6 7]
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

// 16 ymm registers: groups of 8 rows of W at M = 1 (8 accumulators, the W loads folded into the FMAs), of 4
// at M = 2 (2 × 4 + 4 + 2); for M ≥ 3 row blocks of 3 over groups of 3 (3 × 3 + 3 + 1).
constexpr int kNB1 = 8, kNB2 = 4, kNarrowNB = 3, kRowBlock = 3;

#endif

#if (defined(__AVX512F__) && defined(__AVX512BW__)) || (defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))

// Σ over the elements K & ~7 … K - 1 (AVX2: the loop covers multiples of 8; AVX-512 masks its tail: none).
template <typename T>
inline float tail_dot(const T* x, const T* w, int64_t K) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
  (void)x, (void)w, (void)K;
  return 0.f;
#else
  float s = 0.f;
  for (int64_t k = K & ~int64_t{7}; k < K; ++k) s += to_f(x[k]) * to_f(w[k]);
  return s;
#endif
}

// Columns w.p[0 .. NB) of rows [0, MB) of x: out[m·ldo + r] for r < nvalid (pf: the prefetch offset in
// bytes, 0 for none).
template <typename T, int MB, int NB, bool ROWWISE = false>
inline void tile(T* out, int64_t ldo, const T* x, int64_t ldx, const Rows<T, NB>& w, int64_t K, int nvalid,
                 int64_t pf) {
  constexpr int NA = MB * NB, NR = (NA + 7) / 8;
  Acc acc[MB][NB];
  for (int m = 0; m < MB; ++m)
    for (int r = 0; r < NB; ++r) acc[m][r] = acc_zero();
  dot_block<T, MB, NB, ROWWISE>(x, ldx, w, K, acc, pf);
  alignas(32) float sums[NR * 8];
  for (int g = 0; g < NR; ++g) {
    Acc v[8];
    for (int i = 0; i < 8; ++i) v[i] = 8 * g + i < NA ? acc[(8 * g + i) / NB][(8 * g + i) % NB] : acc_zero();
    _mm256_store_ps(sums + 8 * g, reduce8(v));
  }
  for (int m = 0; m < MB; ++m)
    for (int r = 0; r < nvalid; ++r)
      out[m * ldo + r] = from_f<T>(sums[m * NB + r] + tail_dot(x + m * ldx, w.p[r], K));
}

// Columns [n0, n1) in groups of NB rows of W; MB > 0: all M = MB rows of x in one tile; MB = 0: row blocks of
// kRowBlock (the group's rows of W stay in L1 / L2 across the blocks; only the first one prefetches).
template <typename T, int NB, int MB>
void rows_nb(T* out, int64_t ldo, const T* x, int64_t ldx, const T* w, int64_t K, int64_t M, int64_t n0, int64_t n1) {
  const int64_t row_bytes = K * static_cast<int64_t>(sizeof(T));
  const bool rowwise = MB > 0 && row_bytes <= kRowwiseMaxBytes;
  const int64_t pf = MB > 0 ? 0 : kPrefetchGroups * NB * row_bytes;
  Rows<T, NB> g;
  for (int64_t n = n0; n < n1; n += NB) {
    const int nvalid = static_cast<int>(std::min<int64_t>(NB, n1 - n));
    for (int r = 0; r < NB; ++r) g.p[r] = w + (n + std::min(r, nvalid - 1)) * K;
    if constexpr (MB > 0) {
      if (rowwise)
        tile<T, MB, NB, true>(out + n, ldo, x, ldx, g, K, nvalid, pf);
      else
        tile<T, MB, NB>(out + n, ldo, x, ldx, g, K, nvalid, pf);
    } else {
      int64_t m = 0;
      for (; m + kRowBlock <= M; m += kRowBlock)
        tile<T, kRowBlock, NB>(out + m * ldo + n, ldo, x + m * ldx, ldx, g, K, nvalid, m == 0 ? pf : 0);
      const int64_t p = m == 0 ? pf : 0;
      T* o = out + m * ldo + n;
      const T* xm = x + m * ldx;
      switch (M - m) {
        case 3:
          if constexpr (kRowBlock > 3) tile<T, 3, NB>(o, ldo, xm, ldx, g, K, nvalid, p);
          break;
        case 2: tile<T, 2, NB>(o, ldo, xm, ldx, g, K, nvalid, p); break;
        case 1: tile<T, 1, NB>(o, ldo, xm, ldx, g, K, nvalid, p); break;
        default: break;
      }
    }
  }
}

template <typename T>
void rows(T* out, int64_t ldo, const T* x, int64_t ldx, const T* w, int64_t K, int64_t M, int64_t n0, int64_t n1) {
  if (M <= 0 || n0 >= n1) return;
  const char* s = reinterpret_cast<const char*>(w + n0 * K);  // the group loop starts cold: warm its start
  const int64_t head = std::min<int64_t>(kHeadBytes, (n1 - n0) * K * static_cast<int64_t>(sizeof(T)));
  for (int64_t b = 0; b < head; b += 64) prefetch(s + b);
  if (M == 1) return rows_nb<T, kNB1, 1>(out, ldo, x, ldx, w, K, M, n0, n1);
  if (M == 2) return rows_nb<T, kNB2, 2>(out, ldo, x, ldx, w, K, M, n0, n1);
  rows_nb<T, kNarrowNB, 0>(out, ldo, x, ldx, w, K, M, n0, n1);
}

#else  // generic

template <typename T>
void rows(T* out, int64_t ldo, const T* x, int64_t ldx, const T* w, int64_t K, int64_t M, int64_t n0, int64_t n1) {
  constexpr int L = 16;
  for (int64_t n = n0; n < n1; ++n) {
    const T* wr = w + n * K;
    for (int64_t m = 0; m < M; ++m) {
      const T* xr = x + m * ldx;
      float acc[L] = {};
      int64_t k = 0;
      for (; k + L <= K; k += L)
        for (int j = 0; j < L; ++j) acc[j] += to_f(xr[k + j]) * to_f(wr[k + j]);
      float s = 0.f;
      for (int j = 0; j < L; ++j) s += acc[j];
      for (; k < K; ++k) s += to_f(xr[k]) * to_f(wr[k]);
      out[m * ldo + n] = from_f<T>(s);
    }
  }
}

#endif

}  // namespace

void gemv_rows(Elem elem, void* out, int64_t ldo, const void* x, int64_t ldx, const void* w, int64_t K, int64_t M,
               int64_t n0, int64_t n1) {
  switch (elem) {
    case Elem::f32:
      return rows(static_cast<float*>(out), ldo, static_cast<const float*>(x), ldx, static_cast<const float*>(w), K, M,
                  n0, n1);
    case Elem::bf16:
      return rows(static_cast<bf16*>(out), ldo, static_cast<const bf16*>(x), ldx, static_cast<const bf16*>(w), K, M,
                  n0, n1);
    case Elem::f16:
      return rows(static_cast<f16*>(out), ldo, static_cast<const f16*>(x), ldx, static_cast<const f16*>(w), K, M, n0,
                  n1);
  }
}

MK_ISA_END
