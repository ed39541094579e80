// A GGUF tensor's rows re-quantized to Q4_0 straight from the file's bytes (a draft's coarser weights).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "gguf_format.h"
#include "gguf_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

using namespace gguf;

namespace {

// A decoded block's weights: the type's dequantization (what unpack_weight gives, a block at a time).
// No fused multiply-adds here or below: the results must round as the gguf package's numpy code does.
__attribute__((optimize("fp-contract=off"))) void decoded_weights(int64_t type, int64_t n, const Decoded& dec, float* w) {
  const float d = fp16_to_float(dec.d), m = fp16_to_float(dec.m);
  const uint8_t* c = dec.codes;
  switch (type) {
    case kQ4_0:
    case kQ5_0:
    case kQ8_0: {
      const float offset = type == kQ4_0 ? 8.0f : type == kQ5_0 ? 16.0f : 128.0f;
      for (int64_t k = 0; k < n; ++k) w[k] = d * (static_cast<float>(c[k]) - offset);
      break;
    }
    case kQ4_1:
    case kQ5_1:
      for (int64_t k = 0; k < n; ++k) w[k] = d * static_cast<float>(c[k]) + m;
      break;
    case kQ4_K:
    case kQ5_K:
      for (int64_t k = 0; k < n; ++k) w[k] = d * dec.sc[k / 32] * static_cast<float>(c[k]) - m * dec.mn[k / 32];
      break;
    case kQ6_K:
      for (int64_t k = 0; k < n; ++k) w[k] = d * static_cast<int8_t>(dec.sc[k / 16]) * (static_cast<float>(c[k]) - 32);
      break;
    default: TORCH_CHECK(false, "GGUF type ", type, " is not supported");
  }
}

// 32 weights as one Q4_0 block (18 bytes), rounded as llama.cpp's reference quantizer (and the gguf
// package): d = the weight of largest magnitude (the first such) / -8 (fp16), codes
// clamp(trunc(w / d + 8.5), 0, 15), the product and the sum rounded apart (no fused multiply-add).
__attribute__((optimize("fp-contract=off"))) void quantize_q4_0_block(const float* w, uint8_t* out) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
  const __m512 w0 = _mm512_loadu_ps(w), w1 = _mm512_loadu_ps(w + 16);
  const __m512 a0 = _mm512_abs_ps(w0), a1 = _mm512_abs_ps(w1);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(a0, a1));
  const uint32_t hits = static_cast<uint32_t>(_mm512_cmp_ps_mask(a0, _mm512_set1_ps(amax), _CMP_EQ_OQ)) |
                        (static_cast<uint32_t>(_mm512_cmp_ps_mask(a1, _mm512_set1_ps(amax), _CMP_EQ_OQ)) << 16);
  const float big = amax > 0.0f ? w[__builtin_ctz(hits)] : 0.0f;  // (all zero: +0, as the scalar loop)
  const float d = big / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  const c10::Half h(d);
  std::memcpy(out, &h.x, 2);
  const __m512 vid = _mm512_set1_ps(id), half = _mm512_set1_ps(8.5f), top = _mm512_set1_ps(15.0f);
  constexpr int kTrunc = _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC;
  // (mul then add as two instructions: the compiler may not fuse intrinsics it is handed apart here)
  const __m512 s0 = _mm512_add_round_ps(_mm512_mul_round_ps(w0, vid, _MM_FROUND_CUR_DIRECTION), half, _MM_FROUND_CUR_DIRECTION);
  const __m512 s1 = _mm512_add_round_ps(_mm512_mul_round_ps(w1, vid, _MM_FROUND_CUR_DIRECTION), half, _MM_FROUND_CUR_DIRECTION);
  const __m512i q0 = _mm512_cvttps_epi32(_mm512_min_ps(top, _mm512_roundscale_ps(s0, kTrunc)));
  const __m512i q1 = _mm512_cvttps_epi32(_mm512_min_ps(top, _mm512_roundscale_ps(s1, kTrunc)));
  const __m128i lo = _mm512_cvtepi32_epi8(q0), hi = _mm512_cvtepi32_epi8(q1);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2), _mm_or_si128(lo, _mm_slli_epi16(hi, 4)));
#else
  float big = 0.0f, amax = 0.0f;
  for (int k = 0; k < 32; ++k)
    if (std::fabs(w[k]) > amax) {
      amax = std::fabs(w[k]);
      big = w[k];
    }
  const float d = big / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
  const c10::Half h(d);
  std::memcpy(out, &h.x, 2);
  uint8_t q[32];
  for (int k = 0; k < 32; ++k) q[k] = static_cast<uint8_t>(std::min(15.0f, std::trunc(w[k] * id + 8.5f)));
  for (int j = 0; j < 16; ++j) out[2 + j] = static_cast<uint8_t>(q[j] | (q[j + 16] << 4));
#endif
}

}  // namespace

// raw [N, row_bytes] uint8 of a GGUF type -> its weights re-quantized to Q4_0, [N, inputs / 32 * 18] uint8
// (a draft's coarser layers, converted straight from the file's bytes: no float copy of the tensor).
// `scratch` (optional): a uint8 buffer of at least that many bytes to write into (a loader reuses one).
at::Tensor gguf_to_q4_0(const at::Tensor& raw, int64_t type, const at::Tensor& scratch) {
  const Geometry g = geometry(type);
  TORCH_CHECK(raw.dim() == 2 && raw.scalar_type() == at::kByte && raw.is_contiguous(), "gguf_to_q4_0: raw [N, row_bytes] uint8");
  const int64_t n = raw.size(0), row_bytes = raw.size(1);
  TORCH_CHECK(row_bytes % g.block_bytes == 0, "gguf_to_q4_0: row bytes not a whole number of blocks");
  const int64_t blocks = row_bytes / g.block_bytes, out_row = blocks * g.block_weights / 32 * 18;
  at::Tensor out;
  if (scratch.numel() == 0) {
    out = at::empty({n, out_row}, raw.options());
  } else {
    TORCH_CHECK(scratch.scalar_type() == at::kByte && scratch.is_contiguous() && scratch.numel() >= n * out_row,
                "gguf_to_q4_0: scratch must be contiguous uint8 of at least the output's bytes");
    out = scratch.narrow(0, 0, n * out_row).view({n, out_row});
  }
  const uint8_t* src = raw.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    Decoded dec;
    float w[256];
    for (int64_t r = begin; r < end; ++r)
      for (int64_t b = 0; b < blocks; ++b) {
        decode_block(type, src + r * row_bytes + b * g.block_bytes, dec);
        decoded_weights(type, g.block_weights, dec, w);
        for (int64_t u = 0; u < g.block_weights / 32; ++u)
          quantize_q4_0_block(w + 32 * u, dst + r * out_row + (b * g.block_weights / 32 + u) * 18);
      }
  });
  return out;
}
