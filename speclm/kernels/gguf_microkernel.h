// gguf_matmul's micro-kernel: one block of 16 outputs over the whole input, for up to six activation rows,
// with integer dot products on the repacked records (gguf_format.h) and fp32 block scales.
#pragma once
#include "gguf_format.h"  // SPECLM_GGUF_SIMD: which of the two micro-kernels this CPU compiles

#if SPECLM_GGUF_SIMD == 512
#include <immintrin.h>

#include "gguf_activations.h"

#include <cstdint>

namespace gguf {

// Integer dot products of one 32-input unit: acc_lo[t] over inputs 0..15, acc_hi[t] over 16..31, per output lane
// (acc_lo and acc_hi may be the same array: then the whole unit's sum).
template <int T, int BITS>
inline void unit_dot(const uint8_t* unit, const uint32_t* const* x4, int64_t quad0, __m512i* acc_lo, __m512i* acc_hi,
                     int64_t prefetch) {
  if constexpr (BITS == 8) {
    for (int p = 0; p < 8; ++p) {
      if (prefetch > 0) _mm_prefetch(reinterpret_cast<const char*>(unit + 64 * p + prefetch), _MM_HINT_T0);
      const __m512i v = _mm512_loadu_si512(unit + 64 * p);
      for (int t = 0; t < T; ++t) {
        __m512i& acc = p < 4 ? acc_lo[t] : acc_hi[t];
        acc = _mm512_dpbusd_epi32(acc, v, _mm512_set1_epi32(static_cast<int>(x4[t][quad0 + p])));
      }
    }
    return;
  }
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512i high_a = _mm512_setzero_si512(), high_b = _mm512_setzero_si512();
  if constexpr (BITS == 5) high_a = _mm512_loadu_si512(unit + 256);
  if constexpr (BITS == 6) {
    high_a = _mm512_loadu_si512(unit + 256);
    high_b = _mm512_loadu_si512(unit + 320);
  }
  if (prefetch > 0 && BITS > 4)  // the high-bit planes after the nibbles
    for (int64_t b = 256; b < (BITS == 6 ? 384 : 320); b += 64)
      _mm_prefetch(reinterpret_cast<const char*>(unit + b + prefetch), _MM_HINT_T0);
  for (int p = 0; p < 4; ++p) {
    if (prefetch > 0) _mm_prefetch(reinterpret_cast<const char*>(unit + 64 * p + prefetch), _MM_HINT_T0);
    const __m512i v = _mm512_loadu_si512(unit + 64 * p);
    __m512i lo = _mm512_and_si512(v, low4);
    __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
    if constexpr (BITS == 5) {
      const __m512i one = _mm512_set1_epi8(1);
      lo = _mm512_or_si512(lo, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(high_a, p), one), 4));
      hi = _mm512_or_si512(hi, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(high_a, p + 4), one), 4));
    }
    if constexpr (BITS == 6) {
      const __m512i three = _mm512_set1_epi8(3);
      lo = _mm512_or_si512(lo, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(high_a, 2 * p), three), 4));
      hi = _mm512_or_si512(hi, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(high_b, 2 * p), three), 4));
    }
    for (int t = 0; t < T; ++t) {
      acc_lo[t] = _mm512_dpbusd_epi32(acc_lo[t], lo, _mm512_set1_epi32(static_cast<int>(x4[t][quad0 + p])));
      acc_hi[t] = _mm512_dpbusd_epi32(acc_hi[t], hi, _mm512_set1_epi32(static_cast<int>(x4[t][quad0 + p + 4])));
    }
  }
}

inline __m512 load_fp16x16(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// y[t][16 outputs] of one output block, over all of the input, for T activation rows.
template <int T, int64_t TYPE>
void block_rows(const uint8_t* rec, int64_t blocks, const QuantizedRow* const* xr, float* const* y, int64_t prefetch) {
  constexpr int BITS = TYPE == kQ8_0 ? 8 : TYPE == kQ6_K ? 6 : (TYPE == kQ5_0 || TYPE == kQ5_1 || TYPE == kQ5_K) ? 5 : 4;
  constexpr bool K = TYPE == kQ4_K || TYPE == kQ5_K || TYPE == kQ6_K;
  constexpr int64_t PARAMS = TYPE == kQ4_1 || TYPE == kQ5_1 ? 64 : TYPE == kQ6_K ? 288 : K ? 320 : 32;
  constexpr int64_t UNIT = BITS == 8 ? 512 : BITS == 6 ? 384 : BITS == 5 ? 320 : 256;
  constexpr int64_t UNITS = K ? 8 : 1, RECORD = PARAMS + UNITS * UNIT;
  // Two accumulators per row (inputs 0..15 and 16..31) halve the dependency chain; past two rows their
  // registers run out, and only Q6_K needs the halves apart (one scale each).
  constexpr bool SPLIT = TYPE == kQ6_K || T <= 2;
  const uint32_t* x4[T];
  for (int t = 0; t < T; ++t) x4[t] = reinterpret_cast<const uint32_t*>(xr[t]->q.data());
  __m512 acc_y[T];
  for (int t = 0; t < T; ++t) acc_y[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b, rec += RECORD) {
    if (prefetch > 0)
      for (int64_t off = 0; off < PARAMS; off += 64)
        _mm_prefetch(reinterpret_cast<const char*>(rec + off + prefetch), _MM_HINT_T0);
    const __m512 d = load_fp16x16(rec);
    const uint8_t* units = rec + PARAMS;
    if constexpr (!K) {  // one 32-input unit per block
      __m512i lo[T], hi[T];
      for (int t = 0; t < T; ++t) lo[t] = hi[t] = _mm512_setzero_si512();
      if constexpr (SPLIT)
        unit_dot<T, BITS>(units, x4, 8 * b, lo, hi, prefetch);
      else
        unit_dot<T, BITS>(units, x4, 8 * b, lo, lo, prefetch);
      for (int t = 0; t < T; ++t) {
        const __m512i dot = SPLIT ? _mm512_add_epi32(lo[t], hi[t]) : lo[t];
        const float dx = xr[t]->d[b];
        const int32_t sx = xr[t]->sums[b];
        if constexpr (TYPE == kQ4_1 || TYPE == kQ5_1) {  // d q + m: d dx sum(q x) + m dx sum(x)
          const __m512 m = load_fp16x16(rec + 32);
          acc_y[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(dx)), _mm512_cvtepi32_ps(dot), acc_y[t]);
          acc_y[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(dx * static_cast<float>(sx)), acc_y[t]);
        } else {  // d (q - offset): the integer sum first, as llama.cpp
          constexpr int OFFSET = TYPE == kQ4_0 ? 8 : TYPE == kQ5_0 ? 16 : 128;
          const __m512i sumi = _mm512_sub_epi32(dot, _mm512_set1_epi32(OFFSET * sx));
          acc_y[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(dx)), _mm512_cvtepi32_ps(sumi), acc_y[t]);
        }
      }
    } else {  // 256 inputs: 8 units; integer sums over the block scaled by the sub-block scales, as llama.cpp
      __m512i sumi[T];
      for (int t = 0; t < T; ++t) sumi[t] = _mm512_setzero_si512();
      for (int u = 0; u < 8; ++u) {
        __m512i lo[T], hi[T];
        for (int t = 0; t < T; ++t) lo[t] = hi[t] = _mm512_setzero_si512();
        if constexpr (SPLIT)
          unit_dot<T, BITS>(units + u * UNIT, x4, 64 * b + 8 * u, lo, hi, prefetch);
        else
          unit_dot<T, BITS>(units + u * UNIT, x4, 64 * b + 8 * u, lo, lo, prefetch);
        if constexpr (TYPE == kQ6_K) {  // two 16-input groups per unit (their scales one 16-bit pair)
          const __m512i pair = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + 32 + 32 * u)));
          const __m512i sc_lo = _mm512_srai_epi32(_mm512_slli_epi32(pair, 16), 16), sc_hi = _mm512_srai_epi32(pair, 16);
          for (int t = 0; t < T; ++t)
            sumi[t] = _mm512_add_epi32(sumi[t], _mm512_add_epi32(_mm512_mullo_epi32(lo[t], sc_lo), _mm512_mullo_epi32(hi[t], sc_hi)));
        } else {
          const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + 64 + 16 * u)));
          for (int t = 0; t < T; ++t)
            sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(SPLIT ? _mm512_add_epi32(lo[t], hi[t]) : lo[t], sc));
        }
      }
      // The terms that do not depend on the codes, from the rows' code sums (exact integers, so the same
      // sums as unit by unit): Q6_K's offset, sum of 32 sc x per 16 inputs, taken from sumi; Q4_K/Q5_K's
      // mins, sum of mn x per 32 inputs, scaled by dmin. Sixteen-bit pairs: one VPDPWSSD per two sub-blocks.
      __m512i offset[T];
      for (int t = 0; t < T; ++t) offset[t] = _mm512_setzero_si512();
      constexpr int PAIRS = TYPE == kQ6_K ? 8 : 4;
      for (int i = 0; i < PAIRS; ++i) {
        const uint8_t* at = rec + (TYPE == kQ6_K ? 32 : 192) + 32 * i;
        const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at));
        const __m512i pair = TYPE == kQ6_K ? _mm512_cvtepi8_epi16(bytes) : _mm512_cvtepu8_epi16(bytes);
        for (int t = 0; t < T; ++t)
          offset[t] = _mm512_dpwssd_epi32(offset[t], pair, _mm512_set1_epi32((TYPE == kQ6_K ? xr[t]->pairs16 : xr[t]->pairs32)[PAIRS * b + i]));
      }
      for (int t = 0; t < T; ++t) {
        const __m512 dx = _mm512_set1_ps(xr[t]->d[b]);
        if constexpr (TYPE == kQ6_K) {
          acc_y[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(_mm512_sub_epi32(sumi[t], _mm512_slli_epi32(offset[t], 5))), acc_y[t]);
        } else {
          acc_y[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(sumi[t]), acc_y[t]);
          const __m512 dmin = load_fp16x16(rec + 32);
          acc_y[t] = _mm512_fnmadd_ps(_mm512_mul_ps(dmin, dx), _mm512_cvtepi32_ps(offset[t]), acc_y[t]);
        }
      }
    }
  }
  for (int t = 0; t < T; ++t) _mm512_storeu_ps(y[t], acc_y[t]);
}

}  // namespace gguf
#endif
