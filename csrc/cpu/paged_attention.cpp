// cpu/paged_attention.cpp — native CPU paged_decode_attention and paged_prefill_attention (fp32, bf16).
//
// Shapes: B sequences, Tq packed query tokens, Hq / Hkv heads, G = Hq/Hkv (GQA group), D head_dim,
// N num_blocks, S block_size, M max_blocks, P split-K partitions.
// Semantics (DESIGN.md §3): a query at position p sees keys j with max(0, p-W+1) ≤ j ≤ p (W = sliding
// window, ≤ 0 = none); decode queries sit at seq_lens[b]-1; prefill's q_b new tokens are the last q_b
// positions of sequence b. Rows that see no key produce 0.
//
// Work split: parallel over (sequence, kv head[, partition / query tile]); the G q heads of one kv
// head are processed together, so each K/V row is converted and read once per group (attention_core.h).
// Decode split-K: the visible keys of a sequence are cut into partitions of `partition_size` keys
// (auto: 1024) counted from the first visible key; partial (m, l, acc) states are merged in partition
// order afterwards. Partition boundaries depend only on the inputs, never on the thread count, so the
// result is bit-identical run to run.
#include <torch/library.h>

#include "../checks/attention.h"
#include "attention_core.h"
#include "common.h"

namespace mk::cpu {
namespace {

constexpr int64_t kAutoPartition = 1024;  // keys per split-K partition when the caller passes 0
constexpr int64_t kPrefillRows = 32;      // target query rows (tokens × group heads) per prefill tile

inline int64_t ceil_div_i(int64_t a, int64_t b) { return a <= 0 ? 0 : (a + b - 1) / b; }

// Items per parallel task so that a task does at least ~64k multiply-adds: tiny problems (short
// contexts, small models) run inline instead of paying a parallel region per layer.
inline int64_t grain_for(int64_t work_per_item) {
  constexpr int64_t kMinTaskWork = int64_t{1} << 16;
  return std::max<int64_t>(1, kMinTaskWork / std::max<int64_t>(1, work_per_item));
}

struct Geometry {
  int64_t B, Hq, Hkv, G, D, S, M, key_stride;
  Geometry(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& block_tables)
      : B(block_tables.size(0)), Hq(q.size(1)), Hkv(k_cache.size(2)), G(Hq / Hkv), D(q.size(2)),
        S(k_cache.size(1)), M(block_tables.size(1)), key_stride(Hkv * D) {}
};

// Loads the G heads of kv head `kvh` of query token row `q_tok` (scaled, fp32) into rows [r0, r0+G).
// bf16 also keeps the unscaled rows in `raw` (for the AVX-512 BF16 scan, attention_core.h).
template <typename T>
inline void load_q_group(const T* q_tok, int64_t kvh, int64_t G, int64_t D, float scale, float* dst, T* raw) {
  const T* src = q_tok + kvh * G * D;
  for (int64_t i = 0; i < G * D; ++i) dst[i] = to_f(src[i]) * scale;
  if constexpr (std::is_same_v<T, c10::BFloat16>) std::copy(src, src + G * D, raw);
}

// Points rows.qb at the raw bf16 rows (fp32 caches: none).
template <typename T>
inline void attach_raw_q(attn::Rows& rows, const std::vector<T>& raw, float scale) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    rows.qb = raw.data();
    rows.qscale = scale;
  }
}

template <typename T>
void decode_impl(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                 const at::Tensor& block_tables, const at::Tensor& seq_lens, float scale, int64_t window,
                 int64_t part) {
  const Geometry g(q, k_cache, block_tables);
  const int32_t* sl = seq_lens.const_data_ptr<int32_t>();
  const int32_t* bt = block_tables.const_data_ptr<int32_t>();
  const T* qp = q.const_data_ptr<T>();
  const T* kc = k_cache.const_data_ptr<T>();
  const T* vc = v_cache.const_data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int64_t q_stride = q.stride(0);
  int64_t P = 1, max_range = 0;
  for (int64_t b = 0; b < g.B; ++b) {
    const int64_t L = sl[b], lo = check::first_visible_key(L - 1, window);
    P = std::max(P, ceil_div_i(L - lo, part));
    max_range = std::max(max_range, L - lo);
  }
  // Split-K workspace (P > 1): per (b, kvh, partition) the G rows' m, l and unnormalised acc.
  std::vector<float> ws_acc, ws_m, ws_l;
  if (P > 1) {
    ws_acc.resize(g.B * g.Hkv * P * g.G * g.D);
    ws_m.resize(g.B * g.Hkv * P * g.G);
    ws_l.resize(g.B * g.Hkv * P * g.G);
  }
  const int64_t items = g.B * g.Hkv * P;
  at::parallel_for(0, items, grain_for(std::min(max_range, part) * g.G * g.D), [&](int64_t i0, int64_t i1) {
    attn::Scratch sc;
    sc.reserve(g.G, g.D);
    std::vector<float> qbuf(g.G * g.D), acc(g.G * g.D), m(g.G), l(g.G);
    std::vector<T> qraw(g.G * g.D);
    std::vector<int64_t> lo(g.G), hi(g.G);
    for (int64_t it = i0; it < i1; ++it) {
      const int64_t p = it % P, kvh = (it / P) % g.Hkv, b = it / (P * g.Hkv);
      const int64_t L = sl[b], first = check::first_visible_key(L - 1, window);
      const int64_t kbeg = first + p * part, kend = std::min(L, kbeg + part);
      attn::Rows rows{g.G, g.D, qbuf.data(), acc.data(), m.data(), l.data(), lo.data(), hi.data()};
      attach_raw_q(rows, qraw, scale);
      rows.reset();
      if (kbeg < kend) {
        std::fill(lo.begin(), lo.end(), first);
        std::fill(hi.begin(), hi.end(), L);
        load_q_group(qp + b * q_stride, kvh, g.G, g.D, scale, qbuf.data(), qraw.data());
        attn::scan_keys(rows, kc + kvh * g.D, vc + kvh * g.D, bt + b * g.M, g.S, g.key_stride, kbeg, kend, sc);
      }
      if (P == 1) {
        for (int64_t r = 0; r < g.G; ++r)
          attn::store_row(op + b * g.Hq * g.D + (kvh * g.G + r) * g.D, acc.data() + r * g.D, l[r], g.D);
      } else {
        const int64_t w = it * g.G;  // == ((b*Hkv + kvh)*P + p) * G
        std::copy(acc.begin(), acc.end(), ws_acc.begin() + w * g.D);
        std::copy(m.begin(), m.end(), ws_m.begin() + w);
        std::copy(l.begin(), l.end(), ws_l.begin() + w);
      }
    }
  });
  if (P == 1) return;
  // Merge the partitions of each (b, q head) in partition order.
  at::parallel_for(0, g.B * g.Hq, grain_for(P * g.D), [&](int64_t i0, int64_t i1) {
    std::vector<float> acc(g.D);
    for (int64_t it = i0; it < i1; ++it) {
      const int64_t b = it / g.Hq, h = it % g.Hq, kvh = h / g.G, r = h % g.G;
      auto idx = [&](int64_t p) { return ((b * g.Hkv + kvh) * P + p) * g.G + r; };
      float mx = attn::kNegInf;
      for (int64_t p = 0; p < P; ++p) mx = std::max(mx, ws_m[idx(p)]);
      std::fill(acc.begin(), acc.end(), 0.f);
      float l = 0.f;
      if (mx != attn::kNegInf) {
        for (int64_t p = 0; p < P; ++p) {
          if (ws_l[idx(p)] == 0.f) continue;
          const float w = std::exp(ws_m[idx(p)] - mx);
          l += w * ws_l[idx(p)];
          attn::axpy(acc.data(), w, ws_acc.data() + idx(p) * g.D, g.D);
        }
      }
      attn::store_row(op + it * g.D, acc.data(), l, g.D);
    }
  });
}

template <typename T>
void prefill_impl(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                  const at::Tensor& block_tables, const at::Tensor& cu_seqlens_q, const at::Tensor& seq_lens,
                  float scale, int64_t window) {
  const Geometry g(q, k_cache, block_tables);
  const int32_t* sl = seq_lens.const_data_ptr<int32_t>();
  const int32_t* cu = cu_seqlens_q.const_data_ptr<int32_t>();
  const int32_t* bt = block_tables.const_data_ptr<int32_t>();
  const T* qp = q.const_data_ptr<T>();
  const T* kc = k_cache.const_data_ptr<T>();
  const T* vc = v_cache.const_data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int64_t q_stride = q.stride(0);
  const int64_t QT = std::max<int64_t>(1, kPrefillRows / g.G);  // query tokens per tile
  // Tiles (b, first query index), each processed for every kv head.
  std::vector<std::pair<int64_t, int64_t>> tiles;
  for (int64_t b = 0; b < g.B; ++b)
    for (int64_t i = 0; i < cu[b + 1] - cu[b]; i += QT) tiles.emplace_back(b, i);
  const int64_t items = static_cast<int64_t>(tiles.size()) * g.Hkv;
  int64_t max_len = 0;
  for (int64_t b = 0; b < g.B; ++b) max_len = std::max<int64_t>(max_len, sl[b]);
  const int64_t keys = window > 0 ? std::min(max_len, window + QT) : max_len;  // upper bound per tile
  at::parallel_for(0, items, grain_for(QT * g.G * keys * g.D), [&](int64_t i0, int64_t i1) {
    const int64_t R = QT * g.G;
    attn::Scratch sc;
    sc.reserve(R, g.D);
    std::vector<float> qbuf(R * g.D), acc(R * g.D), m(R), l(R);
    std::vector<T> qraw(R * g.D);
    std::vector<int64_t> lo(R), hi(R);
    for (int64_t it = i0; it < i1; ++it) {
      const auto [b, t0] = tiles[it / g.Hkv];
      const int64_t kvh = it % g.Hkv;
      const int64_t qlen = cu[b + 1] - cu[b], L = sl[b];
      const int64_t nq = std::min(QT, qlen - t0), nrows = nq * g.G;
      for (int64_t i = 0; i < nq; ++i) {
        const int64_t pos = L - qlen + t0 + i;
        load_q_group(qp + (cu[b] + t0 + i) * q_stride, kvh, g.G, g.D, scale, qbuf.data() + i * g.G * g.D,
                     qraw.data() + i * g.G * g.D);
        std::fill(lo.begin() + i * g.G, lo.begin() + (i + 1) * g.G, check::first_visible_key(pos, window));
        std::fill(hi.begin() + i * g.G, hi.begin() + (i + 1) * g.G, pos + 1);
      }
      attn::Rows rows{nrows, g.D, qbuf.data(), acc.data(), m.data(), l.data(), lo.data(), hi.data()};
      attach_raw_q(rows, qraw, scale);
      rows.reset();
      attn::scan_keys(rows, kc + kvh * g.D, vc + kvh * g.D, bt + b * g.M, g.S, g.key_stride, lo[0],
                      hi[nrows - 1], sc);
      for (int64_t i = 0; i < nq; ++i)
        for (int64_t r = 0; r < g.G; ++r)
          attn::store_row(op + ((cu[b] + t0 + i) * g.Hq + kvh * g.G + r) * g.D, acc.data() + (i * g.G + r) * g.D,
                          l[i * g.G + r], g.D);
    }
  });
}

void paged_decode_attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache,
                            const at::Tensor& v_cache, const at::Tensor& block_tables, const at::Tensor& seq_lens,
                            double scale, int64_t sliding_window, int64_t partition_size) {
  constexpr const char* op = "paged_decode_attention";
  require_cpu(op, "q", q);
  check::attention_common_args(op, out, q, k_cache, v_cache, block_tables, seq_lens, scale, kFloatTypes, false);
  TORCH_CHECK(partition_size >= 0, op, ": partition_size must be >= 0 (0 = automatic), got ", partition_size);
  const int64_t B = seq_lens.size(0);
  std::vector<int64_t> first(B);
  const int32_t* sl = seq_lens.const_data_ptr<int32_t>();
  for (int64_t b = 0; b < B; ++b) first[b] = check::first_visible_key(sl[b] - 1, sliding_window);
  check::paged_indices_cpu(op, k_cache, block_tables, seq_lens, first.data());
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
  check::cu_seqlens_cpu(op, cu_seqlens_q, seq_lens, q.size(0));
  const int64_t B = seq_lens.size(0);
  std::vector<int64_t> first(B);
  const int32_t* sl = seq_lens.const_data_ptr<int32_t>();
  const int32_t* cu = cu_seqlens_q.const_data_ptr<int32_t>();
  for (int64_t b = 0; b < B; ++b)
    first[b] = check::first_visible_key(sl[b] - (cu[b + 1] - cu[b]), sliding_window);
  check::paged_indices_cpu(op, k_cache, block_tables, seq_lens, first.data());
  if (out.numel() == 0) return;
  MK_CPU_DISPATCH(q.scalar_type(), op, [&] {
    prefill_impl<scalar_t>(out, q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens,
                           static_cast<float>(scale), sliding_window);
  });
}

}  // namespace
}  // namespace mk::cpu

TORCH_LIBRARY_IMPL(mistral_kernels, CPU, m) {
  m.impl("paged_decode_attention", &mk::cpu::paged_decode_attention);
  m.impl("paged_prefill_attention", &mk::cpu::paged_prefill_attention);
}
