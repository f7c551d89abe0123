// cpu/isa/quant_q8_lanes.h — the 32-blocks' (Q4_0, Q4_1, Q8_0) int8-activation GEMV at AVX512-VNNI: lanes by
// block. Included by quant_codes.h (inside namespace quant) at the levels with AVX512-VNNI + BW, where gemv_rows_q8
// takes dot_rows_q8l instead of dot_rows_q8 (the avx2 and avx512 levels keep the per-chunk kernel). Bit layouts:
// csrc/kernels/quant_blocks.h; activations: quantize_x_q8 (int8 per 32: dx, xs = dx · Σ q per block).
// Shape letters: M rows of x, K in features, C = K / 32 blocks per row, G = C / 8 groups of 8 blocks (256
// elements); the C % 8 blocks after the last group are the tail.
//
// Lanes by block. vpdpbusd adds 4 byte products into each of 16 int32 lanes. A group's codes are arranged as four
// vectors T0..T3 in which lane l holds 4 codes of block l % 8 only:
//   T_j[l] = dword j of block l (elements 4j .. 4j + 3)            for l < 8
//            dword j + 4 of block l − 8 (elements 16 + 4j .. )       for l ≥ 8
// so 4 vpdpbusd leave in lanes l and l + 8 the two halves of block l's Σ c·q, and one fp32 multiply by the
// blocks' scales (d_l, both halves) finishes them — against, per block and row, a vpdpbusd, a conversion and
// two fp32 products for the per-chunk kernel. Worked example: T2[11] = dword 6 of block 3 = elements 24..27.
// The activations of every whole group get the same arrangement when they are quantized (transpose_group on
// the natural int8: quantize_x_q8 at these levels), so T_j of the codes pairs element with element with T_j of x;
// dx and xs stay per block in element order, and the tail stays in element order (dot_rows_q8's per-chunk code).
// Codes as unsigned bytes with an offset per block: Q4_0 c ∈ 0..15 (w = d · (c − 8)), Q8_0 c + 128 ∈ 0..255
// (w = d · ((c + 128) − 128)), Q4_1 c ∈ 0..15 (w = d · c + m), so per row of x and group, in fp32:
//   acc  += (d_l · Σ_lane c·q) · dx_l                          (16 lanes, block l % 8)
//   accm += off_l · xs_l       off = −8·d (Q4_0), −128·d (Q8_0), m (Q4_1)         (8 lanes, block l)
// The sums are exact integers (|Σ| ≤ 16 · 255 · 127); the only error is the activations' quantization (quant_codes.h
// states and tests/test_quant_linear.py checks the bound). Every M runs this code per row of x and the tail in
// the same order, so each output is the same whatever M (a speculative verify row equals its plain decode).
#pragma once

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
#define MK_QUANT_Q8_LANES 1

// 256 bytes in element order (8 blocks of 32: block l at 32l, its dword d at 32l + 4d) → T0..T3 (table above).
// Z0..Z3 hold blocks (0, 1) .. (6, 7); P_j takes blocks 0-3 and Q_j blocks 4-7 through one two-source permute
// each (lane i: dword 8·(i % 4) + j + 4·(i ≥ 8) of the pair), and the blend keeps P_j's lanes 0-3, 8-11.
__attribute__((always_inline)) inline void transpose_group(__m512i z0, __m512i z1, __m512i z2, __m512i z3,
                                                           __m512i (&t)[4]) {
  const __m512i base = _mm512_setr_epi32(0, 8, 16, 24, 0, 8, 16, 24, 4, 12, 20, 28, 4, 12, 20, 28);
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const __m512i idx = _mm512_add_epi32(base, _mm512_set1_epi32(j));
    t[j] = _mm512_mask_blend_epi32(__mmask16(0xF0F0), _mm512_permutex2var_epi32(z0, idx, z1),
                                   _mm512_permutex2var_epi32(z2, idx, z3));
  }
}

// One group of the activations (256 int8 in element order) → T0..T3, in place.
inline void transpose_x_group(int8_t* q) {
  __m512i t[4];
  transpose_group(_mm512_loadu_si512(q), _mm512_loadu_si512(q + 64), _mm512_loadu_si512(q + 128),
                  _mm512_loadu_si512(q + 192), t);
  for (int j = 0; j < 4; ++j) _mm512_storeu_si512(q + 64 * j, t[j]);
}

// A group of 8 blocks of W decoded for the lanes by block.
struct QLanes {
  __m512i t[4];  // unsigned codes, T0..T3
  __m512 d;      // d of block l % 8 in lane l
  __m256 off;    // per block: −8·d (Q4_0), −128·d (Q8_0), m (Q4_1)
};

template <int32_t QT>
__attribute__((always_inline)) inline void decode_group(const uint8_t* g, QLanes& k) {
  constexpr int BYTES = Geometry<QT>::BYTES;
  // each block's first 4 bytes: d (Q4_1: then m), both fp16 (8 scalar loads: as fast as vpgatherdd, measured)
  int32_t w4[8];
  for (int i = 0; i < 8; ++i) std::memcpy(&w4[i], g + i * BYTES, 4);
  const __m256i dm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w4));
  const __m256 d8 = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(dm));
  k.d = _mm512_insertf32x8(_mm512_castps256_ps512(d8), d8, 1);
  if constexpr (QT == ::mk::kQ8_0) {
    auto pair = [&](int b) {  // the 32 codes of blocks b, b + 1
      return _mm512_inserti64x4(_mm512_castsi256_si512(load32b(g + b * BYTES + 2)), load32b(g + (b + 1) * BYTES + 2), 1);
    };
    transpose_group(pair(0), pair(2), pair(4), pair(6), k.t);
    for (int j = 0; j < 4; ++j) k.t[j] = _mm512_xor_si512(k.t[j], _mm512_set1_epi8(static_cast<char>(0x80)));
    k.off = _mm256_mul_ps(d8, _mm256_set1_ps(-128.0f));
  } else {
    constexpr int QS = QT == ::mk::kQ4_1 ? 4 : 2;  // the 16 bytes of nibbles: element e < 16 low, e ≥ 16 high
    auto four = [&](int b) {  // the nibble bytes of blocks b .. b + 3, 16 each
      const __m256i lo = _mm256_setr_m128i(load16b(g + b * BYTES + QS), load16b(g + (b + 1) * BYTES + QS));
      const __m256i hi = _mm256_setr_m128i(load16b(g + (b + 2) * BYTES + QS), load16b(g + (b + 3) * BYTES + QS));
      return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    };
    const __m512i a = four(0), b = four(4);
    // lane l: nibble-byte dword j of block l % 8; lanes < 8 its low nibbles, lanes ≥ 8 its high ones
    const __m512i base = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
    const __m512i shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const __m512i r = _mm512_permutex2var_epi32(a, _mm512_add_epi32(base, _mm512_set1_epi32(j)), b);
      k.t[j] = _mm512_and_si512(_mm512_srlv_epi16(r, shift), lo4);
    }
    if constexpr (QT == ::mk::kQ4_1)
      k.off = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_srli_epi32(dm, 16)));
    else
      k.off = _mm256_mul_ps(d8, _mm256_set1_ps(-8.0f));
  }
}

// y[m] ≈ Σ_k x[m, k] · W[row, k] for one packed row and MB rows of x quantized by quantize_x_q8 at this level (xq
// [MB, K] ld K, whole groups in lanes by block; dx / xs [MB, C] ld C): the groups by the lanes, the tail per chunk
// (as dot_rows_q8).
template <int32_t QT, int MB, typename OUT>
inline void dot_rows_q8l(const uint8_t* row, int64_t nblocks, const int8_t* xq, int64_t K, const float* dx,
                         const float* xs, int64_t C, OUT* y, int64_t ldy) {
  constexpr int BYTES = Geometry<QT>::BYTES;
  const int64_t groups = nblocks / 8;
  const bool long_row = K > kLongRow;
  __m512 acc[MB];
  __m256 accm[MB];
  for (int m = 0; m < MB; ++m) acc[m] = _mm512_setzero_ps(), accm[m] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* blk = row + 8 * g * BYTES;
    prefetch_stream<8 * BYTES>(blk, long_row);
    QLanes k;
    decode_group<QT>(blk, k);
    __m512i s[MB];
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m)
      s[m] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), k.t[0], _mm512_loadu_si512(xq + m * K + 256 * g));
#pragma GCC unroll 3
    for (int j = 1; j < 4; ++j)
#pragma GCC unroll 8
      for (int m = 0; m < MB; ++m)
        s[m] = _mm512_dpbusd_epi32(s[m], k.t[j], _mm512_loadu_si512(xq + m * K + 256 * g + 64 * j));
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      const __m256 dx8 = _mm256_loadu_ps(dx + m * C + 8 * g);
      acc[m] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(s[m]), k.d),
                               _mm512_insertf32x8(_mm512_castps256_ps512(dx8), dx8, 1), acc[m]);
      accm[m] = _mm256_fmadd_ps(k.off, _mm256_loadu_ps(xs + m * C + 8 * g), accm[m]);
    }
  }
  for (int64_t b = 8 * groups; b < nblocks; ++b) {  // the tail: element order, one chunk per block
    decode_codes<QT>(row + b * BYTES, [&](int, __m256i codes, float s0, float s1, float mn) {
      const __m256 sv = lane_scales<QT>(s0, s1);
      for (int m = 0; m < MB; ++m) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + m * K + 32 * b));
        accm[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot32<QT>(codes, xv)),
                                  _mm256_mul_ps(sv, _mm256_set1_ps(dx[m * C + b])), accm[m]);
        if constexpr (!kSignedCodes<QT>)  // the block's offset term mn · xs, into lane 0
          accm[m] = _mm256_add_ps(accm[m], _mm256_setr_ps(mn * xs[m * C + b], 0, 0, 0, 0, 0, 0, 0));
      }
    });
  }
  for (int m = 0; m < MB; ++m) y[m * ldy] = out_cast<OUT>(_mm512_reduce_add_ps(acc[m]) + hsum8(accm[m]));
}

#endif  // AVX512-VNNI + BW
