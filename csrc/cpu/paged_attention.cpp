// cpu/paged_attention.cpp — the native CPU paged KV cache and attention ops (MK_ATTENTION_OPS, fp32, bf16, fp16):
// reshape_and_cache, paged_decode_attention, paged_prefill_attention.
//
// Shapes: T tokens, B sequences, Tq packed query tokens, Hq / Hkv heads, G = Hq/Hkv (GQA group), D head_dim,
// N num_blocks, S block_size, M max_blocks, P split-K partitions.
// Semantics (docs/design.md §3): a query at position p sees keys j with first_visible_key(p, W) ≤ j ≤ p
// (csrc/kernels/common.cuh; W = sliding window, ≤ 0 = none); decode queries sit at seq_lens[b]-1;
// prefill's q_b new tokens are the last q_b positions of sequence b. Rows that see no key produce 0.
// Key j of sequence b is read through PagedCache::sequence / PagedKV::slot (common.cuh), as on the GPU.
//
// reshape_and_cache: k, v [T, Hkv, D] → k_cache, v_cache [N, S, Hkv, D] at slot_mapping[t] (int64 [T],
// -1 skips the token). A pure copy: bit-exact. Parallel over tokens.
//
// Work split: parallel over (sequence, kv head[, partition / query tile]); the G q heads of one kv
// head are processed together, so each K/V row is converted and read once per group (the per-ISA scan,
// csrc/cpu/isa/attention_core.h; this file loads q, splits the work, merges and stores).
// Decode split-K: the visible keys of a sequence are cut into partitions of `partition_size` keys
// (auto: 1024) counted from the first visible key; partial (m, l, acc) states are merged in partition
// order afterwards. Partition boundaries depend only on the inputs, never on the thread count, so the
// result is bit-identical run to run.
#include <torch/library.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "../checks/attention.h"
#include "../kernels/common.cuh"
#include "common.h"
#include "isa/attention.h"
#include "isa_dispatch.h"

namespace mk::cpu {
namespace {

constexpr int64_t kAutoPartition = 1024;  // keys per split-K partition when the caller passes 0
constexpr int64_t kPrefillRows = 32;      // target query rows (tokens × group heads) per prefill tile

inline int64_t ceil_div_i(int64_t a, int64_t b) { return a <= 0 ? 0 : (a + b - 1) / b; }

void reshape_and_cache(const at::Tensor& k, const at::Tensor& v, at::Tensor& k_cache, at::Tensor& v_cache,
                       const at::Tensor& slot_mapping) {
  constexpr const char* op = "reshape_and_cache";
  require_cpu(op, "k", k);
  check::reshape_and_cache_args(op, k, v, k_cache, v_cache, slot_mapping, kFloatTypes);
  const int64_t T = k.size(0), es = k.element_size();
  const int64_t row_bytes = k.size(1) * k.size(2) * es;  // one token: Hkv·D elements
  const int64_t* slots = slot_mapping.const_data_ptr<int64_t>();
  const char* kp = static_cast<const char*>(k.const_data_ptr());
  const char* vp = static_cast<const char*>(v.const_data_ptr());
  // The caches as N·S slots of row_bytes (slot_mapping holds the slots: no block table).
  const PagedKV<char> cache{static_cast<char*>(k_cache.data_ptr()), static_cast<char*>(v_cache.data_ptr()), nullptr,
                            row_bytes, static_cast<int>(k_cache.size(1)), static_cast<int>(k_cache.size(0))};
  const int64_t ks = k.stride(0) * es, vs = v.stride(0) * es;
  at::parallel_for(0, T, parallel_grain(2 * row_bytes), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t s = slots[t];
      if (s < 0) continue;  // padding; the range was checked above
      std::memcpy(cache.k + cache.row(s), kp + t * ks, row_bytes);
      std::memcpy(cache.v + cache.row(s), vp + t * vs, row_bytes);
    }
  });
}

struct Geometry {
  int64_t B, Hq, Hkv, G, D;
  Geometry(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& block_tables)
      : B(block_tables.size(0)), Hq(q.size(1)), Hkv(k_cache.size(2)), G(Hq / Hkv), D(q.size(2)) {}
};

// Loads the G heads of kv head `kvh` of query token row `q_tok` (scaled, fp32) into rows [r0, r0+G).
// 16-bit dtypes also keep the unscaled rows in `raw` (for the AVX-512 BF16 scan, csrc/cpu/isa/attention_core.h).
template <typename T>
inline void load_q_group(const T* q_tok, int64_t kvh, int64_t G, int64_t D, float scale, float* dst, T* raw) {
  const T* src = q_tok + kvh * G * D;
  for (int64_t i = 0; i < G * D; ++i) dst[i] = to_f(src[i]) * scale;
  if constexpr (!std::is_same_v<T, float>) std::copy(src, src + G * D, raw);
}

// out_row = acc / l (0 for a row that saw no key).
template <typename T>
inline void store_row(T* out, const float* acc, float l, int64_t D) {
  const float inv = OnlineSoftmax::normalizer(l);
  for (int64_t d = 0; d < D; ++d) out[d] = from_f<T>(acc[d] * inv);
}

inline float std_exp(float x) { return std::exp(x); }

// Per-thread state of R query rows and the scan's scratch; scan() streams keys [kbeg, kend) of one
// sequence / kv head through the rows with the per-ISA kernel (csrc/cpu/isa/attention.h), chosen by the
// caller before its parallel region: MK_ISA_CALL(attn_scan).
using ScanFn = void (*)(const AttnScan&);

template <typename T>
struct RowBlock {
  ScanFn kernel;
  int64_t R, D;
  std::vector<float> q, acc, scores, kbuf, vbuf;
  std::vector<OnlineSoftmax> st;
  std::vector<T> raw;
  std::vector<int64_t> lo, hi;
  RowBlock(ScanFn kernel_, int64_t R_, int64_t D_)
      : kernel(kernel_), R(R_), D(D_), q(R_ * D_), acc(R_ * D_), scores(R_ * kAttnScanChunk), kbuf(kAttnScanChunk * D_),
        vbuf(kAttnScanChunk * D_), st(R_), raw(R_ * D_), lo(R_), hi(R_) {}
  void reset() {
    std::fill(acc.begin(), acc.end(), 0.f);
    std::fill(st.begin(), st.end(), OnlineSoftmax{});
  }
  // Scans with the first `rows` ≤ R rows.
  void scan(int64_t rows, const PagedKV<const T>& kv, int64_t kbeg, int64_t kend, float scale) {
    static_assert(sizeof(OnlineSoftmax) == 2 * sizeof(float));
    const AttnScan a{kElem<T>, rows, D, q.data(), std::is_same_v<T, float> ? nullptr : raw.data(), scale, acc.data(),
                     st.data(), lo.data(), hi.data(), kv.k, kv.v, kv.block_table, kv.slot_stride, kv.block_size,
                     kv.num_blocks, kbeg, kend, scores.data(), kbuf.data(), vbuf.data()};
    kernel(a);
  }
};

template <typename T>
void decode_impl(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                 const at::Tensor& block_tables, const at::Tensor& seq_lens, float scale, int64_t window,
                 int64_t part) {
  const Geometry g(q, k_cache, block_tables);
  const PagedCache<T> cache = check::paged_cache_of<T>(k_cache, v_cache, block_tables);
  const int32_t* sl = seq_lens.const_data_ptr<int32_t>();
  const T* qp = q.const_data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int64_t q_stride = q.stride(0);
  int64_t P = 1, max_range = 0;
  for (int64_t b = 0; b < g.B; ++b) {
    const int64_t L = sl[b], lo = first_visible_key(L - 1, window);
    P = std::max(P, ceil_div_i(L - lo, part));
    max_range = std::max(max_range, L - lo);
  }
  // Split-K workspace (P > 1): per (b, kvh, partition) the G rows' softmax states and unnormalised acc.
  std::vector<float> ws_acc;
  std::vector<OnlineSoftmax> ws_st;
  if (P > 1) {
    ws_acc.resize(g.B * g.Hkv * P * g.G * g.D);
    ws_st.resize(g.B * g.Hkv * P * g.G);
  }
  const int64_t items = g.B * g.Hkv * P;
  const ScanFn scan = MK_ISA_CALL(attn_scan);
  // work per item: multiply-adds of a partition's scores (the P·V pass costs as much again)
  at::parallel_for(0, items, parallel_grain(std::min(max_range, part) * g.G * g.D), [&](int64_t i0, int64_t i1) {
    RowBlock<T> rb(scan, g.G, g.D);
    for (int64_t it = i0; it < i1; ++it) {
      const int64_t p = it % P, kvh = (it / P) % g.Hkv, b = it / (P * g.Hkv);
      const int64_t L = sl[b], first = first_visible_key(L - 1, window);
      const int64_t kbeg = first + p * part, kend = std::min(L, kbeg + part);
      rb.reset();
      if (kbeg < kend) {
        std::fill(rb.lo.begin(), rb.lo.end(), first);
        std::fill(rb.hi.begin(), rb.hi.end(), L);
        load_q_group(qp + b * q_stride, kvh, g.G, g.D, scale, rb.q.data(), rb.raw.data());
        rb.scan(g.G, cache.sequence(b, static_cast<int>(kvh), static_cast<int>(g.D)), kbeg, kend, scale);
      }
      if (P == 1) {
        for (int64_t r = 0; r < g.G; ++r)
          store_row(op + b * g.Hq * g.D + (kvh * g.G + r) * g.D, rb.acc.data() + r * g.D, rb.st[r].l, g.D);
      } else {
        const int64_t w = it * g.G;  // == ((b*Hkv + kvh)*P + p) * G
        std::copy(rb.acc.begin(), rb.acc.end(), ws_acc.begin() + w * g.D);
        std::copy(rb.st.begin(), rb.st.end(), ws_st.begin() + w);
      }
    }
  });
  if (P == 1) return;
  // Merge the partitions of each (b, q head) in partition order (OnlineSoftmax's merge rule).
  at::parallel_for(0, g.B * g.Hq, parallel_grain(P * g.D), [&](int64_t i0, int64_t i1) {
    std::vector<float> acc(g.D);
    for (int64_t it = i0; it < i1; ++it) {
      const int64_t b = it / g.Hq, h = it % g.Hq, kvh = h / g.G, r = h % g.G;
      auto idx = [&](int64_t p) { return ((b * g.Hkv + kvh) * P + p) * g.G + r; };
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t p = 0; p < P; ++p) mx = OnlineSoftmax::nan_max(mx, ws_st[idx(p)].m);
      std::fill(acc.begin(), acc.end(), 0.f);
      float l = 0.f;
      for (int64_t p = 0; p < P; ++p) {
        const float w = OnlineSoftmax::weight(ws_st[idx(p)].m, mx, std_exp);
        if (w == 0.f) continue;  // a partition that saw no key
        l += w * ws_st[idx(p)].l;
        const float* part_acc = ws_acc.data() + idx(p) * g.D;
        for (int64_t d = 0; d < g.D; ++d) acc[d] += w * part_acc[d];
      }
      store_row(op + it * g.D, acc.data(), l, g.D);
    }
  });
}

template <typename T>
void prefill_impl(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                  const at::Tensor& block_tables, const at::Tensor& cu_seqlens_q, const at::Tensor& seq_lens,
                  float scale, int64_t window) {
  const Geometry g(q, k_cache, block_tables);
  const PagedCache<T> cache = check::paged_cache_of<T>(k_cache, v_cache, block_tables);
  const int32_t* sl = seq_lens.const_data_ptr<int32_t>();
  const int32_t* cu = cu_seqlens_q.const_data_ptr<int32_t>();
  const T* qp = q.const_data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int64_t q_stride = q.stride(0);
  const int64_t QT = std::max<int64_t>(1, kPrefillRows / g.G);  // query tokens per tile
  // Tiles (b, first query index), each processed for every kv head.
  std::vector<std::pair<int64_t, int64_t>> tiles;
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t i = 0; i < cu[b + 1] - cu[b]; i += QT) tiles.emplace_back(b, i);
  const int64_t items = static_cast<int64_t>(tiles.size()) * g.Hkv;
  const ScanFn scan = MK_ISA_CALL(attn_scan);
  int64_t max_len = 0;
  for (int64_t b = 0; b < g.B; ++b) max_len = std::max<int64_t>(max_len, sl[b]);
  const int64_t keys = window > 0 ? std::min(max_len, window + QT) : max_len;  // upper bound per tile
  // work per item: multiply-adds of a tile's scores
  at::parallel_for(0, items, parallel_grain(QT * g.G * keys * g.D), [&](int64_t i0, int64_t i1) {
    RowBlock<T> rb(scan, QT * g.G, g.D);
    auto& lo = rb.lo;
    auto& hi = rb.hi;
    for (int64_t it = i0; it < i1; ++it) {
      const auto [b, t0] = tiles[it / g.Hkv];
      const int64_t kvh = it % g.Hkv;
      const int64_t qlen = cu[b + 1] - cu[b], L = sl[b];
      const int64_t nq = std::min(QT, qlen - t0), nrows = nq * g.G;
      for (int64_t i = 0; i < nq; ++i) {
        const int64_t pos = L - qlen + t0 + i;
        load_q_group(qp + (cu[b] + t0 + i) * q_stride, kvh, g.G, g.D, scale, rb.q.data() + i * g.G * g.D,
                     rb.raw.data() + i * g.G * g.D);
        std::fill(lo.begin() + i * g.G, lo.begin() + (i + 1) * g.G, first_visible_key(pos, window));
        std::fill(hi.begin() + i * g.G, hi.begin() + (i + 1) * g.G, pos + 1);
      }
      rb.reset();
      rb.scan(nrows, cache.sequence(b, static_cast<int>(kvh), static_cast<int>(g.D)), lo[0], hi[nrows - 1], scale);
      for (int64_t i = 0; i < nq; ++i)
        for (int64_t r = 0; r < g.G; ++r)
          store_row(op + ((cu[b] + t0 + i) * g.Hq + kvh * g.G + r) * g.D, rb.acc.data() + (i * g.G + r) * g.D,
                    rb.st[i * g.G + r].l, g.D);
    }
  });
}

void paged_decode_attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache,
                            const at::Tensor& v_cache, const at::Tensor& block_tables, const at::Tensor& seq_lens,
                            double scale, int64_t sliding_window, int64_t partition_size) {
  constexpr const char* op = "paged_decode_attention";
  require_cpu(op, "q", q);
  check::attention_common_args(op, out, q, k_cache, v_cache, block_tables, seq_lens, scale, kFloatTypes, false);
  check::decode_shape_args(op, q, k_cache, block_tables, seq_lens, sliding_window, partition_size);
  check::paged_indices_cpu(op, k_cache, block_tables, seq_lens, sliding_window);
  if (out.numel() == 0) return;
  const int64_t part = partition_size > 0 ? partition_size : kAutoPartition;
  MK_CPU_DISPATCH(q.scalar_type(), op, [&] {
    decode_impl<scalar_t>(out, q, k_cache, v_cache, block_tables, seq_lens, static_cast<float>(scale),
                          sliding_window, part);
  });
}

void paged_prefill_attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache,
                             const at::Tensor& v_cache, const at::Tensor& block_tables,
                             const at::Tensor& cu_seqlens_q, const at::Tensor& seq_lens, double scale,
                             int64_t sliding_window) {
  constexpr const char* op = "paged_prefill_attention";
  require_cpu(op, "q", q);
  check::attention_common_args(op, out, q, k_cache, v_cache, block_tables, seq_lens, scale, kFloatTypes, false);
  check::prefill_shape_args(op, q, cu_seqlens_q, seq_lens);
  check::prefill_out_args(op, out, cu_seqlens_q);
  check::cu_seqlens_cpu(op, cu_seqlens_q, seq_lens, q.size(0));
  check::paged_indices_cpu(op, k_cache, block_tables, seq_lens, sliding_window, cu_seqlens_q);
  if (out.numel() == 0) return;
  MK_CPU_DISPATCH(q.scalar_type(), op, [&] {
    prefill_impl<scalar_t>(out, q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens,
                           static_cast<float>(scale), sliding_window);
  });
}

}  // namespace
}  // namespace mk::cpu

TORCH_LIBRARY_IMPL(mistral_kernels, CPU, m) { MK_ATTENTION_OPS(MK_IMPL_CPU) }
