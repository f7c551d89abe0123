// cpu/isa/rope.cpp — rope_tokens (rope.h) for one ISA level, in place on q and k.
#include "rope.h"

#include "target.h"

MK_ISA_BEGIN
namespace {

template <typename T, bool NEOX>
void rotate_heads(T* base, int64_t heads, int64_t D, int64_t half, const float* cos, const float* sin) {
  for (int64_t h = 0; h < heads; ++h) {
    T* p = base + h * D;
    for (int64_t i = 0; i < half; ++i) {
      const int64_t i1 = NEOX ? i : 2 * i, i2 = NEOX ? i + half : 2 * i + 1;
      const float x1 = to_f(p[i1]), x2 = to_f(p[i2]);
      p[i1] = from_f<T>(x1 * cos[i] - x2 * sin[i]);
      p[i2] = from_f<T>(x2 * cos[i] + x1 * sin[i]);
    }
  }
}

template <typename T, bool NEOX>
void tokens(const int64_t* pos, T* q, T* k, const float* cos_sin, int64_t t0, int64_t t1, int64_t qs, int64_t ks,
            int64_t Hq, int64_t Hkv, int64_t D, int64_t R) {
  const int64_t half = R / 2;
  for (int64_t t = t0; t < t1; ++t) {
    const float* cos = cos_sin + pos[t] * R;
    rotate_heads<T, NEOX>(q + t * qs, Hq, D, half, cos, cos + half);
    rotate_heads<T, NEOX>(k + t * ks, Hkv, D, half, cos, cos + half);
  }
}

template <typename T>
void dispatch(bool neox, const int64_t* pos, void* q, void* k, const float* cs, int64_t t0, int64_t t1, int64_t qs,
              int64_t ks, int64_t Hq, int64_t Hkv, int64_t D, int64_t R) {
  auto run = neox ? tokens<T, true> : tokens<T, false>;
  run(pos, static_cast<T*>(q), static_cast<T*>(k), cs, t0, t1, qs, ks, Hq, Hkv, D, R);
}

}  // namespace

void rope_tokens(Elem elem, bool neox, const int64_t* pos, void* q, void* k, const float* cos_sin, int64_t t0,
                 int64_t t1, int64_t qs, int64_t ks, int64_t Hq, int64_t Hkv, int64_t D, int64_t R) {
  switch (elem) {
    case Elem::f32: return dispatch<float>(neox, pos, q, k, cos_sin, t0, t1, qs, ks, Hq, Hkv, D, R);
    case Elem::bf16: return dispatch<bf16>(neox, pos, q, k, cos_sin, t0, t1, qs, ks, Hq, Hkv, D, R);
    case Elem::f16: return dispatch<f16>(neox, pos, q, k, cos_sin, t0, t1, qs, ks, Hq, Hkv, D, R);
  }
}

MK_ISA_END
