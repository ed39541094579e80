// gguf_matmul's micro-kernel for CPUs with AVX2 but no AVX-512 VNNI: gguf_microkernel.h's computation on
// the same records, each 16-output vector held as two 256-bit halves (outputs 0..7 and 8..15).
//
// AVX2 has no VPDPBUSD: a unit's 8-bit products go through VPMADDUBSW (pairs of unsigned code x signed
// activation, summed to 16 bits) and VPMADDWD (pairs of those to 32 bits). Codes of up to 6 bits and
// activations within +-127 keep a pair's sum within 16 bits; Q8_0's 8-bit codes would not, so its codes
// are made signed (code - 128) and their sign moved onto the activation (|w| x sign(w) x), and its block
// sum needs no offset. Every integer sum is exact and every float operation the AVX-512 kernel's, lane for
// lane, so both kernels give the same bits.
#pragma once
#include "gguf_format.h"  // SPECLM_GGUF_SIMD: which of the two micro-kernels this CPU compiles

#if SPECLM_GGUF_SIMD == 256  // (a CPU with AVX-512 VNNI compiles gguf_microkernel.h instead)
#include <immintrin.h>

#include "gguf_activations.h"

#include <cstdint>

namespace gguf {

struct I16 {  // 16 int32 lanes: outputs 0..7, 8..15
  __m256i a, b;
};
struct F16 {  // 16 float lanes
  __m256 a, b;
};

inline I16 zero16() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
inline I16 add16(I16 x, I16 y) { return {_mm256_add_epi32(x.a, y.a), _mm256_add_epi32(x.b, y.b)}; }
inline F16 cvt16(I16 x) { return {_mm256_cvtepi32_ps(x.a), _mm256_cvtepi32_ps(x.b)}; }
inline F16 fp16x16(const uint8_t* p) {
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)))};
}
inline __m256i load256(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m128i load128(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }

// acc += per 32-bit lane, the sum of its four unsigned bytes of v times the four signed bytes of x (VPDPBUSD).
inline __m256i dot4(__m256i acc, __m256i v, __m256i x) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(v, x), _mm256_set1_epi16(1)));
}

// A unit's scales as VPMADDWD's other operand: each 32-bit lane holds its output's scale in both 16-bit halves.
inline __m256i twice16(__m256i s32) { return _mm256_or_si256(s32, _mm256_slli_epi32(s32, 16)); }

// sum[t] += a 32-input unit's codes times row t's activations, times the unit's scales: sc_lo for inputs
// 0..15, sc_hi for 16..31 (SPLIT false: sc_lo for all 32), scales as twice16 gives them. Q8_0's sums are of
// (code - 128) x and take no scales.
//
// For codes of 4 to 6 bits, VPMADDUBSW's 16-bit pair sums are added in 16 bits for as many quads as cannot
// overflow (a quad's pair sum is at most 2 x (2^BITS - 1) x 128): 4 bits 8 quads, 5 bits 4, 6 bits 2; one
// VPMADDWD by the scales then widens them and applies the scales at once (no 32-bit multiply). Every integer
// is the one the AVX-512 kernel computes.
template <int T, int BITS, bool SPLIT>
inline void unit_dot(const uint8_t* unit, const uint32_t* const* x4, int64_t quad0, I16 sc_lo, I16 sc_hi, I16* sum,
                     int64_t prefetch) {
  if constexpr (BITS == 8) {
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    for (int p = 0; p < 8; ++p) {
      if (prefetch > 0) _mm_prefetch(reinterpret_cast<const char*>(unit + 64 * p + prefetch), _MM_HINT_T0);
      const __m256i wa = _mm256_xor_si256(load256(unit + 64 * p), flip), wb = _mm256_xor_si256(load256(unit + 64 * p + 32), flip);
      const __m256i ua = _mm256_abs_epi8(wa), ub = _mm256_abs_epi8(wb);
      for (int t = 0; t < T; ++t) {
        const __m256i x = _mm256_set1_epi32(static_cast<int>(x4[t][quad0 + p]));
        sum[t].a = dot4(sum[t].a, ua, _mm256_sign_epi8(x, wa));
        sum[t].b = dot4(sum[t].b, ub, _mm256_sign_epi8(x, wb));
      }
    }
  } else {
    constexpr int QUADS = 32767 / (2 * ((1 << BITS) - 1) * 128);
    constexpr int STEPS = SPLIT ? QUADS : QUADS / 2;  // p steps a 16-bit sum holds (a step: two quads unless SPLIT)
    static_assert(STEPS >= 1 && 4 % STEPS == 0, "a step's quads must fit a 16-bit sum");
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    __m256i high_a[2] = {}, high_b[2] = {};
    if constexpr (BITS == 5 || BITS == 6) {
      high_a[0] = load256(unit + 256);
      high_a[1] = load256(unit + 288);
    }
    if constexpr (BITS == 6) {
      high_b[0] = load256(unit + 320);
      high_b[1] = load256(unit + 352);
    }
    if (prefetch > 0 && BITS > 4)
      for (int64_t b = 256; b < (BITS == 6 ? 384 : 320); b += 64)
        _mm_prefetch(reinterpret_cast<const char*>(unit + b + prefetch), _MM_HINT_T0);
    for (int g = 0; g < 4; g += STEPS) {
      I16 s_lo[T], s_hi[T];  // 16-bit sums (SPLIT false: s_lo only)
      for (int t = 0; t < T; ++t) s_lo[t] = s_hi[t] = zero16();
      for (int p = g; p < g + STEPS; ++p) {
        if (prefetch > 0) _mm_prefetch(reinterpret_cast<const char*>(unit + 64 * p + prefetch), _MM_HINT_T0);
        __m256i lo[2], hi[2];
        for (int h = 0; h < 2; ++h) {
          const __m256i v = load256(unit + 64 * p + 32 * h);
          lo[h] = _mm256_and_si256(v, low4);
          hi[h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
          if constexpr (BITS == 5) {
            const __m256i one = _mm256_set1_epi8(1);
            const __m128i sp = _mm_cvtsi32_si128(p), sp4 = _mm_cvtsi32_si128(p + 4);
            lo[h] = _mm256_or_si256(lo[h], _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(high_a[h], sp), one), 4));
            hi[h] = _mm256_or_si256(hi[h], _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(high_a[h], sp4), one), 4));
          }
          if constexpr (BITS == 6) {
            const __m256i three = _mm256_set1_epi8(3);
            const __m128i s2p = _mm_cvtsi32_si128(2 * p);
            lo[h] = _mm256_or_si256(lo[h], _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(high_a[h], s2p), three), 4));
            hi[h] = _mm256_or_si256(hi[h], _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(high_b[h], s2p), three), 4));
          }
        }
        for (int t = 0; t < T; ++t) {
          const __m256i xl = _mm256_set1_epi32(static_cast<int>(x4[t][quad0 + p]));
          const __m256i xh = _mm256_set1_epi32(static_cast<int>(x4[t][quad0 + p + 4]));
          const __m256i la = _mm256_maddubs_epi16(lo[0], xl), lb = _mm256_maddubs_epi16(lo[1], xl);
          const __m256i ha = _mm256_maddubs_epi16(hi[0], xh), hb = _mm256_maddubs_epi16(hi[1], xh);
          if constexpr (SPLIT) {
            s_lo[t] = {_mm256_add_epi16(s_lo[t].a, la), _mm256_add_epi16(s_lo[t].b, lb)};
            s_hi[t] = {_mm256_add_epi16(s_hi[t].a, ha), _mm256_add_epi16(s_hi[t].b, hb)};
          } else {
            s_lo[t] = {_mm256_add_epi16(s_lo[t].a, _mm256_add_epi16(la, ha)), _mm256_add_epi16(s_lo[t].b, _mm256_add_epi16(lb, hb))};
          }
        }
      }
      for (int t = 0; t < T; ++t) {  // widened, times the scales
        sum[t] = add16(sum[t], I16{_mm256_madd_epi16(s_lo[t].a, sc_lo.a), _mm256_madd_epi16(s_lo[t].b, sc_lo.b)});
        if constexpr (SPLIT)
          sum[t] = add16(sum[t], I16{_mm256_madd_epi16(s_hi[t].a, sc_hi.a), _mm256_madd_epi16(s_hi[t].b, sc_hi.b)});
      }
    }
  }
}

// y[t][16 outputs] of one output block, over all of the input, for T activation rows (gguf_microkernel.h's
// block_rows, step for step).
template <int T, int64_t TYPE>
void block_rows(const uint8_t* rec, int64_t blocks, const QuantizedRow* const* xr, float* const* y, int64_t prefetch) {
  constexpr int BITS = TYPE == kQ8_0 ? 8 : TYPE == kQ6_K ? 6 : (TYPE == kQ5_0 || TYPE == kQ5_1 || TYPE == kQ5_K) ? 5 : 4;
  constexpr bool K = TYPE == kQ4_K || TYPE == kQ5_K || TYPE == kQ6_K;
  constexpr int64_t PARAMS = TYPE == kQ4_1 || TYPE == kQ5_1 ? 64 : TYPE == kQ6_K ? 288 : K ? 320 : 32;
  constexpr int64_t UNIT = BITS == 8 ? 512 : BITS == 6 ? 384 : BITS == 5 ? 320 : 256;
  constexpr int64_t UNITS = K ? 8 : 1, RECORD = PARAMS + UNITS * UNIT;
  constexpr bool SPLIT = TYPE == kQ6_K;  // only Q6_K needs a unit's halves apart (one scale each)
  const uint32_t* x4[T];
  for (int t = 0; t < T; ++t) x4[t] = reinterpret_cast<const uint32_t*>(xr[t]->q.data());
  F16 acc_y[T];
  for (int t = 0; t < T; ++t) acc_y[t] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  auto fmadd = [](F16 a, F16 b, F16 c) { return F16{_mm256_fmadd_ps(a.a, b.a, c.a), _mm256_fmadd_ps(a.b, b.b, c.b)}; };
  auto mul = [](F16 a, __m256 s) { return F16{_mm256_mul_ps(a.a, s), _mm256_mul_ps(a.b, s)}; };
  for (int64_t b = 0; b < blocks; ++b, rec += RECORD) {
    if (prefetch > 0)
      for (int64_t off = 0; off < PARAMS; off += 64) _mm_prefetch(reinterpret_cast<const char*>(rec + off + prefetch), _MM_HINT_T0);
    const F16 d = fp16x16(rec);
    const uint8_t* units = rec + PARAMS;
    if constexpr (!K) {  // one 32-input unit per block
      I16 dot[T];
      for (int t = 0; t < T; ++t) dot[t] = zero16();
      const I16 ones = {_mm256_set1_epi16(1), _mm256_set1_epi16(1)};
      unit_dot<T, BITS, false>(units, x4, 8 * b, ones, ones, dot, prefetch);
      for (int t = 0; t < T; ++t) {
        const float dx = xr[t]->d[b];
        const int32_t sx = xr[t]->sums[b];
        if constexpr (TYPE == kQ4_1 || TYPE == kQ5_1) {  // d q + m: d dx sum(q x) + m dx sum(x)
          acc_y[t] = fmadd(mul(d, _mm256_set1_ps(dx)), cvt16(dot[t]), acc_y[t]);
          const F16 m = fp16x16(rec + 32);
          const __m256 s = _mm256_set1_ps(dx * static_cast<float>(sx));
          acc_y[t] = fmadd(m, F16{s, s}, acc_y[t]);
        } else {  // d (q - offset): the integer sum first (Q8_0's dot is already of q - 128)
          constexpr int OFFSET = TYPE == kQ4_0 ? 8 : TYPE == kQ5_0 ? 16 : 0;
          const __m256i off = _mm256_set1_epi32(OFFSET * sx);
          const I16 sumi = {_mm256_sub_epi32(dot[t].a, off), _mm256_sub_epi32(dot[t].b, off)};
          acc_y[t] = fmadd(mul(d, _mm256_set1_ps(dx)), cvt16(sumi), acc_y[t]);
        }
      }
    } else {  // 256 inputs: 8 units; integer sums over the block scaled by the sub-block scales
      I16 sumi[T];
      for (int t = 0; t < T; ++t) sumi[t] = zero16();
      for (int u = 0; u < 8; ++u) {
        I16 sc_lo, sc_hi;  // the unit's scales (Q6_K: of each 16-input half, signed)
        if constexpr (TYPE == kQ6_K) {  // two 16-input groups per unit (their scales one 16-bit pair)
          const uint8_t* at = rec + 32 + 32 * u;
          const I16 pair = {_mm256_cvtepi8_epi16(load128(at)), _mm256_cvtepi8_epi16(load128(at + 16))};
          auto first_of_pair = [](__m256i v) { return _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(v, 0xA0), 0xA0); };
          auto second_of_pair = [](__m256i v) { return _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(v, 0xF5), 0xF5); };
          sc_lo = {first_of_pair(pair.a), first_of_pair(pair.b)};
          sc_hi = {second_of_pair(pair.a), second_of_pair(pair.b)};
        } else {
          const uint8_t* at = rec + 64 + 16 * u;
          sc_lo = sc_hi = {twice16(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(at)))),
                           twice16(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(at + 8))))};
        }
        unit_dot<T, BITS, SPLIT>(units + u * UNIT, x4, 64 * b + 8 * u, sc_lo, sc_hi, sumi, prefetch);
      }
      // The terms that do not depend on the codes, from the rows' code sums in 16-bit pairs (VPMADDWD).
      I16 offset[T];
      for (int t = 0; t < T; ++t) offset[t] = zero16();
      constexpr int PAIRS = TYPE == kQ6_K ? 8 : 4;
      for (int i = 0; i < PAIRS; ++i) {
        const uint8_t* at = rec + (TYPE == kQ6_K ? 32 : 192) + 32 * i;
        const I16 pair = TYPE == kQ6_K ? I16{_mm256_cvtepi8_epi16(load128(at)), _mm256_cvtepi8_epi16(load128(at + 16))}
                                       : I16{_mm256_cvtepu8_epi16(load128(at)), _mm256_cvtepu8_epi16(load128(at + 16))};
        for (int t = 0; t < T; ++t) {
          const __m256i s = _mm256_set1_epi32((TYPE == kQ6_K ? xr[t]->pairs16 : xr[t]->pairs32)[PAIRS * b + i]);
          offset[t] = add16(offset[t], I16{_mm256_madd_epi16(pair.a, s), _mm256_madd_epi16(pair.b, s)});
        }
      }
      for (int t = 0; t < T; ++t) {
        const __m256 dx = _mm256_set1_ps(xr[t]->d[b]);
        if constexpr (TYPE == kQ6_K) {
          const I16 q = {_mm256_sub_epi32(sumi[t].a, _mm256_slli_epi32(offset[t].a, 5)),
                         _mm256_sub_epi32(sumi[t].b, _mm256_slli_epi32(offset[t].b, 5))};
          acc_y[t] = fmadd(mul(d, dx), cvt16(q), acc_y[t]);
        } else {
          acc_y[t] = fmadd(mul(d, dx), cvt16(sumi[t]), acc_y[t]);
          const F16 dmin = mul(fp16x16(rec + 32), dx), mins = cvt16(offset[t]);
          acc_y[t] = {_mm256_fnmadd_ps(dmin.a, mins.a, acc_y[t].a), _mm256_fnmadd_ps(dmin.b, mins.b, acc_y[t].b)};
        }
      }
    }
  }
  for (int t = 0; t < T; ++t) {
    _mm256_storeu_ps(y[t], acc_y[t].a);
    _mm256_storeu_ps(y[t] + 8, acc_y[t].b);
  }
}

}  // namespace gguf
#endif
