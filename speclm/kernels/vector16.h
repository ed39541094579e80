// The 16-float vector helpers the CPU kernels share: one AVX-512 register (or two AVX2), written with
// GCC vector types so that every element, wherever it sits, runs the same instructions.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace vec16 {

typedef float float16v __attribute__((vector_size(64)));  // 16 floats: one AVX-512 register, or two AVX2

// The widest vector of floats this CPU holds in one register (16 with AVX-512, else 8), for elementwise
// loops: there every lane runs the same instructions whatever the width, so the width changes no result,
// while GCC keeps a 16-float vector on a CPU without AVX-512 as two halves and lowers much of its code
// through the stack, several times slower than the same arithmetic in 256-bit registers.
#if defined(__AVX512F__) || !defined(__AVX2__)
typedef float16v floatv;
#else
typedef float floatv __attribute__((vector_size(32)));
#endif
constexpr int kLanes = sizeof(floatv) / sizeof(float);

// exp(x) for x <= 0 (softmax arguments), a vector (float16v or floatv) at a time: 2^(x log2 e) split into
// 2^n * 2^f with a degree-6 polynomial for 2^f on [-0.5, 0.5] (Cephes exp2f's coefficients); relative
// error ~2e-7. Written with vector types so that every element, wherever it sits, runs the same instructions.
template <class F>
inline F exp_nonpositive(F x) {
  using I = decltype(x < x);  // the int32 vector of F's lane count
  const F lowest = x - x - 87.0f;
  x = x < lowest ? lowest : x;
  const F t = x * 1.4426950408889634f;
  const F n = (t + 12582912.0f) - 12582912.0f;  // round to nearest (|t| < 2^22)
  const F f = t - n;  // [-0.5, 0.5]
  F p = f * 1.535336188e-4f + 1.339887440e-3f;
  p = p * f + 9.618437358e-3f;
  p = p * f + 5.550332471e-2f;
  p = p * f + 2.402264791e-1f;
  p = p * f + 6.931472029e-1f;
  p = p * f + 1.0f;
  const I bits = (__builtin_convertvector(n, I) + 127) << 23;
  return p * reinterpret_cast<const F&>(bits);
}

inline floatv loadv(const float* p) {
  floatv v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline float16v load16(const float* p) {
  float16v v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline float sum16(float16v v) {  // a fixed pairwise order, in registers
  v += __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  v += __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3);
  v += __builtin_shufflevector(v, v, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1);
  v += __builtin_shufflevector(v, v, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0);
  return v[0];
}

}  // namespace vec16
