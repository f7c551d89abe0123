// cpu/isa/norm.cpp — rms_norm_rows, add_rms_norm_row and silu_mul_rows (norm.h) for one ISA level. Plain fp32 loops the
// compiler vectorises for the level; SwiGLU with the AVX-512 exp where available. Same rounding as the CUDA
// kernels (csrc/kernels/norm.cuh): the fused residual sum is rounded to the dtype once, stored, and that
// stored value is normalised.
#include "norm.h"

#include <cmath>

#include "target.h"
#include "vec_math.h"
#include "vec_math_avx512.h"

MK_ISA_BEGIN
namespace {

template <typename T>
void rms_rows(T* out, T* residual, const T* x, const T* w, int64_t r0, int64_t r1, int64_t H, float eps) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* xr = x + r * H;
    T* orow = out + r * H;
    const T* src = xr;
    if (residual != nullptr) {
      T* rr = residual + r * H;
      for (int64_t i = 0; i < H; ++i) rr[i] = from_f<T>(to_f(xr[i]) + to_f(rr[i]));
      src = rr;  // normalise the stored (rounded) sum; the row is still in L1/L2
    }
    const float ss = sum_squares(src, H);
    const float inv_rms = 1.f / std::sqrt(ss / static_cast<float>(H) + eps);
    for (int64_t i = 0; i < H; ++i) orow[i] = from_f<T>(to_f(src[i]) * inv_rms * to_f(w[i]));
  }
}

template <typename T>
void add_norm_row(T* out, T* sum, const T* x, const T* res, const T* w, int64_t H, float eps) {
  const T* src = x;
  if (res != nullptr) {
    for (int64_t i = 0; i < H; ++i) sum[i] = from_f<T>(to_f(x[i]) + to_f(res[i]));
    src = sum;
  }
  const float ss = sum_squares(src, H);
  const float inv_rms = 1.f / std::sqrt(ss / static_cast<float>(H) + eps);
  for (int64_t i = 0; i < H; ++i) out[i] = from_f<T>(to_f(src[i]) * inv_rms * to_f(w[i]));
}

template <typename T>
void silu_rows(T* out, int64_t ldo, const T* gate, const T* up, int64_t ld, int64_t r0, int64_t r1, int64_t I) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* a = gate + r * ld;
    const T* b = up + r * ld;
    T* o = out + r * ldo;
    int64_t i = 0;
#if MK_CPU_AVX512
    for (; i + 16 <= I; i += 16)
      avx512::store16(o + i, _mm512_mul_ps(avx512::silu16(avx512::load16(a + i)), avx512::load16(b + i)));
#endif
    for (; i < I; ++i) o[i] = from_f<T>(silu_f(to_f(a[i])) * to_f(b[i]));  // polynomial exp: vectorises
  }
}

}  // namespace

void rms_norm_rows(Elem elem, void* out, void* residual, const void* x, const void* w, int64_t r0, int64_t r1,
                   int64_t H, float eps) {
  switch (elem) {
    case Elem::f32:
      return rms_rows(static_cast<float*>(out), static_cast<float*>(residual), static_cast<const float*>(x),
                      static_cast<const float*>(w), r0, r1, H, eps);
    case Elem::bf16:
      return rms_rows(static_cast<bf16*>(out), static_cast<bf16*>(residual), static_cast<const bf16*>(x),
                      static_cast<const bf16*>(w), r0, r1, H, eps);
    case Elem::f16:
      return rms_rows(static_cast<f16*>(out), static_cast<f16*>(residual), static_cast<const f16*>(x),
                      static_cast<const f16*>(w), r0, r1, H, eps);
  }
}

void add_rms_norm_row(Elem elem, void* out, void* sum, const void* x, const void* res, const void* w, int64_t H,
                      float eps) {
  switch (elem) {
    case Elem::f32:
      return add_norm_row(static_cast<float*>(out), static_cast<float*>(sum), static_cast<const float*>(x),
                          static_cast<const float*>(res), static_cast<const float*>(w), H, eps);
    case Elem::bf16:
      return add_norm_row(static_cast<bf16*>(out), static_cast<bf16*>(sum), static_cast<const bf16*>(x),
                          static_cast<const bf16*>(res), static_cast<const bf16*>(w), H, eps);
    case Elem::f16:
      return add_norm_row(static_cast<f16*>(out), static_cast<f16*>(sum), static_cast<const f16*>(x),
                          static_cast<const f16*>(res), static_cast<const f16*>(w), H, eps);
  }
}

void silu_mul_rows(Elem elem, void* out, int64_t ldo, const void* gate, const void* up, int64_t ld, int64_t r0,
                   int64_t r1, int64_t I) {
  switch (elem) {
    case Elem::f32:
      return silu_rows(static_cast<float*>(out), ldo, static_cast<const float*>(gate), static_cast<const float*>(up),
                       ld, r0, r1, I);
    case Elem::bf16:
      return silu_rows(static_cast<bf16*>(out), ldo, static_cast<const bf16*>(gate), static_cast<const bf16*>(up), ld,
                       r0, r1, I);
    case Elem::f16:
      return silu_rows(static_cast<f16*>(out), ldo, static_cast<const f16*>(gate), static_cast<const f16*>(up), ld, r0,
                       r1, I);
  }
}

MK_ISA_END
