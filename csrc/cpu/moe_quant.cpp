// cpu/moe_quant.cpp — native CPU moe_qgemm (MK_MOE_QUANT_OPS, csrc/checks/moe_quant.h): the expert projections
// of a MoE layer on packed expert stacks, every expert in ONE parallel region.
// Shapes: M rows grouped by expert, G experts, N out features, K in features, C = K / 32 chunks of x.
//   plain: out[r] = x[r] · W[g]ᵀ for the rows r of segment g;  gated (up_qweight): out[r] = swiglu(x[r]·W[g]ᵀ,
//   x[r]·W3[g]ᵀ), gate and up rounded to x's dtype first (h13 [M, 2N] is written, then the SwiGLU);
//   rows outside every segment are 0.
// Work list: per non-empty segment and projection (gated: two), tasks of output columns —
//   ≤ kGemvMaxM rows (decode): kDecodeCols columns per task, the per-ISA decode GEMV of qlinear
//     (isa/quant.h, quant_gemv: the packed rows streamed once, x prepared once for all segments);
//   more rows (prefill), like qlinear's prefill path: bf16 x on a level and format with the int8 GEMM
//     (isa/quant_gemm8.h): each such segment's x prepared once, tiles of about kTile8Bytes decoded and
//     multiplied; otherwise tiles of about kTileBytes of dequantized weights (quant_dequant_rows) times the
//     segment's rows by ATen's GEMM (one thread inside the parallel region).
// One parallel region over the whole list, tasks taken dynamically: the touched experts' bytes are read once per
// step and every thread works whatever the segment sizes (no per-expert parallel region, no Python loop).
// Bound: decode — the packed bytes of the touched experts at memory bandwidth; prefill — the GEMM FLOPs.
#include <torch/library.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "../checks/moe_quant.h"
#include "common.h"
#include "isa/norm.h"
#include "isa/quant.h"
#include "isa/quant_gemm8.h"
#include "isa_dispatch.h"

namespace mk::cpu {
namespace {

constexpr int64_t kGemvMaxM = 16;                 // segments up to this many rows run the decode GEMV
constexpr int64_t kDecodeCols = 32;               // output columns per decode task

struct Task {
  int proj;            // 0: qweight (columns [0, N) of the target), 1: up_qweight (columns [N, 2N))
  int64_t g, row0, rows, n0, n1;
};

void moe_qgemm(at::Tensor& out, const at::Tensor& x, const at::Tensor& expert_offsets, const at::Tensor& qweight,
               const std::optional<at::Tensor>& scales, int64_t qtype, const std::optional<at::Tensor>& up_qweight,
               const std::optional<at::Tensor>& up_scales) {
  constexpr const char* op = "moe_qgemm";
  require_cpu(op, "x", x);
  const QFormat f =
      check::moe_qgemm_args(op, out, x, expert_offsets, qweight, scales, qtype, up_qweight, up_scales, kFloatTypes);
  const int64_t M = x.size(0), K = x.size(1), G = qweight.size(0), N = qweight.size(1), C = K / 32;
  const bool gated = up_qweight.has_value() && up_qweight->defined(), int8 = qtype == kInt8Rowwise;
  if (M == 0 || N == 0) return;
  if (K == 0 || G == 0) {
    out.zero_();
    return;
  }

  // The target Y: out itself (plain, fp32 / bf16), else [M, ldy] in fp32 (fp16 x: the kernels write fp32 or
  // bf16) or x's dtype (gated: h13, rounded where the unfused path stores it).
  const bool half = x.scalar_type() == at::kHalf;
  const at::ScalarType ydt = half ? at::kFloat : x.scalar_type();
  const int64_t ldy = gated ? 2 * N : N;
  at::Tensor Y = !gated && !half ? out : at::empty({M, ldy}, x.options().dtype(ydt));
  // The segments (offsets checked by moe_qgemm_args: non-decreasing within [0, M]); the rows outside every
  // segment, [0, o[0]) and [o[G], M), are 0 (the tasks write every other row of Y).
  const int64_t* o = expert_offsets.const_data_ptr<int64_t>();
  Y.narrow(0, 0, o[0]).zero_();
  Y.narrow(0, o[G], M - o[G]).zero_();

  // The work list.
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  const auto qt = static_cast<int32_t>(qtype);
  const bool gemm8 = bf16 && MK_ISA_CALL(gemm8_supported)(qt);
  const int64_t elt = bf16 ? 2 : 4;
  const int64_t tile_rows =
      gemm8 ? std::max<int64_t>(16, kTile8Bytes / (MK_ISA_CALL(gemm8_tile_bytes)(qt, 16, K) / 16) / 16 * 16)
            : std::max<int64_t>(16, kTileBytes / (K * elt) / 16 * 16);
  std::vector<Task> tasks;
  bool any_gemv = false;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t rows = o[g + 1] - o[g];
    if (rows == 0) continue;
    const bool gemv = rows <= kGemvMaxM;
    any_gemv = any_gemv || gemv;
    const int64_t step = gemv ? kDecodeCols : tile_rows;
    for (int proj = 0; proj < (gated ? 2 : 1); ++proj)
      for (int64_t n0 = 0; n0 < N; n0 += step) tasks.push_back({proj, g, o[g], rows, n0, std::min(N, n0 + step)});
  }

  // The decode GEMV's view of x, prepared once for all segments (as qlinear's decode path).
  const QPath path = bf16 && !int8 ? static_cast<QPath>(MK_ISA_CALL(quant_bf16_path)(static_cast<int32_t>(qtype)))
                                   : QPath::fp32;
  at::Tensor xf, xq_buf;
  const float *xfp = nullptr, *s0 = nullptr, *s1 = nullptr;
  const int8_t* xq = nullptr;
  const auto* xb = bf16 ? reinterpret_cast<const uint16_t*>(x.const_data_ptr()) : nullptr;
  if (any_gemv) {
    if (path == QPath::fp32) {
      xf = x.scalar_type() == at::kFloat ? x : x.to(at::kFloat);
      xfp = xf.const_data_ptr<float>();
    } else {  // per chunk of 32 activations: (int8) dx and dx · Σ q, then the int8 x; (bf16) Σ x
      xq_buf = at::empty({2 * M * C * static_cast<int64_t>(sizeof(float)) + M * K}, x.options().dtype(at::kByte));
      float* a0 = reinterpret_cast<float*>(xq_buf.data_ptr());
      float* a1 = a0 + M * C;
      int8_t* q = reinterpret_cast<int8_t*>(a1 + M * C);
      if (path == QPath::int8k)  // per 256: dk in a0's place, Σ q per 16 (int16) in a1's
        MK_ISA_CALL(quant_prepare_x8k)(xb, M, K, q, a0, reinterpret_cast<int16_t*>(a1));
      else
        MK_ISA_CALL(quant_prepare_x)(static_cast<int>(path), xb, M, K, q, a0, a1);
      s0 = a0, s1 = a1, xq = q;
    }
  }
  const at::Tensor xg = bf16 || x.scalar_type() == at::kFloat ? x : x.to(at::kFloat);  // the GEMM's x
  // The int8 GEMM's prepared x of every prefill segment (blocks of 16 rows from the segment's first row).
  std::vector<int64_t> xp_at(static_cast<size_t>(G), -1);
  at::Tensor xp;
  if (gemm8) {
    int64_t total = 0;
    for (int64_t g = 0; g < G; ++g)
      if (o[g + 1] - o[g] > kGemvMaxM) xp_at[g] = total, total += MK_ISA_CALL(gemm8_x_bytes)(qt, o[g + 1] - o[g], K);
    if (total > 0) {
      xp = at::empty({total}, x.options().dtype(at::kByte));
      const auto prepare = MK_ISA_CALL(gemm8_prepare_x);
      for (int64_t g = 0; g < G; ++g) {
        if (xp_at[g] < 0) continue;
        const int64_t rows = o[g + 1] - o[g];
        at::parallel_for(0, (rows + 15) / 16, parallel_grain(16 * K, 1), [&](int64_t b0, int64_t b1) {
          prepare(qt, xb + o[g] * K, rows, K, b0, b1, static_cast<uint8_t*>(xp.data_ptr()) + xp_at[g]);
        });
      }
    }
  }

  const int64_t R = int8 ? K : K / f.block * f.bytes;  // packed bytes per weight row
  const uint8_t* wbase[2] = {static_cast<const uint8_t*>(qweight.const_data_ptr()),
                             gated ? static_cast<const uint8_t*>(up_qweight->const_data_ptr()) : nullptr};
  const float* sbase[2] = {int8 ? scales->const_data_ptr<float>() : nullptr,
                           int8 && gated ? up_scales->const_data_ptr<float>() : nullptr};
  const auto gemv = MK_ISA_CALL(quant_gemv);
  const auto dequant = MK_ISA_CALL(quant_dequant_rows);
  const auto decode8 = MK_ISA_CALL(gemm8_decode_tile);
  const auto gemm8_tile = MK_ISA_CALL(gemm8_tile);
  const int64_t tile8_bytes = gemm8 ? MK_ISA_CALL(gemm8_tile_bytes)(qt, tile_rows, K) : 0;
  const bool y_bf16 = Y.scalar_type() == at::kBFloat16;
  char* ybase = static_cast<char*>(Y.data_ptr());
  const int64_t yelt = Y.element_size();
  // Dynamic schedule: every thread takes the next task from a shared counter, the prefill tasks (the larger)
  // first, so that segments of very different sizes keep every thread busy to the end (a static split of the
  // list by count measured 0.64× the per-expert loop at T = 64). A task writes only its own columns of Y, so
  // the result does not depend on which thread runs it.
  std::stable_partition(tasks.begin(), tasks.end(), [](const Task& k) { return k.rows > kGemvMaxM; });
  std::atomic<int64_t> next{0};
  const auto ntasks = static_cast<int64_t>(tasks.size());
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    at::Tensor tile;  // this thread's W tile (prefill tasks)
    for (int64_t t; (t = next.fetch_add(1, std::memory_order_relaxed)) < ntasks;) {
      const Task& k = tasks[t];
      const uint8_t* w = wbase[k.proj] + k.g * N * R;
      const float* s = sbase[k.proj] ? sbase[k.proj] + k.g * N : nullptr;
      const int64_t col0 = k.proj * N;  // the projection's first column in Y
      if (k.rows <= kGemvMaxM) {
        const bool k8 = path == QPath::int8k;
        QGemv a{path, static_cast<int32_t>(qtype), w, s, K, k.rows,
                xfp ? xfp + k.row0 * K : nullptr, xb ? xb + k.row0 * K : nullptr, xq ? xq + k.row0 * K : nullptr,
                s0 ? s0 + k.row0 * (k8 ? K / 256 : C) : nullptr, s1 && !k8 ? s1 + k.row0 * C : nullptr, y_bf16,
                ybase + (k.row0 * ldy + col0) * yelt, ldy,
                k8 ? reinterpret_cast<const int16_t*>(s1) + k.row0 * (K / 16) : nullptr};
        gemv(a, k.n0, k.n1);
      } else if (gemm8) {
        if (!tile.defined()) tile = at::empty({tile8_bytes}, x.options().dtype(at::kByte));
        decode8(qt, w, K, k.n0, k.n1, tile.data_ptr());
        gemm8_tile(qt, static_cast<const uint8_t*>(xp.const_data_ptr()) + xp_at[k.g], k.rows, K, tile.const_data_ptr(),
                   k.n1 - k.n0, ybase + (k.row0 * ldy + col0 + k.n0) * yelt, ldy, y_bf16, nullptr, 0);
      } else {
        if (!tile.defined()) tile = at::empty({tile_rows, K}, x.options().dtype(bf16 ? at::kBFloat16 : at::kFloat));
        const int64_t n = k.n1 - k.n0;
        dequant(static_cast<int32_t>(qtype), w, s, K, k.n0, k.n1, bf16, tile.data_ptr());
        Y.narrow(0, k.row0, k.rows).narrow(1, col0 + k.n0, n).copy_(
            at::mm(xg.narrow(0, k.row0, k.rows), tile.narrow(0, 0, n).t()));
      }
    }
  });

  if (gated) {  // h13 rounded to x's dtype (as stored by the unfused path), SwiGLU in fp32, rounded once
    const at::Tensor h = half ? Y.to(at::kHalf) : Y;  // [M, 2N] in x's dtype: gate | up
    const auto swiglu = MK_ISA_CALL(silu_mul_rows);  // silu_and_mul's kernel (isa/norm.h)
    const Elem elem = elem_of(x.scalar_type());
    at::parallel_for(0, M, parallel_grain(2 * N), [&](int64_t r0, int64_t r1) {
      const auto* hp = static_cast<const char*>(h.const_data_ptr());
      swiglu(elem, out.data_ptr(), N, hp, hp + N * h.element_size(), 2 * N, r0, r1, N);
    });
  } else if (half) {
    out.copy_(Y);
  }
}

}  // namespace
}  // namespace mk::cpu

TORCH_LIBRARY_IMPL(mistral_kernels, CPU, m) { MK_MOE_QUANT_OPS(MK_IMPL_CPU) }
