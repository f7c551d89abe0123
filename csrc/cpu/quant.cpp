// cpu/quant.cpp — native CPU qlinear (MK_QUANT_OPS): out[M, N] = x[M, K] · W[N, K]ᵀ with W in a quantized
// format (csrc/kernels/quant_blocks.h). x / out fp32, bf16 or fp16; fp32 accumulation. The kernels are
// csrc/cpu/isa/quant_kernels.h (framework-free, per ISA level: isa/quant.h); this file checks arguments, converts and picks the path:
//   M ≤ kGemvMaxM (decode): the GEMV kernels, parallel over N (at::parallel_for); bf16 x takes the int8 paths
//     (activations per 32 for the 32-blocks, per 256 for the K-quants; integer dot products) where the level
//     has them, anything else the fp32 decoding (x converted
//     to fp32 once, M·K elements). Results are written once in out's dtype. Bound: memory — the packed bytes
//     N·R per call at copy bandwidth.
//   M > kGemvMaxM (prefill): one parallel region over tiles of W's rows — equal tiles, the same number per
//     thread (equal_tile_rows, common.h) — where a task decodes a tile into its thread's buffer (L2) and multiplies x by it at
//     once, written into out's columns:
//     - bf16 x on an AVX512-VNNI level, block formats: the int8 GEMM (isa/quant_gemm8.h: x quantized once per
//       call like the GEMV's, the tile decoded to byte codes and per-chunk scales, vpdpbusd). Bound: the
//       vpdpbusd rate, 2·M·N·K integer operations (benchmarks/results/cpu_quant_gemm8.md).
//     - fp32 x on AVX-512 levels: our fp32 tile kernel (isa/quant_tiles.h: W dequantized, read in place, x
//       packed once per call); bf16 x elsewhere: ATen's GEMM on bf16 tiles (the weights rounded to bf16 like a
//       dense bf16 model's; oneDNN's vdpbf16ps GEMM, one thread inside the region). Bound: the GEMM's FLOPs,
//       2·M·N·K; the dequantization adds N·K element stores per call (~5 % of a SmolLM2 projection at M = 73,
//       benchmarks/results/cpu_quant_prefill.md).
// Accuracy of each path: csrc/cpu/isa/quant_kernels.h; tests/test_quant_linear.py checks the bounds.
#include <torch/library.h>

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/mm.h>

#include <vector>

#include "../checks/quant.h"
#include "common.h"
#include "isa/quant.h"
#include "isa/quant_gemm8.h"
#include "isa/quant_tiles.h"
#include "isa_dispatch.h"

namespace mk::cpu {
namespace {

constexpr int64_t kGemvMaxM = 16;               // the decode path up to this many rows of x

// Per-thread scratch of the decode path (the quantized / summed activations), grown on demand: no tensor
// allocation per call (decode calls are ~10 us at SmolLM2 sizes).
uint8_t* scratch(size_t bytes) {
  thread_local std::vector<uint8_t> buf;
  if (buf.size() < bytes) buf.resize(bytes);
  return buf.data();
}

// f(y) with y the output as fp32 or bf16 bits; fp16 out goes through a fp32 buffer.
template <typename F>
void with_out(at::Tensor& out, F&& f) {
  if (out.scalar_type() == at::kFloat) {
    f(out.data_ptr<float>());
  } else if (out.scalar_type() == at::kBFloat16) {
    f(reinterpret_cast<uint16_t*>(out.data_ptr()));
  } else {
    at::Tensor yf = at::empty(out.sizes(), out.options().dtype(at::kFloat));
    f(yf.data_ptr<float>());
    out.copy_(yf);
  }
}

void qlinear_gemv(at::Tensor& out, const at::Tensor& x, const at::Tensor& qweight,
                  const std::optional<at::Tensor>& scales, int64_t qtype, const QFormat& f) {
  const int64_t M = x.size(0), K = x.size(1), N = qweight.size(0), nchunks = K / 32;
  // work per output column: its packed bytes plus M·K multiply-adds; at least 4 columns per task.
  const int64_t row_bytes = qtype == kInt8Rowwise ? K : K / f.block * f.bytes;
  const int64_t grain = parallel_grain(row_bytes + M * K, 4);
  const auto gemv = MK_ISA_CALL(quant_gemv);
  const QPath path = x.scalar_type() == at::kBFloat16 && qtype != kInt8Rowwise
                         ? static_cast<QPath>(MK_ISA_CALL(quant_bf16_path)(static_cast<int32_t>(qtype)))
                         : QPath::fp32;
  QGemv a{path, static_cast<int32_t>(qtype), qweight.const_data_ptr(),
          qtype == kInt8Rowwise ? scales->const_data_ptr<float>() : nullptr,
          K, M, nullptr, nullptr, nullptr, nullptr, nullptr, false, nullptr, N};
  at::Tensor xf;
  if (path == QPath::fp32) {
    xf = x.scalar_type() == at::kFloat ? x : x.to(at::kFloat);
    a.xf = xf.const_data_ptr<float>();
  } else {
    // per chunk of 32 activations: (int8 path) the scale dx and dx · Σ q, then the int8 x; (bf16 path) Σ x;
    // (int8k path) per 256 the scale dk in s0's place, per 16 Σ q as int16 in s1's place, the int8 x
    uint8_t* buf = scratch(static_cast<size_t>(2 * M * nchunks) * sizeof(float) + static_cast<size_t>(M * K));
    float* s0 = reinterpret_cast<float*>(buf);
    float* s1 = s0 + M * nchunks;
    int8_t* xq = reinterpret_cast<int8_t*>(s1 + M * nchunks);
    a.xb = reinterpret_cast<const uint16_t*>(x.const_data_ptr());
    if (path == QPath::int8k) {
      a.bs = reinterpret_cast<const int16_t*>(s1);
      MK_ISA_CALL(quant_prepare_x8k)(a.xb, M, K, xq, s0, reinterpret_cast<int16_t*>(s1));
    } else {
      MK_ISA_CALL(quant_prepare_x)(static_cast<int>(path), a.xb, M, K, xq, s0, s1);
    }
    a.xq = xq, a.s0 = s0, a.s1 = s1;
  }
  with_out(out, [&](auto* yp) {
    a.out_bf16 = sizeof(*yp) == 2;
    a.y = yp;
    at::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) { gemv(a, n0, n1); });
  });
}

// The thread's buffers of the prefill path (kept_buffer): a tile of W, and the int8 GEMM's prepared x.
void* tile_scratch(size_t bytes) { return kept_buffer<0>(bytes); }
uint8_t* x_scratch(size_t bytes) { return kept_buffer<1>(bytes); }

// bf16 x on a level and format with the int8 GEMM (isa/quant_gemm8.h): x quantized once per call into its
// prepared layout, then per tile of W (decoded into the thread's buffer, L2) the int8 GEMM into out's columns.
void qlinear_gemm8(at::Tensor& out, const at::Tensor& x, const at::Tensor& qweight, int64_t qtype) {
  const int64_t M = x.size(0), K = x.size(1), N = qweight.size(0);
  const auto qt = static_cast<int32_t>(qtype);
  uint8_t* xp = x_scratch(static_cast<size_t>(MK_ISA_CALL(gemm8_x_bytes)(qt, M, K)));
  const auto prepare = MK_ISA_CALL(gemm8_prepare_x);
  const auto* xb = reinterpret_cast<const uint16_t*>(x.const_data_ptr());
  at::parallel_for(0, (M + 15) / 16, parallel_grain(16 * K, 1), [&](int64_t b0, int64_t b1) {
    prepare(qt, xb, M, K, b0, b1, xp);
  });
  const int64_t row_bytes = MK_ISA_CALL(gemm8_tile_bytes)(qt, 16, K) / 16;
  // tiles of any multiple of 4 rows (the kernel's register tile; other row counts are fine, only slower)
  const int64_t nt = equal_tile_rows(N, kTile8Bytes / row_bytes, 4), ntiles = (N + nt - 1) / nt;
  const auto decode = MK_ISA_CALL(gemm8_decode_tile);
  const auto gemm = MK_ISA_CALL(gemm8_tile);
  const int64_t tile_bytes = MK_ISA_CALL(gemm8_tile_bytes)(qt, nt, K);
  const auto* w = static_cast<const uint8_t*>(qweight.const_data_ptr());
  const int64_t wrow = qweight.size(1);  // packed bytes per row
  with_out(out, [&](auto* y) {
    at::parallel_for(0, ntiles, 1, [&](int64_t t0, int64_t t1) {
      void* buf = tile_scratch(static_cast<size_t>(tile_bytes));
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t n0 = t * nt, n1 = std::min(N, n0 + nt), n2 = t + 1 < t1 ? std::min(N, n1 + nt) : n1;
        decode(qt, w, K, n0, n1, buf);
        gemm(qt, xp, M, K, buf, n1 - n0, y + n0, N, sizeof(*y) == 2,
             w + n1 * wrow, (n2 - n1) * wrow);  // this thread's next tile, prefetched meanwhile
      }
    });
  });
}

void qlinear_gemm(at::Tensor& out, const at::Tensor& x, const at::Tensor& qweight,
                  const std::optional<at::Tensor>& scales, int64_t qtype) {
  const int64_t M = x.size(0), K = x.size(1), N = qweight.size(0);
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  const at::Tensor xg = bf16 || x.scalar_type() == at::kFloat ? x : x.to(at::kFloat);
  const at::ScalarType tile_type = bf16 ? at::kBFloat16 : at::kFloat;
  const int64_t elt = bf16 ? 2 : 4;
  const bool direct = out.scalar_type() == tile_type;  // the GEMM writes out's columns in place
  // fp32 tiles × fp32 out on an AVX-512 level: our tile kernel (isa/quant_tiles.h) on x packed once per call;
  // otherwise ATen's GEMM per tile (bf16: oneDNN's vdpbf16ps GEMM, measured as fast as our kernel would be).
  const bool own = !bf16 && direct && MK_ISA_CALL(tile_gemm_supported)();
  at::Tensor xt;
  if (own) {
    xt = at::empty({MK_ISA_CALL(tile_x_bytes)(M, K) / 4}, x.options().dtype(at::kFloat));
    const auto pack = MK_ISA_CALL(tile_pack_x);
    at::parallel_for(0, (M + 15) / 16, parallel_grain(16 * K, 1), [&](int64_t b0, int64_t b1) {
      pack(xg.const_data_ptr<float>(), M, K, b0, b1, xt.data_ptr<float>());
    });
  }
  // Tiles of W: at most ~kTileBytes dequantized (they stay in the thread's L2 between the dequantization and
  // the GEMM).
  const int64_t nt = equal_tile_rows(N, kTileBytes / (K * elt), 16);
  const int64_t ntiles = (N + nt - 1) / nt;
  const auto dequant = MK_ISA_CALL(quant_dequant_rows);
  const auto tile_gemm = MK_ISA_CALL(tile_gemm);
  const float* sp = qtype == kInt8Rowwise ? scales->const_data_ptr<float>() : nullptr;
  at::parallel_for(0, ntiles, 1, [&](int64_t t0, int64_t t1) {
    void* buf = tile_scratch(static_cast<size_t>(nt * K * elt));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n0 = t * nt, n1 = std::min(N, n0 + nt), rows = n1 - n0;
      dequant(static_cast<int32_t>(qtype), qweight.const_data_ptr(), sp, K, n0, n1, bf16, buf);
      if (own) {
        tile_gemm(xt.const_data_ptr<float>(), M, K, static_cast<const float*>(buf), rows,
                  out.data_ptr<float>() + n0, N);
        continue;
      }
      const at::Tensor tile = at::from_blob(buf, {rows, K}, x.options().dtype(tile_type));
      if (direct) {
        at::Tensor o = out.narrow(1, n0, rows);
        at::mm_out(o, xg, tile.t());
      } else {
        out.narrow(1, n0, rows).copy_(at::mm(xg, tile.t()));
      }
    }
  });
}

void qlinear(at::Tensor& out, const at::Tensor& x, const at::Tensor& qweight, const std::optional<at::Tensor>& scales,
             int64_t qtype) {
  constexpr const char* op = "qlinear";
  require_cpu(op, "x", x);
  const QFormat f = check::qlinear_args(op, out, x, qweight, scales, qtype, {at::kFloat, at::kBFloat16, at::kHalf});
  const int64_t M = x.size(0), K = x.size(1), N = qweight.size(0);
  if (M == 0 || N == 0) return;
  if (K == 0) {
    out.zero_();
    return;
  }
  if (M <= kGemvMaxM)
    qlinear_gemv(out, x, qweight, scales, qtype, f);
  else if (x.scalar_type() == at::kBFloat16 && MK_ISA_CALL(gemm8_supported)(static_cast<int32_t>(qtype)))
    qlinear_gemm8(out, x, qweight, qtype);
  else
    qlinear_gemm(out, x, qweight, scales, qtype);
}

}  // namespace
}  // namespace mk::cpu

TORCH_LIBRARY_IMPL(mistral_kernels, CPU, m) { MK_QUANT_OPS(MK_IMPL_CPU) }
