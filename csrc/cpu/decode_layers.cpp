// cpu/decode_layers.cpp — decode_layers: the dense decoder layers of one decode step in one native call
// (CPU only, fp32 / bf16 / fp16 x; weights dense or packed; kernel and phases: decode_step.h). This file
// validates the arguments and hands raw pointers to decode_step::run.
//
// Shapes: M decode rows, H hidden, I intermediate, Hq / Hkv heads, D head_dim, R rot_dim, P cos/sin rows,
// N cache blocks, S block size, MB max blocks per sequence, L layers, N_g rows of a part.
//   x, residual [M, H]; per layer: attn_norm [H], qkv [(Hq+2Hkv)·D, H], wo [H, Hq·D], ffn_norm [H],
//   w13 [2I, H], w2 [H, I], k_cache / v_cache [N, S, Hkv, D]; windows [L] (<= 0: none);
//   positions, slot_mapping int64 [M]; block_tables int32 [M, MB]; seq_lens int32 [M]; cos_sin fp32 [P, R].
// The lists qkv, wo, w13, w2 hold *parts*, layer after layer: a dense matrix is one part (x's dtype, the whole
// [N, K]); a packed one is one or more row groups [N_g, ...] in qlinear's formats, rows summing to N.
// qtypes / scales: empty when every part is dense, else one entry per part of qkv, then wo, w13, w2:
// qtypes -1 (dense) or the qlinear format code; scales the fp32 [N_g] of INT8_ROWWISE parts (else None).
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "../checks/attention.h"
#include "../checks/common.h"
#include "../kernels/quant_blocks.h"
#include "common.h"
#include "decode_step.h"

namespace mk::cpu {
namespace {

// check `t` (list `name`, element l): dtype of x, contiguous, the given sizes.
void check_layer_tensor(const char* op, const char* name, int64_t l, const at::Tensor& t, const at::Tensor& x,
                        std::initializer_list<int64_t> sizes) {
  const std::string arg = std::string(name) + "[" + std::to_string(l) + "]";
  check::defined(op, arg.c_str(), t);
  TORCH_CHECK(t.device().is_cpu(), op, ": ", arg, " must be a CPU tensor, got device ", t.device());
  check::same_dtype(op, arg.c_str(), t, "x", x);
  TORCH_CHECK(t.sizes().equals(sizes), op, ": ", arg, " must have shape ", c10::IntArrayRef(sizes), ", got ",
              t.sizes());
  check::contiguous(op, arg.c_str(), t);
}

void check_index(const char* op, const char* arg, const at::Tensor& t, at::ScalarType dtype, int64_t ndim,
                 int64_t rows) {
  check::dtype_is(op, arg, t, dtype);
  TORCH_CHECK(t.device().is_cpu(), op, ": ", arg, " must be a CPU tensor, got device ", t.device());
  check::ndim(op, arg, t, ndim, ndim == 1 ? "[M]" : "[M, max_blocks]");
  check::size_eq(op, arg, t, 0, rows, "M = x.shape[0]");
  check::contiguous(op, arg, t);
}

// The parts of one matrix kind (`name`: qkv, wo, w13 or w2), all layers: layer l's parts follow layer l-1's
// and their rows sum to N; K in features. g0: the index of the list's first part in qtypes / scales. Appends
// each layer's parts to `parts` and their (first part, count) to `ranges`.
struct Kind {
  const char* name;
  at::TensorList list;
  int64_t g0;
};
void parse_parts(const char* op, const Kind& kd, int64_t L, int64_t N, int64_t K, at::IntArrayRef qtypes,
                 const c10::List<std::optional<at::Tensor>>& scales, const at::Tensor& x, bool quantize_x,
                 std::vector<decode_step::Part>& parts, std::vector<std::pair<size_t, int64_t>>& ranges) {
  int64_t j = 0;
  const int64_t n = static_cast<int64_t>(kd.list.size());
  for (int64_t l = 0; l < L; ++l) {
    const size_t first = parts.size();
    for (int64_t rows = 0; rows < N; ++j) {
      TORCH_CHECK(j < n, op, ": ", kd.name, " has ", n, " tensors but attn_norm has ", L,
                  " (the parts of one matrix per layer); layer ", l, " is missing ", N - rows, " of its ", N,
                  " rows");
      const at::Tensor& t = kd.list[j];
      const std::string arg = std::string(kd.name) + "[" + std::to_string(j) + "]";
      const int64_t g = kd.g0 + j;
      const int64_t qt = qtypes.empty() ? decode_step::kDense : qtypes[g];
      const std::optional<at::Tensor> sc = scales.empty() ? std::optional<at::Tensor>() : scales.get(g);
      const bool has_scales = sc.has_value() && sc->defined();
      check::defined(op, arg.c_str(), t);
      TORCH_CHECK(t.device().is_cpu(), op, ": ", arg, " must be a CPU tensor, got device ", t.device());
      decode_step::Part p{static_cast<int32_t>(qt), QPath::fp32, nullptr, nullptr, rows, 0, 0};
      if (qt == decode_step::kDense) {  // a dense matrix: the whole [N, K] in x's dtype
        check::same_dtype(op, arg.c_str(), t, "x", x);
        TORCH_CHECK(rows == 0 && t.dim() == 2 && t.size(0) == N && t.size(1) == K, op, ": ", arg,
                    " must have shape ", c10::IntArrayRef({N, K}), " (layer ", l, "'s whole ", kd.name,
                    ", dense), got ", t.sizes());
        TORCH_CHECK(!has_scales, op, ": scales[", g, "] must be None for the dense ", arg);
        p.rows = N, p.row_bytes = K * t.element_size();
      } else {
        const QFormat f = qformat(static_cast<int32_t>(qt));
        TORCH_CHECK(f.qtype != 0 && qt == f.qtype, op, ": qtypes[", g, "] = ", qt, " (", arg,
                    ") is not -1 (dense) or a qlinear format: Q4_0 (2), Q4_1 (3), Q8_0 (8), Q4_K (12), Q5_K (13), "
                    "Q6_K (14), INT8_ROWWISE (1000)");
        check::ndim(op, arg.c_str(), t, 2, qt == kInt8Rowwise ? "[N_g, K]" : "[N_g, K / QK * bytes per block]");
        TORCH_CHECK(t.size(0) > 0, op, ": ", arg, " has no rows");
        if (qt == kInt8Rowwise) {
          check::dtype_is(op, arg.c_str(), t, at::kChar);
          check::size_eq(op, arg.c_str(), t, 1, K, "K (in features)");
          const std::string sarg = "scales[" + std::to_string(g) + "]";
          TORCH_CHECK(has_scales, op, ": ", sarg, " (fp32 [N_g]) is required for the INT8_ROWWISE ", arg);
          check::dtype_is(op, sarg.c_str(), *sc, at::kFloat);
          TORCH_CHECK(sc->device().is_cpu(), op, ": ", sarg, " must be a CPU tensor, got device ", sc->device());
          check::ndim(op, sarg.c_str(), *sc, 1, "[N_g]");
          check::size_eq(op, sarg.c_str(), *sc, 0, t.size(0), "N_g = rows of the part");
          check::contiguous(op, sarg.c_str(), *sc);
          p.scales = sc->const_data_ptr<float>();
        } else {
          check::dtype_is(op, arg.c_str(), t, at::kByte);
          TORCH_CHECK(K % f.block == 0, op, ": ", arg, " is ", f.name, " but K = ", K, " is not a multiple of ",
                      f.block);
          check::size_eq(op, arg.c_str(), t, 1, K / f.block * f.bytes, "K / QK * bytes per block");
          TORCH_CHECK(!has_scales, op, ": scales[", g, "] must be None for the ", f.name, " ", arg);
          if (x.scalar_type() == at::kBFloat16 || quantize_x)  // fp32 x with quantize_x: as bf16 x
            p.path = static_cast<QPath>(MK_ISA_CALL(quant_bf16_path)(static_cast<int32_t>(qt)));
        }
        TORCH_CHECK(rows + t.size(0) <= N, op, ": the parts of layer ", l, "'s ", kd.name, " have more than its ",
                    N, " rows (", arg, " ends at row ", rows + t.size(0), ")");
        p.rows = t.size(0), p.row_bytes = t.size(1) * t.element_size();
      }
      check::contiguous(op, arg.c_str(), t);
      p.w = t.const_data_ptr();
      parts.push_back(p);
      rows += p.rows;
    }
    ranges.emplace_back(first, static_cast<int64_t>(parts.size() - first));
  }
  TORCH_CHECK(j == n, op, ": ", kd.name, " has ", n, " tensors but its ", L, " layers use ", j,
              " (one dense matrix or the packed parts of one, per layer)");
}

constexpr int64_t kMaxHeads = 1 << 16;  // query heads (the largest models have a few hundred)

// Written tensors (x, residual, every k_cache / v_cache) own their bytes: pairwise disjoint, and no read tensor
// (norms, matrix parts, scales) lies in any of them — the layers run in one call, so a weight in x's memory
// would be overwritten before it is read. All are contiguous: byte intervals, checked sorted, O(n log n).
struct Span {
  std::string name;
  uintptr_t lo, hi;
};
void push_span(std::vector<Span>& v, std::string name, const at::Tensor& t) {
  if (!t.defined() || t.numel() == 0) return;
  const auto lo = reinterpret_cast<uintptr_t>(t.const_data_ptr());
  v.push_back({std::move(name), lo, lo + static_cast<uintptr_t>(t.numel() * t.element_size())});
}
void check_disjoint(const char* op, std::vector<Span> written, const std::vector<Span>& read) {
  std::sort(written.begin(), written.end(), [](const Span& a, const Span& b) { return a.lo < b.lo; });
  for (size_t i = 1; i < written.size(); ++i)
    TORCH_CHECK(written[i].lo >= written[i - 1].hi, op, ": ", written[i].name,
                " is written by this op but shares memory with ", written[i - 1].name,
                "; pass separate tensors (each layer's caches and x / residual need memory of their own)");
  for (const Span& r : read) {
    auto it = std::upper_bound(written.begin(), written.end(), r.lo,
                               [](uintptr_t lo, const Span& w) { return lo < w.lo; });  // first w with lo > r.lo
    const Span* w = nullptr;
    if (it != written.end() && it->lo < r.hi)
      w = &*it;
    else if (it != written.begin() && std::prev(it)->hi > r.lo)
      w = &*std::prev(it);
    TORCH_CHECK(w == nullptr, op, ": ", w->name, " is written by this op but shares memory with ", r.name,
                "; pass separate tensors");
  }
}

// Rows attend in parallel, each right after writing its own key / value, where the per-op path writes every
// row's before any row attends: that is the same when no row reads a block another row writes (with any of
// the layers' windows) — the engine's plain decode steps (a sequence writes only into its own last block;
// shared prefix blocks are full and read-only). Returns whether some row does read another's written block
// (speculative decoding's verify rows): then the step writes every row's key / value first
// (decode_step::Index::write_first). Two rows writing one slot is an error.
bool check_written_slots(const char* op, const at::Tensor& slot_mapping, const at::Tensor& block_tables,
                         const at::Tensor& seq_lens, int64_t S, at::IntArrayRef windows) {
  const int64_t M = slot_mapping.size(0), MB = block_tables.size(1);
  const int64_t* slot = slot_mapping.const_data_ptr<int64_t>();
  const int32_t* bt = block_tables.const_data_ptr<int32_t>();
  const int32_t* sl = seq_lens.const_data_ptr<int32_t>();
  bool shared = false;
  for (int64_t m = 0; m < M; ++m) {
    if (slot[m] < 0) continue;
    const int64_t block = slot[m] / S;
    for (int64_t o = 0; o < M; ++o) {
      if (o == m) continue;
      TORCH_CHECK(o > m || slot[o] != slot[m], op, ": slot_mapping[", o, "] and slot_mapping[", m, "] are both ",
                  slot[m], "; each row writes a slot of its own");
      if (sl[o] <= 0) continue;
      int64_t first = sl[o] - 1;
      for (int64_t w : windows) first = std::min(first, first_visible_key(sl[o] - 1, w));
      for (int64_t j = first / S; j <= (sl[o] - 1) / S && j < MB; ++j) shared |= bt[o * MB + j] == block;
    }
  }
  return shared;
}

// In features of w2 (= I): the K of its first part (dense [H, I]; INT8_ROWWISE [N_g, I]; blocks [N_g, R]).
int64_t intermediate(const char* op, const at::Tensor& w2, int64_t qt) {
  TORCH_CHECK(w2.dim() == 2, op, ": w2[0] must be 2-D, got shape ", w2.sizes());
  if (qt == decode_step::kDense || qt == kInt8Rowwise) return w2.size(1);
  const QFormat f = qformat(static_cast<int32_t>(qt));
  TORCH_CHECK(f.qtype != 0 && qt == f.qtype && w2.size(1) % f.bytes == 0, op, ": w2[0] is not a packed row group of ",
              "format ", qt);
  return w2.size(1) / f.bytes * f.block;
}

void decode_layers(at::Tensor& x, at::Tensor& residual, at::TensorList attn_norm, at::TensorList qkv,
                   at::TensorList wo, at::TensorList ffn_norm, at::TensorList w13, at::TensorList w2,
                   at::TensorList k_cache, at::TensorList v_cache, at::IntArrayRef windows,
                   const at::Tensor& positions, const at::Tensor& slot_mapping, const at::Tensor& block_tables,
                   const at::Tensor& seq_lens, const at::Tensor& cos_sin, int64_t n_heads, double eps,
                   double scale, bool is_neox, at::IntArrayRef qtypes,
                   const c10::List<std::optional<at::Tensor>>& scales, bool quantize_x) {
  constexpr const char* op = "decode_layers";
  require_cpu(op, "x", x);
  check::dtype_in(op, "x", x, kFloatTypes);
  check::ndim(op, "x", x, 2, "[M, H]");
  check::contiguous(op, "x", x);
  TORCH_CHECK(!quantize_x || x.scalar_type() != at::kHalf, op,
              ": quantize_x needs fp32 or bf16 x (fp16 x runs the exact path); pass quantize_x=False");
  require_cpu(op, "residual", residual);
  check::same_dtype(op, "residual", residual, "x", x);
  TORCH_CHECK(residual.sizes() == x.sizes(), op, ": residual must have the shape of x ", x.sizes(), ", got ",
              residual.sizes());
  check::contiguous(op, "residual", residual);
  check::no_overlap(op, "residual", residual, {{"x", &x}});
  const int64_t M = x.size(0), H = x.size(1), L = static_cast<int64_t>(attn_norm.size());
  TORCH_CHECK(M <= kGemvMaxM, op, ": x.shape[0] (M, decode rows) must be <= ", kGemvMaxM, ", got ", M);
  for (const auto& [name, list] : {std::pair<const char*, at::TensorList>{"ffn_norm", ffn_norm},
                                   {"k_cache", k_cache}, {"v_cache", v_cache}})
    TORCH_CHECK(static_cast<int64_t>(list.size()) == L, op, ": ", name, " has ", list.size(),
                " tensors but attn_norm has ", L, " (one per layer)");
  if (qtypes.empty()) {  // all dense: one matrix per layer
    for (const auto& [name, list] : {std::pair<const char*, at::TensorList>{"qkv", qkv}, {"wo", wo},
                                     {"w13", w13}, {"w2", w2}})
      TORCH_CHECK(static_cast<int64_t>(list.size()) == L, op, ": ", name, " has ", list.size(),
                  " tensors but attn_norm has ", L, " (one per layer)");
  }
  const int64_t nparts = static_cast<int64_t>(qkv.size() + wo.size() + w13.size() + w2.size());
  TORCH_CHECK(qtypes.empty() || static_cast<int64_t>(qtypes.size()) == nparts, op, ": qtypes has ", qtypes.size(),
              " entries; need one per part of qkv, wo, w13, w2 (", nparts, ") or none (all dense)");
  TORCH_CHECK(scales.empty() || static_cast<int64_t>(scales.size()) == nparts, op, ": scales has ", scales.size(),
              " entries; need one per part of qkv, wo, w13, w2 (", nparts, ") or none");
  TORCH_CHECK(static_cast<int64_t>(windows.size()) == L, op, ": windows has ", windows.size(),
              " entries but attn_norm has ", L, " (one per layer)");
  check_index(op, "positions", positions, at::kLong, 1, M);
  check_index(op, "slot_mapping", slot_mapping, at::kLong, 1, M);
  check_index(op, "block_tables", block_tables, at::kInt, 2, M);
  check_index(op, "seq_lens", seq_lens, at::kInt, 1, M);
  check::dtype_is(op, "cos_sin", cos_sin, at::kFloat);
  TORCH_CHECK(cos_sin.device().is_cpu(), op, ": cos_sin must be a CPU tensor, got device ", cos_sin.device());
  check::ndim(op, "cos_sin", cos_sin, 2, "[P, R]");
  check::contiguous(op, "cos_sin", cos_sin);
  if (M == 0 || L == 0) return;
  check::ndim(op, "k_cache[0]", k_cache[0], 4, "[N, S, Hkv, D]");
  const int64_t N = k_cache[0].size(0), S = k_cache[0].size(1), Hkv = k_cache[0].size(2), D = k_cache[0].size(3);
  TORCH_CHECK(S > 0 && Hkv > 0 && D > 0, op, ": k_cache[0] must have S, Hkv, D > 0, got shape ", k_cache[0].sizes());
  TORCH_CHECK(n_heads > 0 && n_heads % Hkv == 0, op, ": n_heads must be a positive multiple of Hkv = ", Hkv,
              " (k_cache[0].shape[2]), got ", n_heads);
  // Before any product with it: (n_heads + 2·Hkv)·D sizes qkv's rows (a larger n_heads would overflow int64).
  TORCH_CHECK(n_heads <= kMaxHeads, op, ": n_heads must be at most ", kMaxHeads, ", got ", n_heads);
  const int64_t R = cos_sin.size(1);
  TORCH_CHECK(R % 2 == 0 && R <= D, op, ": cos_sin.shape[1] (rot_dim) must be even and <= head_dim ", D, ", got ", R);
  TORCH_CHECK(!w2.empty(), op, ": w2 is empty but attn_norm has ", L, " layers");
  const int64_t g_w13 = static_cast<int64_t>(qkv.size() + wo.size()), g_w2 = g_w13 + static_cast<int64_t>(w13.size());
  const int64_t I = intermediate(op, w2[0], qtypes.empty() ? decode_step::kDense : qtypes[g_w2]);
  TORCH_CHECK(I > 0, op, ": w2[0] must be [H, I] with I > 0, got shape ", w2[0].sizes());
  const int64_t Nqkv = (n_heads + 2 * Hkv) * D;
  for (int64_t l = 0; l < L; ++l) {
    check_layer_tensor(op, "attn_norm", l, attn_norm[l], x, {H});
    check_layer_tensor(op, "ffn_norm", l, ffn_norm[l], x, {H});
    check_layer_tensor(op, "k_cache", l, k_cache[l], x, {N, S, Hkv, D});
    check_layer_tensor(op, "v_cache", l, v_cache[l], x, {N, S, Hkv, D});
  }
  // the parts of every matrix; ranges[k][l]: (first part, count) of kind k in layer l
  std::vector<decode_step::Part> parts;
  std::vector<std::pair<size_t, int64_t>> ranges[4];
  const Kind kinds[4] = {{"qkv", qkv, 0}, {"wo", wo, static_cast<int64_t>(qkv.size())}, {"w13", w13, g_w13},
                         {"w2", w2, g_w2}};
  const int64_t shapes[4][2] = {{Nqkv, H}, {H, n_heads * D}, {2 * I, H}, {H, I}};
  for (int k = 0; k < 4; ++k)
    parse_parts(op, kinds[k], L, shapes[k][0], shapes[k][1], qtypes, scales, x, quantize_x, parts, ranges[k]);
  check::index_range_cpu<int64_t>(op, "positions", positions, 0, cos_sin.size(0), "rows of cos_sin");
  check::index_range_cpu<int64_t>(op, "slot_mapping", slot_mapping, -1, N * S, "-1 or a slot < N·S of k_cache");
  for (int64_t w : std::set<int64_t>(windows.begin(), windows.end()))
    check::paged_indices_cpu(op, k_cache[0], block_tables, seq_lens, w);
  const bool write_first = check_written_slots(op, slot_mapping, block_tables, seq_lens, S, windows);
  {
    std::vector<Span> written, read;
    push_span(written, "x", x);
    push_span(written, "residual", residual);
    for (int64_t l = 0; l < L; ++l) {
      const std::string at = "[" + std::to_string(l) + "]";
      push_span(written, "k_cache" + at, k_cache[l]);
      push_span(written, "v_cache" + at, v_cache[l]);
      push_span(read, "attn_norm" + at, attn_norm[l]);
      push_span(read, "ffn_norm" + at, ffn_norm[l]);
    }
    for (const Kind& kd : kinds)
      for (size_t j = 0; j < kd.list.size(); ++j) {
        push_span(read, std::string(kd.name) + "[" + std::to_string(j) + "]", kd.list[j]);
        const int64_t g = kd.g0 + static_cast<int64_t>(j);
        if (!scales.empty() && scales.get(g).has_value())
          push_span(read, "scales[" + std::to_string(g) + "]", *scales.get(g));
      }
    for (const auto& [name, t] : {std::pair<const char*, const at::Tensor*>{"positions", &positions},
                                  {"slot_mapping", &slot_mapping}, {"block_tables", &block_tables},
                                  {"seq_lens", &seq_lens}, {"cos_sin", &cos_sin}})
      push_span(read, name, *t);
    check_disjoint(op, std::move(written), read);
  }
  const int32_t* sl = seq_lens.const_data_ptr<int32_t>();
  const int64_t* pos = positions.const_data_ptr<int64_t>();
  for (int64_t m = 0; m < M; ++m)
    TORCH_CHECK(sl[m] == 0 || pos[m] == sl[m] - 1, op, ": row ", m, " decodes position ", pos[m],
                " but seq_lens[", m, "]=", sl[m], " (a decode row's position is seq_lens - 1; 0 = padding)");

  const decode_step::Shape shape{M, H, I, n_heads, Hkv, D, R, S, N, block_tables.size(1),
                                 static_cast<float>(eps), static_cast<float>(scale), is_neox};
  const decode_step::Index index{pos, slot_mapping.const_data_ptr<int64_t>(), block_tables.const_data_ptr<int32_t>(),
                                 sl, cos_sin.const_data_ptr<float>(), write_first};
  auto mat = [&](int k, int64_t l) {
    return decode_step::Mat{parts.data() + ranges[k][l].first, ranges[k][l].second};
  };
  MK_CPU_DISPATCH(x.scalar_type(), op, [&] {
    std::vector<decode_step::Layer<scalar_t>> layers(L);
    for (int64_t l = 0; l < L; ++l)
      layers[l] = {attn_norm[l].const_data_ptr<scalar_t>(), mat(0, l), mat(1, l), ffn_norm[l].const_data_ptr<scalar_t>(),
                   mat(2, l), mat(3, l), k_cache[l].data_ptr<scalar_t>(), v_cache[l].data_ptr<scalar_t>(), windows[l]};
    decode_step::run<scalar_t>(shape, index, layers.data(), L, x.data_ptr<scalar_t>(),
                               residual.data_ptr<scalar_t>(), static_cast<int>(at::get_num_threads()));
  });
}

}  // namespace
}  // namespace mk::cpu

// CPU only (csrc/registration.cpp kCpuOnlySchemas).
TORCH_LIBRARY_IMPL(mistral_kernels, CPU, m) { MK_IMPL_CPU(decode_layers) }
