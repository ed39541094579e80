// dense_matmul: x @ w.T for fp32 or bf16 weights, every row computed the same way whatever the number of rows.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "cpu_kernels.h"
#include "vector16.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

using namespace vec16;

// -- dense matmul: fp32 or bf16 weights in nn.Linear's [N, K] layout ------------------------------
// y [M, N] fp32 = x [M, K] @ w.T (+ bias), x in w's dtype. Every output is a dot product along k in
// 16-lane vectors (fp32 FMAs, or vdpbf16ps pairs for bf16) reduced with sum16 at the end: the same
// instructions for every (row, output) whatever M and whatever tile it falls in, so a row's result
// does not depend on the other rows. torch's GEMM takes another path for one row than for several
// (fp32: every row differed here), and for bf16 another again past 16 rows (AMX), which made
// verification rows differ from plain decoding and a request's tokens depend on the batch.
namespace {
constexpr int kDenseRows = 4, kDenseCols = 4;

#if defined(__AVX512F__)
template <typename T>
inline __m512 dense_dot(__m512 acc, const T* x, const T* w, int64_t count);

template <>
inline __m512 dense_dot<float>(__m512 acc, const float* x, const float* w, int64_t count) {
  if (count >= 16) return _mm512_fmadd_ps(_mm512_loadu_ps(x), _mm512_loadu_ps(w), acc);
  const __mmask16 mask = static_cast<__mmask16>((1u << count) - 1);
  return _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, x), _mm512_maskz_loadu_ps(mask, w), acc);
}
#endif

// The products of one chunk of k (16 fp32 or 32 bf16 values) of one row and one output, added to acc.
template <typename T>
inline float16v dense_chunk(float16v acc, const T* x, const T* w, int64_t count);

template <>
inline float16v dense_chunk<float>(float16v acc, const float* x, const float* w, int64_t count) {
#if defined(__AVX512F__)
  __m512 a;
  std::memcpy(&a, &acc, sizeof(a));
  a = dense_dot<float>(a, x, w, count);
  std::memcpy(&acc, &a, sizeof(a));
  return acc;
#else
  if (count >= 16) return acc + load16(x) * load16(w);  // (a whole chunk needs no zero-padded copy)
  float xb[16] = {}, wb[16] = {};
  std::memcpy(xb, x, sizeof(float) * std::min<int64_t>(count, 16));
  std::memcpy(wb, w, sizeof(float) * std::min<int64_t>(count, 16));
  return acc + load16(xb) * load16(wb);
#endif
}

template <>
inline float16v dense_chunk<c10::BFloat16>(float16v acc, const c10::BFloat16* x, const c10::BFloat16* w,
                                           int64_t count) {
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
  __m512 a;
  std::memcpy(&a, &acc, sizeof(a));
  __m512i xv, wv;
  if (count >= 32) {
    xv = _mm512_loadu_si512(x);
    wv = _mm512_loadu_si512(w);
  } else {
    const __mmask32 mask = static_cast<__mmask32>((1ull << count) - 1);
    xv = _mm512_maskz_loadu_epi16(mask, x);
    wv = _mm512_maskz_loadu_epi16(mask, w);
  }
  a = _mm512_dpbf16_ps(a, (__m512bh)xv, (__m512bh)wv);
  std::memcpy(&acc, &a, sizeof(a));
  return acc;
#else
  float even[16] = {}, odd[16] = {};  // lane l: pair (2l, 2l+1), as vdpbf16ps pairs them
  for (int64_t j = 0; j < std::min<int64_t>(count, 32); ++j)
    (j % 2 ? odd : even)[j / 2] = static_cast<float>(x[j]) * static_cast<float>(w[j]);
  return acc + (load16(even) + load16(odd));
#endif
}

template <typename T>
constexpr int64_t dense_chunk_size() { return 64 / sizeof(T); }

template <typename T, int R, int C>
void dense_tile(const T* x, int64_t k_in, const T* w, const float* bias, float* y, int64_t n_out) {
  constexpr int64_t step = dense_chunk_size<T>();
  float16v acc[R][C] = {};
  for (int64_t k = 0; k < k_in; k += step) {
    const int64_t count = std::min<int64_t>(step, k_in - k);
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = dense_chunk<T>(acc[r][c], x + r * k_in + k, w + c * k_in + k, count);
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[r * n_out + c] = sum16(acc[r][c]) + (bias ? bias[c] : 0.0f);
}

template <typename T>
using DenseTile = void (*)(const T*, int64_t, const T*, const float*, float*, int64_t);

template <typename T>
DenseTile<T> dense_tile_for(int rows, int cols) {
  static const DenseTile<T> table[kDenseRows][kDenseCols] = {
      {dense_tile<T, 1, 1>, dense_tile<T, 1, 2>, dense_tile<T, 1, 3>, dense_tile<T, 1, 4>},
      {dense_tile<T, 2, 1>, dense_tile<T, 2, 2>, dense_tile<T, 2, 3>, dense_tile<T, 2, 4>},
      {dense_tile<T, 3, 1>, dense_tile<T, 3, 2>, dense_tile<T, 3, 3>, dense_tile<T, 3, 4>},
      {dense_tile<T, 4, 1>, dense_tile<T, 4, 2>, dense_tile<T, 4, 3>, dense_tile<T, 4, 4>}};
  return table[rows - 1][cols - 1];
}

template <typename T>
void dense_run(const T* xp, const T* wp, const float* bias, float* yp, int64_t m, int64_t k_in, int64_t n_out) {
  at::parallel_for(0, (n_out + kDenseCols - 1) / kDenseCols, 1, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      const int64_t c0 = block * kDenseCols;
      const int cols = static_cast<int>(std::min<int64_t>(kDenseCols, n_out - c0));
      for (int64_t r0 = 0; r0 < m; r0 += kDenseRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kDenseRows, m - r0));
        dense_tile_for<T>(rows, cols)(xp + r0 * k_in, k_in, wp + c0 * k_in, bias ? bias + c0 : nullptr,
                                      yp + r0 * n_out + c0, n_out);
      }
    }
  });
}
}  // namespace

// x [M, K] and w [N, K] both fp32 or both bf16, bias [N] fp32 or an empty tensor. Returns fp32 [M, N].
at::Tensor dense_matmul(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "dense_matmul: x [M, K], w [N, K]");
  TORCH_CHECK(x.scalar_type() == w.scalar_type() &&
                  (w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16),
              "dense_matmul: x and w both fp32 or both bf16");
  const bool has_bias = bias.numel() > 0;
  TORCH_CHECK(!has_bias || (bias.scalar_type() == at::kFloat && bias.numel() == w.size(0)), "dense_matmul: bias [N] fp32");
  auto xc = x.contiguous(), wc = w.contiguous();
  auto bc = has_bias ? bias.contiguous() : bias;
  const int64_t m = xc.size(0), k_in = xc.size(1), n_out = wc.size(0);
  auto y = at::empty({m, n_out}, xc.options().dtype(at::kFloat));
  const float* bp = has_bias ? bc.data_ptr<float>() : nullptr;
  if (m == 0 || n_out == 0) return y;
  if (w.scalar_type() == at::kFloat)
    dense_run<float>(xc.data_ptr<float>(), wc.data_ptr<float>(), bp, y.data_ptr<float>(), m, k_in, n_out);
  else
    dense_run<c10::BFloat16>(xc.data_ptr<c10::BFloat16>(), wc.data_ptr<c10::BFloat16>(), bp, y.data_ptr<float>(), m,
                             k_in, n_out);
  return y;
}
