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
//   2. QKV         qkv[M, (Hq+2Hkv)·D] = xn · Wqkvᵀ, output columns split over threads       | barrier
//   3. attention   per (row m, kv head g): RoPE of q heads g·G … g·G+G-1 and k head g, k/v head g into
//                  the paged cache at slot_mapping[m] (-1: skipped), paged attention of the G heads
//                  (attention_core.h scan over all visible keys, no split-K)                  | barrier
//   4. o-proj      o[M, H] = attn · Woᵀ                                                       | barrier
//   5. ffn norm    as 1., from o + residual
//   6. gate|up     h[M, I] = silu(xn · Wgateᵀ) · (xn · Wupᵀ), in chunks of 64 columns        | barrier
//   7. down        x[M, H] = h · W2ᵀ                                                          | barrier
//
// Before each barrier a thread prefetches the start of its slice of the next phase's weights (warm).
// Every element is computed by the per-op kernels' per-ISA code (isa/gemv.cpp, isa/norm.cpp, isa/rope.cpp,
// isa/attention_core.h)
// and rounded to T at the same points (after each matmul, RoPE, norm, SiLU·up), so the result equals the
// per-op path bit for bit, except attention over more than 1024 visible keys, where the per-op decode
// kernel splits the keys into partitions (split-K) and merges them: equal within fp32 rounding.
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
#include "isa/rope.h"
#include "isa_dispatch.h"

namespace mk::cpu::decode_step {

template <typename T>
struct Layer {
  const T* attn_norm;  // [H]
  const T* qkv;        // [(Hq + 2·Hkv)·D, H]
  const T* wo;         // [H, Hq·D]
  const T* ffn_norm;   // [H]
  const T* w13;        // [2I, H]: gate rows then up rows
  const T* w2;         // [H, I]
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
};

// The per-ISA kernels of the active level (MK_ISA_CALL), looked up once per call.
struct Kernels {
  decltype(&isa_generic::gemv_rows) gemv = MK_ISA_CALL(gemv_rows);
  decltype(&isa_generic::add_rms_norm_row) add_norm = MK_ISA_CALL(add_rms_norm_row);
  decltype(&isa_generic::silu_mul_rows) silu_mul = MK_ISA_CALL(silu_mul_rows);
  decltype(&isa_generic::rope_tokens) rope = MK_ISA_CALL(rope_tokens);
  decltype(&isa_generic::attn_scan) scan = MK_ISA_CALL(attn_scan);
};

inline constexpr int64_t kFfnChunk = 64;  // gate|up columns per chunk (a multiple of 16: silu_mul's vector width)

// [begin, end) of part t of nt of [0, n), boundaries rounded to multiples of `align`.
inline std::pair<int64_t, int64_t> split(int64_t n, int t, int nt, int64_t align) {
  auto at = [&](int i) { return std::min(n, (n * i / nt + align - 1) / align * align); };
  return {at(t), t + 1 == nt ? n : at(t + 1)};
}

// Prefetches (into L2) the first kWarmBytes of rows [n0, n1) of w [*, K]: issued just before a barrier, the
// first lines of this thread's next weight slice are in flight while it waits, instead of each phase
// starting its stream cold (the hardware prefetcher then takes over).
inline constexpr int64_t kWarmBytes = 16 << 10;
template <typename T>
inline void warm(const T* w, int64_t K, int64_t n0, int64_t n1) {
  const char* p = reinterpret_cast<const char*>(w + n0 * K);
  const int64_t bytes = std::min<int64_t>(kWarmBytes, (n1 - n0) * K * static_cast<int64_t>(sizeof(T)));
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + b, 0, 2);
}

// The barrier between phases: spin briefly, then yield the core. OpenMP's barrier spins for a long time
// (libgomp: ~300,000 iterations) before sleeping; on a machine with more runnable threads than cores a
// waiting thread then burns the time slice its partner needs (measured on 2 shared cores under load:
// 8× slower than one thread). Yielding costs one syscall when nothing else is runnable.
class SpinYieldBarrier {
 public:
  void set_size(int n) { n_ = n; }  // before any wait
  void wait() {
    const int gen = gen_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {  // last to arrive: release the others
      count_.store(0, std::memory_order_relaxed);
      gen_.fetch_add(1, std::memory_order_acq_rel);
      return;
    }
    for (int i = 0; gen_.load(std::memory_order_acquire) == gen; ++i) {
      if (i < kSpins) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      } else {
        std::this_thread::yield();
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

// Phase 3 for row m, kv head g: RoPE, cache write, attention of the G q heads into out [Hq·D] of row m.
template <typename T>
void attend(const Kernels& kn, const Shape& s, const Index& ix, const Layer<T>& ly, T* qkv_row, T* out_row, int64_t m,
            int64_t g, AttnScratch<T>& a) {
  static_assert(sizeof(OnlineSoftmax) == 2 * sizeof(float));
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
  const Kernels kn;
  const Elem elem = kElem<T>;
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
      {
        const auto [n0, n1] = split(Nqkv, t, team, 8);
        kn.gemv(elem, qkv.data(), Nqkv, xt, H, ly.qkv, H, M, n0, n1);
      }
      barrier();
      {
        const auto [i0, i1] = split(M * s.Hkv, t, team, 1);
        for (int64_t it = i0; it < i1; ++it) {
          const int64_t m = it / s.Hkv, g = it % s.Hkv;
          attend(kn, s, ix, ly, qkv.data() + m * Nqkv, att.data() + m * QD, m, g, scratch);
        }
        const auto [n0, n1] = split(H, t, team, 8);
        warm(ly.wo, QD, n0, n1);
      }
      barrier();
      {
        const auto [n0, n1] = split(H, t, team, 8);
        kn.gemv(elem, o.data(), H, att.data(), QD, ly.wo, QD, M, n0, n1);
        const auto [c0, c1] = split(I, t, team, kFfnChunk);
        warm(ly.w13, H, c0, c1);
        warm(ly.w13, H, I + c0, I + c1);
      }
      barrier();
      add_norm(o.data(), ly.ffn_norm);
      {
        const auto [c0, c1] = split(I, t, team, kFfnChunk);
        for (int64_t c = c0; c < c1; c += kFfnChunk) {
          const int64_t n = std::min(kFfnChunk, c1 - c);
          kn.gemv(elem, gbuf, kFfnChunk, xt, H, ly.w13 + c * H, H, M, 0, n);
          kn.gemv(elem, ubuf, kFfnChunk, xt, H, ly.w13 + (I + c) * H, H, M, 0, n);
          kn.silu_mul(elem, h.data() + c, I, gbuf, ubuf, kFfnChunk, 0, M, n);
        }
        const auto [n0, n1] = split(H, t, team, 8);
        warm(ly.w2, I, n0, n1);
      }
      barrier();
      {
        const auto [n0, n1] = split(H, t, team, 8);
        kn.gemv(elem, x, H, h.data(), I, ly.w2, I, M, n0, n1);
        if (l + 1 < L) {
          const auto [q0, q1] = split(Nqkv, t, team, 8);
          warm(layers[l + 1].qkv, H, q0, q1);
        }
      }
      barrier();
    }
    if (t == 0) final_cur = cur;
  }
  if (final_cur != 0) std::copy(res2.begin(), res2.end(), residual);
}

}  // namespace mk::cpu::decode_step
