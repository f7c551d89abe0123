// cpu/decode_layers.cpp — decode_layers: the dense decoder layers of one decode step in one native call
// (CPU only, fp32 / bf16; kernel and phases: decode_step.h). This file validates the arguments and
// hands raw pointers to decode_step::run.
//
// Shapes: M decode rows, H hidden, I intermediate, Hq / Hkv heads, D head_dim, R rot_dim, P cos/sin rows,
// N cache blocks, S block size, MB max blocks per sequence, L layers.
//   x, residual [M, H]; per layer: attn_norm [H], qkv [(Hq+2Hkv)·D, H], wo [H, Hq·D], ffn_norm [H],
//   w13 [2I, H], w2 [H, I], k_cache / v_cache [N, S, Hkv, D]; windows [L] (<= 0: none);
//   positions, slot_mapping int64 [M]; block_tables int32 [M, MB]; seq_lens int32 [M]; cos_sin fp32 [P, R].
#include <torch/library.h>

#include <set>
#include <string>

#include "../checks/attention.h"
#include "../checks/common.h"
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

void decode_layers(at::Tensor& x, at::Tensor& residual, at::TensorList attn_norm, at::TensorList qkv,
                   at::TensorList wo, at::TensorList ffn_norm, at::TensorList w13, at::TensorList w2,
                   at::TensorList k_cache, at::TensorList v_cache, at::IntArrayRef windows,
                   const at::Tensor& positions, const at::Tensor& slot_mapping, const at::Tensor& block_tables,
                   const at::Tensor& seq_lens, const at::Tensor& cos_sin, int64_t n_heads, double eps,
                   double scale, bool is_neox) {
  constexpr const char* op = "decode_layers";
  require_cpu(op, "x", x);
  check::dtype_in(op, "x", x, kFloatTypes);
  check::ndim(op, "x", x, 2, "[M, H]");
  check::contiguous(op, "x", x);
  require_cpu(op, "residual", residual);
  check::same_dtype(op, "residual", residual, "x", x);
  TORCH_CHECK(residual.sizes() == x.sizes(), op, ": residual must have the shape of x ", x.sizes(), ", got ",
              residual.sizes());
  check::contiguous(op, "residual", residual);
  check::no_overlap(op, "residual", residual, {{"x", &x}});
  const int64_t M = x.size(0), H = x.size(1), L = static_cast<int64_t>(qkv.size());
  TORCH_CHECK(M <= kGemvMaxM, op, ": x.shape[0] (M, decode rows) must be <= ", kGemvMaxM, ", got ", M);
  for (const auto& [name, list] : {std::pair<const char*, at::TensorList>{"attn_norm", attn_norm}, {"wo", wo},
                                   {"ffn_norm", ffn_norm}, {"w13", w13}, {"w2", w2}, {"k_cache", k_cache},
                                   {"v_cache", v_cache}})
    TORCH_CHECK(static_cast<int64_t>(list.size()) == L, op, ": ", name, " has ", list.size(),
                " tensors but qkv has ", L, " (one per layer)");
  TORCH_CHECK(static_cast<int64_t>(windows.size()) == L, op, ": windows has ", windows.size(),
              " entries but qkv has ", L, " (one per layer)");
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
  const int64_t R = cos_sin.size(1);
  TORCH_CHECK(R % 2 == 0 && R <= D, op, ": cos_sin.shape[1] (rot_dim) must be even and <= head_dim ", D, ", got ", R);
  const int64_t I2 = w13[0].dim() == 2 ? w13[0].size(0) : -1;
  TORCH_CHECK(I2 > 0 && I2 % 2 == 0, op, ": w13[0] must be [2I, H] with I > 0, got shape ", w13[0].sizes());
  const int64_t I = I2 / 2, Nqkv = (n_heads + 2 * Hkv) * D;
  for (int64_t l = 0; l < L; ++l) {
    check_layer_tensor(op, "attn_norm", l, attn_norm[l], x, {H});
    check_layer_tensor(op, "qkv", l, qkv[l], x, {Nqkv, H});
    check_layer_tensor(op, "wo", l, wo[l], x, {H, n_heads * D});
    check_layer_tensor(op, "ffn_norm", l, ffn_norm[l], x, {H});
    check_layer_tensor(op, "w13", l, w13[l], x, {2 * I, H});
    check_layer_tensor(op, "w2", l, w2[l], x, {H, I});
    check_layer_tensor(op, "k_cache", l, k_cache[l], x, {N, S, Hkv, D});
    check_layer_tensor(op, "v_cache", l, v_cache[l], x, {N, S, Hkv, D});
    for (const auto* t : {&k_cache[l], &v_cache[l]})
      check::no_overlap(op, "k_cache/v_cache", *t, {{"x", &x}, {"residual", &residual}});
  }
  check::index_range_cpu<int64_t>(op, "positions", positions, 0, cos_sin.size(0), "rows of cos_sin");
  check::index_range_cpu<int64_t>(op, "slot_mapping", slot_mapping, -1, N * S, "-1 or a slot < N·S of k_cache");
  for (int64_t w : std::set<int64_t>(windows.begin(), windows.end()))
    check::paged_indices_cpu(op, k_cache[0], block_tables, seq_lens, w);
  const int32_t* sl = seq_lens.const_data_ptr<int32_t>();
  const int64_t* pos = positions.const_data_ptr<int64_t>();
  for (int64_t m = 0; m < M; ++m)
    TORCH_CHECK(sl[m] == 0 || pos[m] == sl[m] - 1, op, ": row ", m, " decodes position ", pos[m],
                " but seq_lens[", m, "]=", sl[m], " (a decode row's position is seq_lens - 1; 0 = padding)");

  const decode_step::Shape shape{M, H, I, n_heads, Hkv, D, R, S, N, block_tables.size(1),
                                 static_cast<float>(eps), static_cast<float>(scale), is_neox};
  const decode_step::Index index{pos, slot_mapping.const_data_ptr<int64_t>(), block_tables.const_data_ptr<int32_t>(),
                                 sl, cos_sin.const_data_ptr<float>()};
  MK_CPU_DISPATCH(x.scalar_type(), op, [&] {
    std::vector<decode_step::Layer<scalar_t>> layers(L);
    for (int64_t l = 0; l < L; ++l)
      layers[l] = {attn_norm[l].const_data_ptr<scalar_t>(), qkv[l].const_data_ptr<scalar_t>(),
                   wo[l].const_data_ptr<scalar_t>(),        ffn_norm[l].const_data_ptr<scalar_t>(),
                   w13[l].const_data_ptr<scalar_t>(),       w2[l].const_data_ptr<scalar_t>(),
                   k_cache[l].data_ptr<scalar_t>(),         v_cache[l].data_ptr<scalar_t>(),
                   windows[l]};
    decode_step::run<scalar_t>(shape, index, layers.data(), L, x.data_ptr<scalar_t>(),
                               residual.data_ptr<scalar_t>(), static_cast<int>(at::get_num_threads()));
  });
}

}  // namespace
}  // namespace mk::cpu

// CPU only (csrc/registration.cpp kCpuOnlySchemas).
TORCH_LIBRARY_IMPL(mistral_kernels, CPU, m) { MK_IMPL_CPU(decode_layers) }
