// emu_math.h — CUDA device math, bit intrinsics and atomics for the SIMT emulator.
// Intrinsics map to their precise counterparts (__expf → expf): results differ from the GPU's approximate
// instructions (ex2.approx, rsqrt.approx) in the last bits — kernels are compared with tolerances.
// Atomics are real CPU atomics (relaxed, like CUDA's device-scope atomics) because blocks may run on
// several OS threads at once.
#pragma once

#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

// ---- float math --------------------------------------------------------------------------------------
// expf, exp2f, logf, sqrtf, fmaxf, fminf, fabsf, INFINITY: the C library's, via <cmath>.
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __exp2f(float x) { return std::exp2(x); }
inline float __logf(float x) { return std::log(x); }
inline float __log2f(float x) { return std::log2(x); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __tanhf(float x) { return std::tanh(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __saturatef(float x) { return x != x ? 0.f : x < 0.f ? 0.f : x > 1.f ? 1.f : x; }

inline int __float_as_int(float f) { return std::bit_cast<int>(f); }
inline unsigned __float_as_uint(float f) { return std::bit_cast<unsigned>(f); }
inline float __int_as_float(int i) { return std::bit_cast<float>(i); }
inline float __uint_as_float(unsigned u) { return std::bit_cast<float>(u); }

// ---- integer helpers ---------------------------------------------------------------------------------
inline int __popc(unsigned x) { return std::popcount(x); }
inline int __popcll(unsigned long long x) { return std::popcount(x); }
inline int __clz(int x) { return std::countl_zero(static_cast<unsigned>(x)); }
inline int __clzll(long long x) { return std::countl_zero(static_cast<unsigned long long>(x)); }
inline int __ffs(int x) { return x == 0 ? 0 : std::countr_zero(static_cast<unsigned>(x)) + 1; }
inline int __ffsll(long long x) { return x == 0 ? 0 : std::countr_zero(static_cast<unsigned long long>(x)) + 1; }
// dp4a: the sum of the four products of the signed bytes of a and b, plus c (exact; wraps like the 32-bit GPU add).
inline int __dp4a(int a, int b, int c) {
  int64_t s = c;
  for (int i = 0; i < 4; ++i)
    s += static_cast<int64_t>(static_cast<int8_t>(a >> (8 * i))) * static_cast<int8_t>(b >> (8 * i));
  return static_cast<int>(static_cast<uint32_t>(s));
}
// Float → int, round to nearest even (cvt.rni.s32.f32): NaN → 0, out-of-range values saturate.
inline int __float2int_rn(float x) {
  if (x != x) return 0;
  if (x >= 2147483647.0f) return 2147483647;
  if (x <= -2147483648.0f) return -2147483647 - 1;
  return static_cast<int>(std::nearbyint(x));
}
inline unsigned __brev(unsigned x) {
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
// min / max for integers, as CUDA's device headers provide them in the global namespace.
#define SIMT_EMU_MINMAX(T)                           \
  inline T min(T a, T b) { return b < a ? b : a; } \
  inline T max(T a, T b) { return a < b ? b : a; }
SIMT_EMU_MINMAX(int)
SIMT_EMU_MINMAX(unsigned)
SIMT_EMU_MINMAX(long)
SIMT_EMU_MINMAX(unsigned long)
SIMT_EMU_MINMAX(long long)
SIMT_EMU_MINMAX(unsigned long long)
#undef SIMT_EMU_MINMAX

template <typename T>
inline T __ldg(const T* p) { return *p; }

// ---- memory fences -----------------------------------------------------------------------------------
// A block's threads share one OS thread, so a compiler barrier orders them; the device-wide fence also
// orders against other OS threads running other blocks.
inline void __threadfence_block() { std::atomic_signal_fence(std::memory_order_seq_cst); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }

// ---- atomics (return the old value) -------------------------------------------------------------------
namespace simt::emu {
template <typename T>
inline std::atomic_ref<T> aref(T* p) { return std::atomic_ref<T>(*p); }
constexpr auto kRelaxed = std::memory_order_relaxed;
template <typename T, typename F>
inline T atomic_update(T* p, F f) {  // CAS loop for the operations std::atomic_ref lacks
  auto a = aref(p);
  T old = a.load(kRelaxed);
  while (!a.compare_exchange_weak(old, f(old), kRelaxed)) {
  }
  return old;
}
}  // namespace simt::emu

#define SIMT_EMU_ATOMIC_ARITH(T)                                                                   \
  inline T atomicAdd(T* p, T v) { return simt::emu::aref(p).fetch_add(v, simt::emu::kRelaxed); } \
  inline T atomicSub(T* p, T v) { return simt::emu::aref(p).fetch_sub(v, simt::emu::kRelaxed); } \
  inline T atomicExch(T* p, T v) { return simt::emu::aref(p).exchange(v, simt::emu::kRelaxed); }
#define SIMT_EMU_ATOMIC_INT(T)                                                                         \
  SIMT_EMU_ATOMIC_ARITH(T)                                                                             \
  inline T atomicMax(T* p, T v) { return simt::emu::atomic_update(p, [v](T o) { return o < v ? v : o; }); } \
  inline T atomicMin(T* p, T v) { return simt::emu::atomic_update(p, [v](T o) { return v < o ? v : o; }); } \
  inline T atomicAnd(T* p, T v) { return simt::emu::aref(p).fetch_and(v, simt::emu::kRelaxed); }     \
  inline T atomicOr(T* p, T v) { return simt::emu::aref(p).fetch_or(v, simt::emu::kRelaxed); }       \
  inline T atomicXor(T* p, T v) { return simt::emu::aref(p).fetch_xor(v, simt::emu::kRelaxed); }     \
  inline T atomicCAS(T* p, T compare, T val) {                                                         \
    simt::emu::aref(p).compare_exchange_strong(compare, val, simt::emu::kRelaxed);                    \
    return compare;                                                                                    \
  }
SIMT_EMU_ATOMIC_INT(int)
SIMT_EMU_ATOMIC_INT(unsigned)
SIMT_EMU_ATOMIC_INT(unsigned long long)
SIMT_EMU_ATOMIC_INT(long long)
SIMT_EMU_ATOMIC_ARITH(float)
SIMT_EMU_ATOMIC_ARITH(double)
#undef SIMT_EMU_ATOMIC_INT
#undef SIMT_EMU_ATOMIC_ARITH
inline unsigned short atomicCAS(unsigned short* p, unsigned short compare, unsigned short val) {
  simt::emu::aref(p).compare_exchange_strong(compare, val, simt::emu::kRelaxed);
  return compare;
}
// atomicInc/atomicDec wrap like the PTX instructions: inc → (old >= v) ? 0 : old + 1.
inline unsigned atomicInc(unsigned* p, unsigned v) {
  return simt::emu::atomic_update(p, [v](unsigned o) { return o >= v ? 0u : o + 1; });
}
inline unsigned atomicDec(unsigned* p, unsigned v) {
  return simt::emu::atomic_update(p, [v](unsigned o) { return (o == 0 || o > v) ? v : o - 1; });
}
