// common.cuh — the vocabulary of the kernels, written once and shared with csrc/checks and the native CPU
// kernels (csrc/cpu). Framework-free and simt-free: plain C++ under g++, __host__ __device__ under nvcc.
// Kernel headers include ../simt/portable.cuh for the SIMT runtime, then this file.
//
//   Vec, kVec16, aligned16, ceil_div          16-byte vector accesses
//   first_visible_key, effective_window       the causal + sliding-window rule of attention
//   PagedKV, PagedCache                       where key j of a sequence lives in the paged K/V cache
//   OnlineSoftmax                             running max / sum of the flash-attention softmax: update, merge
//   router_rank, router_weight                the top-k router's selection order (NaN ranks last)
//   MK_HEAD_DIMS, head_dim_supported,         the head dims the attention kernels are instantiated for
//   with_head_dim
//
// Shapes: B sequences, Hkv kv heads, D head_dim, N num_blocks, S block_size, M max_blocks per sequence.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "../abi.h"

#if defined(__CUDACC__)
#define MK_HD __host__ __device__ __forceinline__
#else
#define MK_HD inline
#endif

namespace mk::inline MK_ABI {

// ---- vectors -----------------------------------------------------------------------------------------
// N elements of T loaded/stored as one aligned access (16 bytes: float×4, half/bf16×8).
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

template <typename T>
constexpr int kVec16 = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte access

MK_HD int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// True when `p` can be accessed with 16-byte vectors.
MK_HD bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// ---- causal + sliding window ---------------------------------------------------------------------------
// A query at position pos sees the keys j with first_visible_key(pos, W) ≤ j ≤ pos (W = sliding window,
// ≤ 0: none). Example, W = 4: pos 9 sees keys 6, 7, 8, 9 (9 - 4 + 1 = 6); pos 2 sees 0, 1, 2; a padding row
// (pos -1) gets 0 and sees nothing since j ≤ -1 never holds. Decode's query sits at seq_lens[b] - 1;
// prefill's q_b new tokens at seq_lens[b] - q_b … seq_lens[b] - 1.
MK_HD int64_t first_visible_key(int64_t pos, int64_t window) {
  return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
}

// A window at least as long as the block table's capacity (M·S keys) hides nothing: 0 (no window). Also
// keeps the kernels' int window in range. Example: capacity 4096, W = 8192 → 0; W = 1024 → 1024.
MK_HD int64_t effective_window(int64_t window, int64_t capacity) {
  return window > 0 && window < capacity ? window : 0;
}

// ---- paged K/V cache -----------------------------------------------------------------------------------
// One sequence's keys in the paged cache, for one kv head. The caches [N, S, Hkv, D] (contiguous) are
// N·S slots of slot_stride = Hkv·D elements; logical key j of the sequence lives in physical block
// block_table[j / S] at offset j % S:  slot(j) = block_table[j / S]·S + j % S,  its row at k + row(slot).
// Worked example: S = 16, block_table = [7, 2, ...], Hkv = 8, D = 128 (slot_stride 1024), kv head 3:
//   key j = 20 → logical block 20 / 16 = 1 → physical block 2, offset 20 % 16 = 4 → slot 2·16 + 4 = 36;
//   k = k_cache + 3·128, so k + row(36) = k_cache + 36·1024 + 384 is head 3 of that key's row.
// reshape_and_cache writes slots given directly (slot_mapping) and uses row() only.
template <typename T>
struct PagedKV {
  T* k;                        // k_cache + kvh·D: head kvh of slot 0
  T* v;                        // v_cache + kvh·D
  const int32_t* block_table;  // this sequence's row of block_tables [M]
  int64_t slot_stride;         // Hkv·D elements from one slot to the next
  int block_size;              // S
  int num_blocks;              // N

  // Physical slot of logical key j, or -1 when its block id lies outside [0, N): the kernels never read
  // outside the cache, even for ids the host did not validate. J: the caller's index type (an int key
  // index keeps the division 32-bit on the GPU).
  template <typename J>
  MK_HD int64_t slot(J j) const {
    const int32_t blk = block_table[j / block_size];
    return blk >= 0 && blk < num_blocks ? static_cast<int64_t>(blk) * block_size + j % block_size : -1;
  }
  // Element offset from k / v of the row of slot s.
  MK_HD int64_t row(int64_t s) const { return s * slot_stride; }
  // True for s in [0, N·S).
  MK_HD bool holds(int64_t s) const { return s >= 0 && s < static_cast<int64_t>(num_blocks) * block_size; }
};

// The paged cache arguments of the attention kernels: k_cache / v_cache [N, S, Hkv, D] contiguous,
// block_tables int32 [B, M]. sequence(b, kvh, D) is sequence b's view for kv head kvh.
template <typename T>
struct PagedCache {
  const T* k_cache;
  const T* v_cache;
  const int32_t* block_tables;
  int Hkv, S, M, N;

  MK_HD PagedKV<const T> sequence(int64_t b, int kvh, int D) const {
    const int64_t head = static_cast<int64_t>(kvh) * D;
    return {k_cache + head, v_cache + head, block_tables + b * M, static_cast<int64_t>(Hkv) * D, S, N};
  }
};

// ---- online softmax ------------------------------------------------------------------------------------
// State of one row of the flash-attention softmax over the keys seen so far: running max m of the
// scores and running sum l = Σ exp(s - m). The accumulator acc = Σ exp(s - m)·v belongs to the caller
// (its layout differs per kernel); every update returns the factor to scale it by. `exp` is the
// caller's exponential (__expf, exp2f in the log2 domain, std::exp, a vector exp...).
//   update by a block of scores s_i with max mx:
//     alpha = st.rescale(mx, exp);  p_i = exp(s_i - st.shift());  st.add(alpha, Σ p_i);  acc = acc·alpha + Σ p_i·v_i
//   merge of states (m_i, l_i, acc_i) over disjoint keys: mx = max m_i, w_i = weight(m_i, mx, exp),
//     l = Σ w_i·l_i, acc = Σ w_i·acc_i          (merge() does it for two states)
//   result: acc · normalizer(l)                (0 for a row that saw no key)
// NaN (docs/design.md §3, README "NaN and Inf"): a NaN score of a VISIBLE key poisons the row — m becomes NaN
// (nan_max), so every later alpha / p / weight is NaN, l ends NaN and normalizer(NaN) = NaN: the output row is
// NaN on every backend. A NaN in a visible V row reaches its output columns through p·v. Keys a row cannot
// see never enter: the kernels mask scores by selection (never arithmetic) and never multiply an invisible
// key's V row (not even by p = 0: 0·NaN = NaN). Only "no visible key" (l == 0) gives 0.
// Worked example: block {1, 3}: rescale(3) → m 3, alpha = exp(-inf) = 0; p = e^-2, e^0; add → l = 1.135.
// Block {2}: rescale(2) keeps m 3, alpha 1; p = e^-1; add → l = 1.503. Merged with a state (m 5, l 1):
// mx 5, weights e^-2 (this) and 1 → l = 1.503·e^-2 + 1 = 1.203, m 5.
struct OnlineSoftmax {
  float m = -INFINITY;  // max of the scores seen (-inf: none yet)
  float l = 0.f;        // Σ exp(s - m) over them

  // The value subtracted from scores before exp: m, or 0 while no key was seen (so that a fully
  // masked block, max -inf, gives exp(-inf - 0) = 0 rather than exp(-inf + inf) = NaN).
  MK_HD static float shift_of(float m) { return m == -INFINITY ? 0.f : m; }
  MK_HD float shift() const { return shift_of(m); }

  // max(a, b) that propagates NaN (fmaxf / std::max drop it): a NaN score marks the state as poisoned.
  MK_HD static float nan_max(float a, float b) { return a != a ? a : (b != b ? b : fmaxf(a, b)); }

  // Update, step 1: raises m to include a block whose max score is block_max (-inf: fully masked; NaN:
  // poisons the state); returns alpha = exp(m_old - m_new), the factor for l (step 2) and for the caller's
  // accumulator.
  template <typename Exp>
  MK_HD float rescale(float block_max, Exp exp) {
    const float m_new = nan_max(m, block_max);
    const float alpha = exp(m - shift_of(m_new));  // 0 on the first visible block (m = -inf)
    m = m_new;
    return alpha;
  }
  // Update, step 2: l = l·alpha + the block's Σ exp(s - shift()).
  MK_HD void add(float alpha, float p_sum) { l = l * alpha + p_sum; }

  // Weight of a state with max m_i in a merge at the common max mx: exp(m_i - mx), 0 for a state that
  // saw no key (m_i = -inf), NaN when either is NaN.
  template <typename Exp>
  MK_HD static float weight(float m_i, float mx, Exp exp) {
    return m_i == -INFINITY ? 0.f : exp(m_i - mx);
  }

  struct Weights {
    float self, other;
  };
  // Merges the state (m_o, l_o) of other keys into this one; the merged accumulator is
  // acc·self + acc_o·other.
  template <typename Exp>
  MK_HD Weights merge(float m_o, float l_o, Exp exp) {
    const float mx = nan_max(m, m_o);
    const Weights w{weight(m, mx, exp), weight(m_o, mx, exp)};
    l = l * w.self + l_o * w.other;
    m = mx;
    return w;
  }

  // 1 / l, or 0 for a row that saw no key (l = 0): its output is 0. A NaN l (poisoned row) gives NaN: the
  // one place where "no visible key" and "NaN" are told apart, for every backend (CPU core included).
  MK_HD static float normalizer(float l) { return l == 0.f ? 0.f : 1.f / l; }
};

// ---- top-k router -------------------------------------------------------------------------------------
// Selection order of the top-k router (moe_router.cuh and the CPU router): larger probability first, ties →
// lower expert id, and a NaN probability (from NaN / Inf logits) ranks below every number, so k distinct
// experts are always chosen (all-NaN rows: ids 0 … k-1, weights NaN). router_rank(p) is the comparison key
// (-0.5 for NaN: still above the kernels' sentinels -1 "already chosen" and -2 "no such expert");
// router_weight turns a winning key back into the probability reported.
MK_HD float router_rank(float p) { return p != p ? -0.5f : p; }
MK_HD float router_weight(float key) { return key == -0.5f ? NAN : key; }

// ---- head dims -----------------------------------------------------------------------------------------
// The head dims the CUDA attention kernels (decode, prefill, tensor-core prefill) are instantiated for:
// the one list. csrc/checks prints it in its error, the launchers dispatch over it (with_head_dim) and
// tests/test_nvcc_ptxas.py reads it from this line.
#define MK_HEAD_DIMS(X) X(64) X(80) X(96) X(128) X(256)

#define MK_HEAD_DIM_ITEM_(d) d,
inline constexpr int kHeadDims[] = {MK_HEAD_DIMS(MK_HEAD_DIM_ITEM_)};
#undef MK_HEAD_DIM_ITEM_

constexpr bool head_dim_supported(int64_t D) {
  for (const int d : kHeadDims)
    if (d == D) return true;
  return false;
}

// f(std::integral_constant<int, D>{}) when D is in MK_HEAD_DIMS, else `unsupported`. Example:
//   with_head_dim(D, cudaErrorInvalidValue, [&](auto d) { return launch_d<T, decltype(d)::value>(p); })
template <typename R, typename F>
inline R with_head_dim(int D, R unsupported, F&& f) {
  switch (D) {
#define MK_HEAD_DIM_CASE_(d) \
  case d: return f(std::integral_constant<int, d>{});
    MK_HEAD_DIMS(MK_HEAD_DIM_CASE_)
#undef MK_HEAD_DIM_CASE_
    default: return unsupported;
  }
}

}  // namespace mk::inline MK_ABI
