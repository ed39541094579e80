// Activations quantized row by row as gguf_matmul multiplies them (the scheme in gguf_activations.h).
#include <ATen/ATen.h>

#include "gguf_activations.h"
#include "gguf_format.h"
#include "gguf_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

using namespace gguf;

namespace {

int32_t pair16(int32_t low, int32_t high) { return static_cast<int32_t>((static_cast<uint32_t>(high) << 16) | (static_cast<uint32_t>(low) & 0xFFFF)); }

}  // namespace

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
namespace gguf {

// Vectorized, since every pass quantizes each layer's four inputs once per row. The same float operations
// as llama.cpp's scalar reference, so the same codes: x * (1 / d) (Q8_0) or x * (-127 / max) (Q8_K),
// rounded to nearest even under the default rounding mode.
void quantize_q8_0(const float* x, int64_t k, QuantizedRow& r) {
  r.q.resize(k);
  r.d.resize(k / 32);
  r.sums.resize(k / 32);
  const __m512 sign = _mm512_set1_ps(-0.0f);
  for (int64_t b = 0; b < k / 32; ++b) {
    const __m512 lo = _mm512_loadu_ps(x + 32 * b), hi = _mm512_loadu_ps(x + 32 * b + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, lo), _mm512_andnot_ps(sign, hi)));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    const __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, _mm512_set1_ps(id)));
    const __m512i qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, _mm512_set1_ps(id)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(r.q.data() + 32 * b), _mm512_cvtsepi32_epi8(qlo));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(r.q.data() + 32 * b + 16), _mm512_cvtsepi32_epi8(qhi));
    r.sums[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(qlo, qhi));
    r.d[b] = static_cast<float>(c10::Half(d));  // llama.cpp stores the block scale as fp16
  }
}

void quantize_q8_k(const float* x, int64_t k, QuantizedRow& r) {
  r.q.resize(k);
  r.d.resize(k / 256);
  r.sums.resize(k / 16);
  r.pairs16.resize(k / 32);
  r.pairs32.resize(k / 64);
  const __m512 sign = _mm512_set1_ps(-0.0f);
  for (int64_t b = 0; b < k / 256; ++b) {
    const float* xb = x + 256 * b;
    __m512 amax16 = _mm512_setzero_ps();
    for (int v = 0; v < 16; ++v) amax16 = _mm512_max_ps(amax16, _mm512_andnot_ps(sign, _mm512_loadu_ps(xb + 16 * v)));
    const float amax = _mm512_reduce_max_ps(amax16);
    if (amax == 0.0f) {
      std::fill(r.q.begin() + 256 * b, r.q.begin() + 256 * (b + 1), 0);
      r.d[b] = 0.0f;
      std::fill(r.sums.begin() + 16 * b, r.sums.begin() + 16 * (b + 1), 0);
      std::fill(r.pairs16.begin() + 8 * b, r.pairs16.begin() + 8 * (b + 1), 0);
      std::fill(r.pairs32.begin() + 4 * b, r.pairs32.begin() + 4 * (b + 1), 0);
      continue;
    }
    float max = 0.0f;  // the first input of largest magnitude, with its sign
    for (int v = 0; v < 16; ++v) {
      const __mmask16 at = _mm512_cmp_ps_mask(_mm512_andnot_ps(sign, _mm512_loadu_ps(xb + 16 * v)), _mm512_set1_ps(amax), _CMP_EQ_OQ);
      if (at) {
        max = xb[16 * v + __builtin_ctz(at)];
        break;
      }
    }
    const float iscale = -127.0f / max;
    for (int v = 0; v < 16; ++v) {
      const __m512i q = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + 16 * v), _mm512_set1_ps(iscale))),
                                         _mm512_set1_epi32(127));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(r.q.data() + 256 * b + 16 * v), _mm512_cvtsepi32_epi8(q));
      r.sums[16 * b + v] = _mm512_reduce_add_epi32(q);
    }
    const int32_t* s = r.sums.data() + 16 * b;
    for (int i = 0; i < 8; ++i) r.pairs16[8 * b + i] = pair16(s[2 * i], s[2 * i + 1]);
    for (int i = 0; i < 4; ++i) r.pairs32[4 * b + i] = pair16(s[4 * i] + s[4 * i + 1], s[4 * i + 2] + s[4 * i + 3]);
    r.d[b] = 1.0f / iscale;
  }
}

}  // namespace gguf
#elif SPECLM_GGUF_SIMD == 256
namespace gguf {
namespace {

inline float max8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

inline int32_t sum8(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}

// 16 int32 codes (8 in a, 8 in b) as 16 int8 with signed saturation, in order (VPMOVSDB's result).
inline void store16(int8_t* out, __m256i a, __m256i b) {
  const __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm_packs_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1)));
}

}  // namespace

// The AVX-512 versions' float operations and rounding, 8 lanes at a time: the same codes and scales.
void quantize_q8_0(const float* x, int64_t k, QuantizedRow& r) {
  r.q.resize(k);
  r.d.resize(k / 32);
  r.sums.resize(k / 32);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < k / 32; ++b) {
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(x + 32 * b + 8 * i);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
    }
    const float d = max8(amax) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    __m256i q[4];
    for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], _mm256_set1_ps(id)));
    store16(r.q.data() + 32 * b, q[0], q[1]);
    store16(r.q.data() + 32 * b + 16, q[2], q[3]);
    r.sums[b] = sum8(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
    r.d[b] = static_cast<float>(c10::Half(d));
  }
}

void quantize_q8_k(const float* x, int64_t k, QuantizedRow& r) {
  r.q.resize(k);
  r.d.resize(k / 256);
  r.sums.resize(k / 16);
  r.pairs16.resize(k / 32);
  r.pairs32.resize(k / 64);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < k / 256; ++b) {
    const float* xb = x + 256 * b;
    __m256 amax8 = _mm256_setzero_ps();
    for (int v = 0; v < 32; ++v) amax8 = _mm256_max_ps(amax8, _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + 8 * v)));
    const float amax = max8(amax8);
    if (amax == 0.0f) {
      std::fill(r.q.begin() + 256 * b, r.q.begin() + 256 * (b + 1), 0);
      r.d[b] = 0.0f;
      std::fill(r.sums.begin() + 16 * b, r.sums.begin() + 16 * (b + 1), 0);
      std::fill(r.pairs16.begin() + 8 * b, r.pairs16.begin() + 8 * (b + 1), 0);
      std::fill(r.pairs32.begin() + 4 * b, r.pairs32.begin() + 4 * (b + 1), 0);
      continue;
    }
    float max = 0.0f;  // the first input of largest magnitude, with its sign
    for (int i = 0; i < 256; ++i)
      if (std::fabs(xb[i]) == amax) {
        max = xb[i];
        break;
      }
    const float iscale = -127.0f / max;
    const __m256i top = _mm256_set1_epi32(127);
    for (int v = 0; v < 16; ++v) {
      const __m256i qa = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 16 * v), _mm256_set1_ps(iscale))), top);
      const __m256i qb = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 16 * v + 8), _mm256_set1_ps(iscale))), top);
      store16(r.q.data() + 256 * b + 16 * v, qa, qb);
      r.sums[16 * b + v] = sum8(_mm256_add_epi32(qa, qb));
    }
    const int32_t* s = r.sums.data() + 16 * b;
    for (int i = 0; i < 8; ++i) r.pairs16[8 * b + i] = pair16(s[2 * i], s[2 * i + 1]);
    for (int i = 0; i < 4; ++i) r.pairs32[4 * b + i] = pair16(s[4 * i] + s[4 * i + 1], s[4 * i + 2] + s[4 * i + 3]);
    r.d[b] = 1.0f / iscale;
  }
}

}  // namespace gguf
#endif

// x [M, K] fp32 quantized as gguf_matmul quantizes its activations (the K-quants' Q8_K, per 256, or Q8_0,
// per 32): (codes int8 [M, K], block scales fp32 [M, K / block], code sums int32 [M, K / 16 or K / 32]).
std::vector<at::Tensor> gguf_quantize_activations(const at::Tensor& x, bool k_quant) {
  TORCH_CHECK(kGgufAvailable, "gguf_quantize_activations: this build has neither AVX-512 VNNI nor AVX2");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "gguf_quantize_activations: x [M, K] fp32");
  const int64_t m = x.size(0), k = x.size(1), block = k_quant ? 256 : 32, group = k_quant ? 16 : 32;
  TORCH_CHECK(k % block == 0, "gguf_quantize_activations: K is not a whole number of blocks");
  auto xc = x.contiguous();
  auto codes = at::empty({m, k}, xc.options().dtype(at::kChar));
  auto scales = at::empty({m, k / block}, xc.options());
  auto sums = at::empty({m, k / group}, xc.options().dtype(at::kInt));
#if SPECLM_GGUF_SIMD
  QuantizedRow row;
  for (int64_t r = 0; r < m; ++r) {
    k_quant ? quantize_q8_k(xc.data_ptr<float>() + r * k, k, row) : quantize_q8_0(xc.data_ptr<float>() + r * k, k, row);
    std::memcpy(codes.data_ptr<int8_t>() + r * k, row.q.data(), k);
    std::memcpy(scales.data_ptr<float>() + r * (k / block), row.d.data(), sizeof(float) * (k / block));
    std::memcpy(sums.data_ptr<int32_t>() + r * (k / group), row.sums.data(), sizeof(int32_t) * (k / group));
  }
#endif
  return {codes, scales, sums};
}
