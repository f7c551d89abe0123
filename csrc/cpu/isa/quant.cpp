// cpu/isa/quant.cpp — the entries of quant.h for one ISA level over the kernels of quant_kernels.h.
#include "quant.h"

#include "quant_kernels.h"
#include "target.h"

MK_ISA_BEGIN
namespace {

template <int32_t QT>
constexpr QPath bf16_path() {
  if constexpr (quant::kInt8K<QT>) return QPath::int8k;  // every level (portable at the generic one)
#if defined(MK_QUANT_CODES)
  if constexpr (quant::kInt8Dot<QT>) return QPath::int8;
#endif
#if defined(MK_QUANT_BF16_DOT)
  if constexpr (quant::kBf16Dot<QT>) return QPath::bf16;
#endif
  return QPath::fp32;
}

template <typename OUT>
void gemv_as(const QGemv& a, OUT* y, int64_t n0, int64_t n1) {
  if (a.qtype == ::mk::kInt8Rowwise) {
    quant::gemv_rows_i8(static_cast<const int8_t*>(a.w), a.scales, a.K, a.xf, a.M, y, a.ldy, n0, n1);
    return;
  }
  const auto* w = static_cast<const uint8_t*>(a.w);
  ::mk::with_block_qtype(a.qtype, [&]<int32_t QT>() {
    if constexpr (bf16_path<QT>() == QPath::int8k) {
      if (a.path == QPath::int8k) return quant::gemv_rows_q8k<QT>(w, a.K, a.xq, a.s0, a.bs, a.M, y, a.ldy, n0, n1);
    }
#if defined(MK_QUANT_CODES)
    if constexpr (bf16_path<QT>() == QPath::int8) {
      if (a.path == QPath::int8) return quant::gemv_rows_q8<QT>(w, a.K, a.xq, a.s0, a.s1, a.M, y, a.ldy, n0, n1);
    }
#endif
#if defined(MK_QUANT_BF16_DOT)
    if constexpr (bf16_path<QT>() == QPath::bf16) {
      if (a.path == QPath::bf16) return quant::gemv_rows_bf16<QT>(w, a.K, a.xb, a.s0, a.M, y, a.ldy, n0, n1);
    }
#endif
    quant::gemv_rows<QT>(w, a.K, a.xf, a.M, y, a.ldy, n0, n1);
  });
}

}  // namespace

int quant_bf16_path(int32_t qtype) {
  QPath p = QPath::fp32;
  ::mk::with_block_qtype(qtype, [&]<int32_t QT>() { p = bf16_path<QT>(); });
  return static_cast<int>(p);
}

void quant_prepare_x(int path, const uint16_t* xb, int64_t M, int64_t K, int8_t* xq, float* s0, float* s1) {
#if defined(MK_QUANT_CODES)
  if (path == static_cast<int>(QPath::int8)) return quant::quantize_x_q8(xb, M, K, xq, s0, s1);
#endif
#if defined(MK_QUANT_BF16_DOT)
  if (path == static_cast<int>(QPath::bf16)) return quant::chunk_sums_bf16(xb, M, K, s0);
#endif
  (void)path, (void)xb, (void)M, (void)K, (void)xq, (void)s0, (void)s1;
}

void quant_prepare_x8k(const uint16_t* xb, int64_t M, int64_t K, int8_t* xq, float* dk, int16_t* bs) {
  quant::quantize_x_q8k(xb, M, K, xq, dk, bs);
}

// The prefill tiles of the avx2 level come from the generic copy of the dequantization: the portable loop
// compiled with -mavx2 (GCC 12) ran at half its speed (the block decode vectorised into byte moves and
// store-forwarding stalls). Its decode GEMV has its own AVX2 kernels (quant_codes.h, quant_kernels.h).
#if defined(__AVX2__) && !defined(__AVX512F__)
#define MK_QUANT_GENERIC_DEQUANT 1
#endif

void quant_gemv(const QGemv& a, int64_t n0, int64_t n1) {
  if (a.out_bf16)
    gemv_as(a, static_cast<uint16_t*>(a.y), n0, n1);
  else
    gemv_as(a, static_cast<float*>(a.y), n0, n1);
}

void quant_dequant_rows(int32_t qtype, const void* w, const float* scales, int64_t K, int64_t n0, int64_t n1,
                        bool bf16_out, void* dst) {
#if defined(MK_QUANT_GENERIC_DEQUANT)
  return ::mk::cpu::isa_generic::quant_dequant_rows(qtype, w, scales, K, n0, n1, bf16_out, dst);
#endif
  if (qtype == ::mk::kInt8Rowwise) {
    const auto* q = static_cast<const int8_t*>(w);
    if (bf16_out)
      quant::dequant_rows_i8(q, scales, K, n0, n1, static_cast<uint16_t*>(dst));
    else
      quant::dequant_rows_i8(q, scales, K, n0, n1, static_cast<float*>(dst));
    return;
  }
  const auto* p = static_cast<const uint8_t*>(w);
  ::mk::with_block_qtype(qtype, [&]<int32_t QT>() {
    if (bf16_out)
      quant::dequant_rows<QT>(p, K, n0, n1, static_cast<uint16_t*>(dst));
    else
      quant::dequant_rows<QT>(p, K, n0, n1, static_cast<float*>(dst));
  });
}

MK_ISA_END
