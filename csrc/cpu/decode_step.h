// cpu/decode_step.h — the dense decoder layers of one decode step in ONE OpenMP parallel region
// (the kernel of decode_layers, csrc/cpu/decode_layers.cpp; docs/design.md §3 for the op semantics).
// Baseline glue (no ISA-specific code): raw pointers, T = float, c10::BFloat16 or c10::Half; the caller has
// validated every shape and index. The threads, barriers and buffers live here; every hot loop is a per-ISA
// kernel (csrc/cpu/isa: gemv_rows, add_rms_norm_row, silu_mul_rows, rope_tokens, attn_scan), resolved once
// per call before the parallel region (Kernels, MK_ISA_CALL), so at the avx512bf16 level they run their
// AVX-512 / AVX-512 BF16 paths (docs/kernels.md, "CPU ISA levels").
//
// Shapes: M decode rows (one new token per sequence, M ≤ kGemvMaxM), H hidden, I intermediate, Hq / Hkv
// heads, G = Hq / Hkv, D head_dim, R rot_dim, N cache blocks, S block size, MB max blocks per sequence,
// L layers.
//
// Why: at batch 1 a decoder layer is ~10 small ops; called one by one from Python each pays the
// interpreter and dispatcher (~2.5 ms per step for 30 layers) and opens its own parallel region, too
// small for the thread pool to pay off. Here one call runs all layers; the threads meet at 5 barriers per
// layer, one after each phase whose output the next phase reads across the thread split:
//
//   1. attn norm   every thread: xn = rms_norm(x + residual) into its private buffer (thread 0 stores
//                  the sum as the new residual, into the other half of a ping-pong pair: no barrier)
//   2. QKV         qkv[M, (Hq+2Hkv)·D] = xn · Wqkvᵀ, output columns in units over threads      | barrier
//   3. attention   per (row m, kv head g): RoPE of q heads g·G … g·G+G-1 and k head g, k/v head g into
//                  the paged cache at slot_mapping[m] (-1: skipped), paged attention of the G heads
//                  (attention_core.h scan over all visible keys, no split-K)                  | barrier
//                  When a row reads a block another row writes (speculative decoding's verify rows: one
//                  sequence at consecutive positions, each its own row), every row's RoPE and cache write
//                  come first, then a barrier, then the attention (Index::write_first), as the per-op path.
//   4. o-proj      o[M, H] = attn · Woᵀ                                                       | barrier
//   5. ffn norm    as 1., from o + residual
//   6. gate|up     h[M, I] = silu(xn · Wgateᵀ) · (xn · Wupᵀ), in chunks of 64 columns        | barrier
//   7. down        x[M, H] = h · W2ᵀ                                                          | barrier
//
// The matrix phases hand out their columns in units from a shared counter (UnitCounter); before each barrier
// a thread prefetches the start of its first unit of the next phase's weights (warm).
// Each matrix is one or more row parts (Part), dense or packed in a qlinear format (GGUF blocks, int8 rows);
// a packed part runs the per-ISA quantized GEMV (isa/quant.h quant_gemv) on the input each thread prepared
// for it (XPrep: int8 per 32 / chunk sums / fp32, as csrc/cpu/quant.cpp does once per qlinear call), and
// each part is cut into units on its own (units never span two parts).
// Every element is computed by the per-op kernels' per-ISA code (isa/gemv.cpp, isa/quant_kernels.h,
// isa/norm.cpp, isa/rope.cpp, isa/attention_core.h)
// and rounded to T at the same points (after each matmul, RoPE, norm, SiLU·up), so the result equals the
// per-op path bit for bit, except (a) attention over more than 1024 visible keys, where the per-op decode
// kernel splits the keys into partitions (split-K) and merges them, and (b) the int8 path of a packed part
// at M = 1 on the avx2 / avx512 levels (short rows), whose kernel takes rows in fours from the start of each
// unit (a multiple of 8 rows into its part): where qlinear's split puts a thread boundary at a row not ≡ its
// part start mod 4, those rows sum in another fp32 order.
// Both: equal within fp32 rounding before the rounding to T.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(_OPENMP)
#include <omp.h>
#endif

#include "../kernels/common.cuh"
#include "common.h"
#include "isa/attention.h"
#include "isa/gemv.h"
#include "isa/norm.h"
#include "isa/quant.h"
#include "isa/rope.h"
#include "isa_dispatch.h"

namespace mk::cpu::decode_step {

// One row group ("part") of a layer matrix W [N, K]: rows [n0, n0 + rows) of W, dense (T [rows, K]) or
// packed in one qlinear format (csrc/cpu/isa/quant.h: uint8 blocks [rows, R], or INT8_ROWWISE int8 [rows, K]
// + fp32 scales [rows]). A dense matrix is one dense part; a packed one one part per format run (a Q4_K_M
// qkv: wq | wk in Q4_K, then wv in Q6_K).
inline constexpr int32_t kDense = -1;
struct Part {
  int32_t qtype;         // kDense, or the format code (QGemv::qtype)
  QPath path;            // packed: the GEMV path for this T and level (fp32 for fp32 / fp16 x)
  const void* w;         // the part's first row
  const float* scales;   // INT8_ROWWISE: [rows]; else null
  int64_t n0, rows;      // first row in W; rows
  int64_t row_bytes;     // bytes of one row of w (dense: K·sizeof(T))
};
// A layer matrix: its parts in row order (their rows cover [0, N)).
struct Mat {
  const Part* parts;
  int64_t n;
};

template <typename T>
struct Layer {
  const T* attn_norm;  // [H]
  Mat qkv;             // [(Hq + 2·Hkv)·D, H]
  Mat wo;              // [H, Hq·D]
  const T* ffn_norm;   // [H]
  Mat w13;             // [2I, H]: gate rows then up rows
  Mat w2;              // [H, I]
  T* k_cache;          // [N, S, Hkv, D]
  T* v_cache;          // [N, S, Hkv, D]
  int64_t window;      // sliding window W (<= 0: none)
};

struct Shape {
  int64_t M, H, I, Hq, Hkv, D, R, S, N, MB;
  float eps, scale;
  bool neox;
};

struct Index {
  const int64_t* positions;     // [M]
  const int64_t* slot_mapping;  // [M], -1 = do not write
  const int32_t* block_tables;  // [M, MB]
  const int32_t* seq_lens;      // [M] (keys after this step's write; 0 = padding row)
  const float* cos_sin;         // [P, R]: cos [R/2] then sin [R/2] per position
  bool write_first;             // a row reads a block another row writes: every write before any attention
};

// The per-ISA kernels of the active level (MK_ISA_CALL), looked up once per call.
struct Kernels {
  decltype(&isa_generic::gemv_rows) gemv = MK_ISA_CALL(gemv_rows);
  decltype(&isa_generic::add_rms_norm_row) add_norm = MK_ISA_CALL(add_rms_norm_row);
  decltype(&isa_generic::silu_mul_rows) silu_mul = MK_ISA_CALL(silu_mul_rows);
  decltype(&isa_generic::rope_tokens) rope = MK_ISA_CALL(rope_tokens);
  decltype(&isa_generic::attn_scan) scan = MK_ISA_CALL(attn_scan);
  decltype(&isa_generic::quant_gemv) qgemv = MK_ISA_CALL(quant_gemv);
  decltype(&isa_generic::quant_prepare_x) qprep = MK_ISA_CALL(quant_prepare_x);
  decltype(&isa_generic::quant_prepare_x8k) qprep8k = MK_ISA_CALL(quant_prepare_x8k);
};

inline constexpr int64_t kFfnChunk = 64;  // gate|up columns per chunk (a multiple of 16: silu_mul's vector width)

// [begin, end) of part t of nt of [0, n), boundaries rounded to multiples of `align`.
inline std::pair<int64_t, int64_t> split(int64_t n, int t, int nt, int64_t align) {
  auto at = [&](int i) { return std::min(n, (n * i / nt + align - 1) / align * align); };
  return {at(t), t + 1 == nt ? n : at(t + 1)};
}

// Prefetches (into L2) the first kWarmBytes of rows [r0, r1) of W (whatever parts they cross): issued just
// before a barrier, the first lines of this thread's next weight slice are in flight while it waits, instead
// of each phase starting its stream cold (the hardware prefetcher then takes over).
inline constexpr int64_t kWarmBytes = 16 << 10;
inline void warm(const Mat& w, int64_t r0, int64_t r1) {
  for (int64_t i = 0; i < w.n; ++i) {
    const Part& p = w.parts[i];
    const int64_t a = std::max(r0, p.n0), b = std::min(r1, p.n0 + p.rows);
    if (a >= b) continue;
    const char* q = static_cast<const char*>(p.w) + (a - p.n0) * p.row_bytes;
    const int64_t bytes = std::min(kWarmBytes, (b - a) * p.row_bytes);
    for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(q + o, 0, 2);
  }
}
// The phases' work in units, taken dynamically. Each part of a matrix phase is cut into team·⌈bytes / (team ·
// kUnitBytes)⌉ units of equal rows (a multiple of 8; the last may be shorter; units in part order), the FFN
// phase likewise into units of whole kFfnChunk-column chunks (gate and up rows of the same columns). Thread t
// runs unit t first, then units team, team + 1, … from a shared counter, so the thread that runs faster takes
// more: on this shared 2-core machine the two threads rarely stream at the same speed, and an even static
// split left the faster one waiting 5–10 % of a 7B-shaped step at the barriers. A part of at most team ·
// kUnitBytes gets one unit per thread — the even static split, no counter step — because each unit costs a
// kernel call and a counter step: units of 64 rows measured 10–20 % slower on SmolLM2 (~1,700 units a step).
// Every output row is computed by the same kernel call whatever unit runs it (the GEMVs' rows do not depend on
// the split: isa/quant_codes.h), so the result does not change.
// Worked example: 2 threads. A 7B Q4_0 qkv part (6144 rows of 2304 bytes, 13.5 MiB): 2·⌈13.5 MiB / 512 KiB⌉
// = 56 units of ⌈6144 / 56 / 8⌉·8 = 112 rows (55 units: the last of 96 rows); SmolLM2's qkv (960 rows of 360
// bytes, 338 KiB): 2 units of 480 rows.
inline constexpr int64_t kUnitBytes = 256 << 10;
inline int64_t unit_count(int64_t bytes, int team) {
  return team * std::max<int64_t>(1, (bytes + team * kUnitBytes - 1) / (team * kUnitBytes));
}
inline int64_t unit_rows_of(const Part& p, int team) {
  const int64_t units = unit_count(p.rows * p.row_bytes, team);
  return std::max<int64_t>(8, (p.rows + units * 8 - 1) / (units * 8) * 8);
}
inline int64_t units_of(const Mat& w, int team) {
  int64_t n = 0;
  for (int64_t i = 0; i < w.n; ++i) {
    const int64_t ur = unit_rows_of(w.parts[i], team);
    n += (w.parts[i].rows + ur - 1) / ur;
  }
  return n;
}
// Rows [r0, r1) of W (its row numbering) of unit u.
inline std::pair<int64_t, int64_t> unit_rows(const Mat& w, int64_t u, int team) {
  for (int64_t i = 0; i < w.n; ++i) {
    const Part& p = w.parts[i];
    const int64_t ur = unit_rows_of(p, team), nu = (p.rows + ur - 1) / ur;
    if (u < nu) return {p.n0 + u * ur, p.n0 + std::min(p.rows, (u + 1) * ur)};
    u -= nu;
  }
  return {0, 0};
}
// Gate|up columns per FFN unit (W13 [2I, H]): a multiple of kFfnChunk.
inline int64_t ffn_unit_cols(const Mat& w13, int64_t I, int team) {
  int64_t bytes = 0;
  for (int64_t i = 0; i < w13.n; ++i) bytes += w13.parts[i].rows * w13.parts[i].row_bytes;
  const int64_t u = unit_count(bytes, team);
  return (I + u * kFfnChunk - 1) / (u * kFfnChunk) * kFfnChunk;
}

// The shared counter of a phase: unit t first, then team + fetch_add. Two of them alternate between the
// matrix phases of a step (qkv, o, gate|up, down: even per layer); at the start of a phase thread 0 resets
// the other one, which every thread left at the barrier that ended the previous phase.
class UnitCounter {
 public:
  void reset() { next_.store(0, std::memory_order_relaxed); }
  template <typename F>
  void run(int64_t units, int t, int team, F&& f) {
    for (int64_t u = t; u < units; u = team + next_.fetch_add(1, std::memory_order_relaxed)) f(u);
  }

 private:
  std::atomic<int64_t> next_{0};
};

// Before a barrier: prefetch the first unit this thread will run in the next matrix phase.
inline void warm_first_unit(const Mat& w, int t, int team) {
  const auto [r0, r1] = unit_rows(w, t, team);
  if (r0 < r1) warm(w, r0, r1);
}

// The barrier between phases: spin briefly, then sleep on the generation word (std::atomic::wait: a futex on
// Linux) until the last thread's notify. OpenMP's barrier spins for a long time (libgomp: ~300,000
// iterations) before sleeping; on a machine with more runnable threads than cores a waiting thread then burns
// the time slice its partner needs (measured on 2 shared cores under load: 8× slower than one thread).
// Yielding instead (sched_yield in a loop) still left the process waiting ~85 % of a 7B-shaped decode step
// on 2 cores under load 15 (the yielder stays runnable behind every other process); a sleeping waiter is
// woken, and scheduled, as its partner arrives.
class SpinYieldBarrier {
 public:
  void set_size(int n) { n_ = n; }  // before any wait
  void wait() {
    const int gen = gen_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {  // last to arrive: release the others
      count_.store(0, std::memory_order_relaxed);
      gen_.fetch_add(1, std::memory_order_acq_rel);
      gen_.notify_all();
      return;
    }
    for (int i = 0; gen_.load(std::memory_order_acquire) == gen; ++i) {
      if (i < kSpins) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      } else {
        gen_.wait(gen, std::memory_order_acquire);  // returns once gen_ != gen (or spuriously: re-checked)
      }
    }
  }

 private:
  static constexpr int kSpins = 2000;
  int n_ = 1;
  std::atomic<int> count_{0};
  std::atomic<int> gen_{0};
};

// Per-thread buffers of the attention phase (one GQA group of one row at a time).
template <typename T>
struct AttnScratch {
  std::vector<float> q, acc, scores, kbuf, vbuf;
  std::vector<OnlineSoftmax> st;
  std::vector<T> qraw;
  std::vector<int64_t> lo, hi;
  AttnScratch(int64_t G, int64_t D)
      : q(G * D), acc(G * D), scores(G * kAttnScanChunk), kbuf(kAttnScanChunk * D), vbuf(kAttnScanChunk * D), st(G),
        qraw(G * D), lo(G), hi(G) {}
};

// A thread's copy of one GEMV input x [M, K] in the forms its matrix's packed parts read (quant_gemv, as
// csrc/cpu/quant.cpp prepares them): fp32 (the fp32 path with bf16 / fp16 x), int8 per 32 (int8 path), chunk
// sums (bf16 path); fp32 x on those paths (decode_layers' quantize_x) first rounded to bf16, exactly what a
// bf16 caller would pass. Every thread prepares its own copy at the start of the phase: M·K conversions each, done
// redundantly (a few µs per step at SmolLM2 sizes) instead of one thread + one more barrier per matrix; the
// input is the thread's private norm output or complete after the previous barrier.
struct XNeeds {
  bool f32 = false, i8 = false, i8k = false, bsum = false;
};
template <typename T>
XNeeds x_needs(const Mat& w) {
  XNeeds nd;
  for (int64_t i = 0; i < w.n; ++i) {
    const Part& p = w.parts[i];
    if (p.qtype == kDense) continue;
    nd.f32 |= p.path == QPath::fp32 && !std::is_same_v<T, float>;
    nd.i8 |= p.path == QPath::int8;
    nd.i8k |= p.path == QPath::int8k;
    nd.bsum |= p.path == QPath::bf16;
  }
  return nd;
}

template <typename T>
struct XPrep {
  std::vector<float> xf, dx, xs, xsum, yf;  // yf: fp16 x, a packed part's fp32 output before rounding to T
  std::vector<int8_t> xq, xqk;    // int8 per 32, per 256
  std::vector<float> dk;          // int8k: per 256
  std::vector<int16_t> bs;        // int8k: Σ q per 16
  std::vector<c10::BFloat16> xbf;  // fp32 x on the int8 / bf16 paths: x rounded to bf16 [M, K]
  const T* x = nullptr;  // the input [M, K]
  const uint16_t* xb = nullptr;  // the int8 / bf16 paths' input: x itself (bf16) or xbf
  int64_t K = 0;
  // all: what any matrix of the step needs; Kmax the widest input, Nmax the most output rows of one call
  XPrep(const XNeeds& all, bool packed, int64_t M, int64_t Kmax, int64_t Nmax) {
    if (all.f32) xf.resize(M * Kmax);
    if (all.i8) xq.resize(M * Kmax), dx.resize(M * Kmax / 32 + 1), xs.resize(M * Kmax / 32 + 1);
    if (all.i8k) xqk.resize(M * Kmax), dk.resize(M * Kmax / 256 + 1), bs.resize(M * Kmax / 16 + 1);
    if (all.bsum) xsum.resize(M * Kmax / 32 + 1);
    if (std::is_same_v<T, c10::Half> && packed) yf.resize(M * Nmax);
    if (std::is_same_v<T, float> && (all.i8 || all.i8k || all.bsum)) xbf.resize(M * Kmax);
  }
  void prepare(const Kernels& kn, const Mat& w, const T* x_, int64_t M, int64_t K_) {
    x = x_, K = K_;
    const XNeeds nd = x_needs<T>(w);
    if (nd.f32)
      for (int64_t i = 0; i < M * K; ++i) xf[i] = to_f(x[i]);
    xb = reinterpret_cast<const uint16_t*>(x);  // int8 / bf16 paths: T is bf16, or fp32 rounded to it here
    if constexpr (std::is_same_v<T, float>) {
      if (nd.i8 || nd.i8k || nd.bsum) {
        for (int64_t i = 0; i < M * K; ++i) xbf[i] = from_f<c10::BFloat16>(x[i]);
        xb = reinterpret_cast<const uint16_t*>(xbf.data());
      }
    }
    if (nd.i8) kn.qprep(static_cast<int>(QPath::int8), xb, M, K, xq.data(), dx.data(), xs.data());
    if (nd.i8k) kn.qprep8k(xb, M, K, xqk.data(), dk.data(), bs.data());
    if (nd.bsum) kn.qprep(static_cast<int>(QPath::bf16), xb, M, K, nullptr, xsum.data(), nullptr);
  }
};

// y[m·ldy + j] = Σ_k x[m, k] · W_p[la + j, k] for j in [0, n): rows [la, la + n) of part p, rounded once to T
// (the per-op kernels' rounding: skinny_linear for a dense part, qlinear's GEMV for a packed one).
template <typename T>
void part_rows(const Kernels& kn, const Part& p, XPrep<T>& xp, int64_t M, T* y, int64_t ldy, int64_t la, int64_t n) {
  const char* w = static_cast<const char*>(p.w) + la * p.row_bytes;
  if (p.qtype == kDense) {
    kn.gemv(kElem<T>, y, ldy, xp.x, xp.K, w, xp.K, M, 0, n);
    return;
  }
  const float* xf = std::is_same_v<T, float> ? reinterpret_cast<const float*>(xp.x) : xp.xf.data();
  const bool k8 = p.path == QPath::int8k;
  QGemv g{p.path, p.qtype, w, p.scales ? p.scales + la : nullptr, xp.K, M, xf,
          xp.xb, k8 ? xp.xqk.data() : xp.xq.data(),
          k8 ? xp.dk.data() : p.path == QPath::int8 ? xp.dx.data() : xp.xsum.data(),
          xp.xs.data(), std::is_same_v<T, c10::BFloat16>, y, ldy, xp.bs.data()};
  if constexpr (std::is_same_v<T, c10::Half>) {  // fp32 out, then one rounding (qlinear: out.copy_ of fp32)
    g.y = xp.yf.data(), g.ldy = n;
    kn.qgemv(g, 0, n);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t j = 0; j < n; ++j) y[m * ldy + j] = from_f<T>(xp.yf[m * n + j]);
  } else {
    kn.qgemv(g, 0, n);
  }
}

// y[m·ldy + (r - r0)] for the rows r in [r0, r1) of W, whatever parts they cross.
template <typename T>
void mat_rows(const Kernels& kn, const Mat& w, XPrep<T>& xp, int64_t M, T* y, int64_t ldy, int64_t r0, int64_t r1) {
  for (int64_t i = 0; i < w.n; ++i) {
    const Part& p = w.parts[i];
    const int64_t a = std::max(r0, p.n0), b = std::min(r1, p.n0 + p.rows);
    if (a < b) part_rows(kn, p, xp, M, y + (a - r0), ldy, a - p.n0, b - a);
  }
}

// y[m·ldy + r] for the units of W this thread takes from the counter.
template <typename T>
void mat_units(const Kernels& kn, const Mat& w, XPrep<T>& xp, int64_t M, T* y, int64_t ldy, int t, int team,
               UnitCounter& counter) {
  counter.run(units_of(w, team), t, team, [&](int64_t u) {
    const auto [r0, r1] = unit_rows(w, u, team);
    mat_rows(kn, w, xp, M, y + r0, ldy, r0, r1);
  });
}

// Phase 3a for row m, kv head g: RoPE of its q and k heads (in place in qkv_row), k/v head g into the cache.
template <typename T>
void rope_write(const Kernels& kn, const Shape& s, const Index& ix, const Layer<T>& ly, T* qkv_row, int64_t m,
                int64_t g) {
  const int64_t G = s.Hq / s.Hkv, D = s.D;
  T* q = qkv_row + g * G * D;
  T* k = qkv_row + (s.Hq + g) * D;
  const T* v = qkv_row + (s.Hq + s.Hkv + g) * D;
  kn.rope(kElem<T>, s.neox, ix.positions + m, q, k, ix.cos_sin, 0, 1, 0, 0, G, 1, D, s.R);
  const int64_t slot = ix.slot_mapping[m];
  if (slot >= 0) {
    const int64_t row = slot * s.Hkv * D + g * D;  // slot = block·S + offset; rows of Hkv·D elements
    std::memcpy(ly.k_cache + row, k, D * sizeof(T));
    std::memcpy(ly.v_cache + row, v, D * sizeof(T));
  }
}

// Phase 3b for row m, kv head g: attention of the G q heads (RoPE applied) into out [Hq·D] of row m.
template <typename T>
void attend(const Kernels& kn, const Shape& s, const Index& ix, const Layer<T>& ly, T* qkv_row, T* out_row, int64_t m,
            int64_t g, AttnScratch<T>& a) {
  static_assert(sizeof(OnlineSoftmax) == 2 * sizeof(float));
  const int64_t G = s.Hq / s.Hkv, D = s.D;
  T* q = qkv_row + g * G * D;
  std::fill(a.acc.begin(), a.acc.end(), 0.f);
  std::fill(a.st.begin(), a.st.end(), OnlineSoftmax{});
  const int64_t L = ix.seq_lens[m], first = first_visible_key(L - 1, ly.window);
  if (first < L) {
    for (int64_t i = 0; i < G * D; ++i) a.q[i] = to_f(q[i]) * s.scale;
    if constexpr (!std::is_same_v<T, float>) std::copy(q, q + G * D, a.qraw.data());
    std::fill(a.lo.begin(), a.lo.end(), first);
    std::fill(a.hi.begin(), a.hi.end(), L);
    const PagedCache<T> cache{ly.k_cache, ly.v_cache, ix.block_tables, static_cast<int>(s.Hkv),
                              static_cast<int>(s.S), static_cast<int>(s.MB), static_cast<int>(s.N)};
    const PagedKV<const T> kv = cache.sequence(m, static_cast<int>(g), static_cast<int>(D));
    const AttnScan scan{kElem<T>,     G,           D,           a.q.data(), std::is_same_v<T, float> ? nullptr : a.qraw.data(),
                        s.scale,      a.acc.data(), a.st.data(), a.lo.data(), a.hi.data(), kv.k, kv.v, kv.block_table,
                        kv.slot_stride, kv.block_size, kv.num_blocks, first, L, a.scores.data(), a.kbuf.data(),
                        a.vbuf.data()};
    kn.scan(scan);
  }
  for (int64_t r = 0; r < G; ++r) {
    T* o = out_row + (g * G + r) * D;
    const float inv = OnlineSoftmax::normalizer(a.st[r].l);
    for (int64_t d = 0; d < D; ++d) o[d] = from_f<T>(a.acc[r * D + d] * inv);
  }
}

// Runs the L layers on x [M, H] (in: the embeddings or the previous layer's output; out: the last layer's
// FFN output) and residual [M, H] (in / out: the residual stream, zeros before the first layer), with
// nt threads. The state after the call is the per-op path's before the final norm.
template <typename T>
void run(const Shape& s, const Index& ix, const Layer<T>* layers, int64_t L, T* x, T* residual, int nt) {
  const int64_t M = s.M, H = s.H, I = s.I, D = s.D, G = s.Hq / s.Hkv;
  const int64_t Nqkv = (s.Hq + 2 * s.Hkv) * D, QD = s.Hq * D;
  std::vector<T> qkv(M * Nqkv), att(M * QD), o(M * H), h(M * I), res2(M * H);
  std::vector<T> xn(static_cast<size_t>(nt) * M * H), sums(static_cast<size_t>(nt) * H);
  std::vector<T> gu(static_cast<size_t>(nt) * 2 * M * kFfnChunk);
  T* res[2] = {residual, res2.data()};
  int final_cur = 0;
  SpinYieldBarrier bar;
  UnitCounter counters[2];  // the matrix phases' (UnitCounter: qkv and gate|up take 0, o and down 1)
  const Kernels kn;
  const Elem elem = kElem<T>;
  XNeeds needs;  // over all matrices: which input forms the threads' XPrep must hold
  bool packed = false;
  for (int64_t l = 0; l < L; ++l)
    for (const Mat* w : {&layers[l].qkv, &layers[l].wo, &layers[l].w13, &layers[l].w2}) {
      const XNeeds nd = x_needs<T>(*w);
      needs.f32 |= nd.f32, needs.i8 |= nd.i8, needs.i8k |= nd.i8k, needs.bsum |= nd.bsum;
      for (int64_t i = 0; i < w->n; ++i) packed |= w->parts[i].qtype != kDense;
    }
#if defined(_OPENMP)
#pragma omp parallel num_threads(nt)
#endif
  {
#if defined(_OPENMP)
    const int t = omp_get_thread_num(), team = omp_get_num_threads();
    if (t == 0) bar.set_size(team);  // the team may be smaller than nt
#pragma omp barrier
#else
    const int t = 0, team = 1;
#endif
    auto barrier = [&] { bar.wait(); };
    T* xt = xn.data() + static_cast<size_t>(t) * M * H;
    T* gbuf = gu.data() + static_cast<size_t>(t) * 2 * M * kFfnChunk;
    T* ubuf = gbuf + M * kFfnChunk;
    AttnScratch<T> scratch(G, D);
    XPrep<T> xp(needs, packed, M, std::max({H, QD, I}), std::max(Nqkv, H));
    int cur = 0;
    // xt = rms_norm(src + res[cur]); thread 0 stores the sum as res[cur ^ 1].
    auto add_norm = [&](const T* src, const T* w) {
      for (int64_t m = 0; m < M; ++m) {
        T* sum = t == 0 ? res[cur ^ 1] + m * H : sums.data() + static_cast<size_t>(t) * H;
        kn.add_norm(elem, xt + m * H, sum, src + m * H, res[cur] + m * H, w, H, s.eps);
      }
      cur ^= 1;
    };
    for (int64_t l = 0; l < L; ++l) {
      const Layer<T>& ly = layers[l];
      add_norm(x, ly.attn_norm);
      xp.prepare(kn, ly.qkv, xt, M, H);
      if (t == 0) counters[1].reset();
      mat_units(kn, ly.qkv, xp, M, qkv.data(), Nqkv, t, team, counters[0]);
      barrier();
      {
        const auto [i0, i1] = split(M * s.Hkv, t, team, 1);
        if (ix.write_first) {  // rows of one sequence (speculative verify rows): all writes, then attention
          for (int64_t it = i0; it < i1; ++it) rope_write(kn, s, ix, ly, qkv.data() + it / s.Hkv * Nqkv, it / s.Hkv,
                                                          it % s.Hkv);
          barrier();
        }
        for (int64_t it = i0; it < i1; ++it) {
          const int64_t m = it / s.Hkv, g = it % s.Hkv;
          if (!ix.write_first) rope_write(kn, s, ix, ly, qkv.data() + m * Nqkv, m, g);
          attend(kn, s, ix, ly, qkv.data() + m * Nqkv, att.data() + m * QD, m, g, scratch);
        }
        warm_first_unit(ly.wo, t, team);
      }
      barrier();
      const int64_t ffn_cols = ffn_unit_cols(ly.w13, I, team);  // gate|up columns per unit
      const int64_t ffn_units = (I + ffn_cols - 1) / ffn_cols;
      {
        xp.prepare(kn, ly.wo, att.data(), M, QD);
        if (t == 0) counters[0].reset();
        mat_units(kn, ly.wo, xp, M, o.data(), H, t, team, counters[1]);
        if (t < ffn_units) {
          const int64_t c = t * ffn_cols, n = std::min(ffn_cols, I - c);
          warm(ly.w13, c, c + n);
          warm(ly.w13, I + c, I + c + n);
        }
      }
      barrier();
      add_norm(o.data(), ly.ffn_norm);
      {
        xp.prepare(kn, ly.w13, xt, M, H);
        if (t == 0) counters[1].reset();
        counters[0].run(ffn_units, t, team, [&](int64_t u) {
          const int64_t c1 = std::min(I, (u + 1) * ffn_cols);
          for (int64_t c = u * ffn_cols; c < c1; c += kFfnChunk) {
            const int64_t n = std::min(kFfnChunk, c1 - c);
            mat_rows(kn, ly.w13, xp, M, gbuf, kFfnChunk, c, c + n);
            mat_rows(kn, ly.w13, xp, M, ubuf, kFfnChunk, I + c, I + c + n);
            kn.silu_mul(elem, h.data() + c, I, gbuf, ubuf, kFfnChunk, 0, M, n);
          }
        });
        warm_first_unit(ly.w2, t, team);
      }
      barrier();
      {
        xp.prepare(kn, ly.w2, h.data(), M, I);
        if (t == 0) counters[0].reset();
        mat_units(kn, ly.w2, xp, M, x, H, t, team, counters[1]);
        if (l + 1 < L) warm_first_unit(layers[l + 1].qkv, t, team);
      }
      barrier();
    }
    if (t == 0) final_cur = cur;
  }
  if (final_cur != 0) std::copy(res2.begin(), res2.end(), residual);
}

}  // namespace mk::cpu::decode_step
