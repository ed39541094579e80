// The 16-float vector helpers the CPU kernels share: one AVX-512 register (or two AVX2), written with
// GCC vector types so that every element, wherever it sits, runs the same instructions.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace vec16 {

typedef float float16v __attribute__((vector_size(64)));  // 16 floats: one AVX-512 register, or two AVX2
typedef int32_t int16v __attribute__((vector_size(64)));

// exp(x) for x <= 0 (softmax arguments), 16 at a time: 2^(x log2 e) split into 2^n * 2^f with a
// degree-6 polynomial for 2^f on [-0.5, 0.5] (Cephes exp2f's coefficients); relative error ~2e-7.
// Written with vector types so that every element, wherever it sits, runs the same instructions.
inline float16v exp_nonpositive(float16v x) {
  const float16v lowest = x - x - 87.0f;
  x = x < lowest ? lowest : x;
  const float16v t = x * 1.4426950408889634f;
  const float16v n = (t + 12582912.0f) - 12582912.0f;  // round to nearest (|t| < 2^22)
  const float16v f = t - n;  // [-0.5, 0.5]
  float16v p = f * 1.535336188e-4f + 1.339887440e-3f;
  p = p * f + 9.618437358e-3f;
  p = p * f + 5.550332471e-2f;
  p = p * f + 2.402264791e-1f;
  p = p * f + 6.931472029e-1f;
  p = p * f + 1.0f;
  const int16v bits = (__builtin_convertvector(n, int16v) + 127) << 23;
  return p * reinterpret_cast<const float16v&>(bits);
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
