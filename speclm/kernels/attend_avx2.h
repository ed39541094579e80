// attend_rows' two loops over the keys for CPUs with AVX2 but no AVX-512: there vector16.h's 16-float
// vectors are two 256-bit registers, and GCC lowers sum16x16's shuffles of them and its 16 partial sums
// through the stack (the scores ran ~10x slower than their arithmetic). These are attend_rows.cpp's
// score_blocks and accumulate_values written for 256-bit registers, with the same operations on every
// lane in the same order, so the same bits. (Products and sums are written as the generic code writes
// them, a multiply then an add: the compiler fuses them alike in both.)
#pragma once
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#define SPECLM_ATTEND_AVX2 1
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace attend_avx2 {

// One key's 16-lane products q.k (lane l: the sum over c of q[16c + l] k[16c + l]) with lanes l and l + 8
// added: the first step of sum16's tree.
template <int D>
inline __m256 half_sums(const float* q, const float* k) {
  __m256 lo = _mm256_mul_ps(_mm256_loadu_ps(q), _mm256_loadu_ps(k));
  __m256 hi = _mm256_mul_ps(_mm256_loadu_ps(q + 8), _mm256_loadu_ps(k + 8));
  for (int c = 1; c < D / 16; ++c) {
    lo = _mm256_add_ps(lo, _mm256_mul_ps(_mm256_loadu_ps(q + 16 * c), _mm256_loadu_ps(k + 16 * c)));
    hi = _mm256_add_ps(hi, _mm256_mul_ps(_mm256_loadu_ps(q + 16 * c + 8), _mm256_loadu_ps(k + 16 * c + 8)));
  }
  return _mm256_add_ps(lo, hi);
}

// Eight keys' half sums p[t] -> lane t: the rest of sum16's tree (lanes l + l+4, then l + l+2, then l + l+1).
inline __m256 sum8x8(const __m256* p) {
  auto fold = [](__m256 a, __m256 b) {  // [a's lanes l + l+4 | b's]
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
  };
  const __m256 a04 = fold(p[0], p[4]), a15 = fold(p[1], p[5]), a26 = fold(p[2], p[6]), a37 = fold(p[3], p[7]);
  // [key 0's l + l+2 (l = 0, 1), key 1's | key 4's, key 5's] and the same for keys 2, 3 | 6, 7
  const __m256 b = _mm256_add_ps(_mm256_shuffle_ps(a04, a15, 0x44), _mm256_shuffle_ps(a04, a15, 0xEE));
  const __m256 c = _mm256_add_ps(_mm256_shuffle_ps(a26, a37, 0x44), _mm256_shuffle_ps(a26, a37, 0xEE));
  return _mm256_add_ps(_mm256_shuffle_ps(b, c, 0x88), _mm256_shuffle_ps(b, c, 0xDD));
}

// attend_rows.cpp's score_blocks: 8 keys at a time.
template <int D>
int64_t score_blocks(const float* const* q, int group, const float* keys, int64_t key_stride, const int64_t* slots,
                     int64_t length, float scale, float* scores, int64_t score_stride, float* block_max) {
  const __m256 s = _mm256_set1_ps(scale);
  int64_t j = 0;
  for (; j + 16 <= length; j += 16) {
    const float* k[16];
    for (int t = 0; t < 16; ++t) k[t] = keys + (slots ? slots[j + t] : j + t) * key_stride;
    for (int g = 0; g < group; ++g) {
      for (int h = 0; h < 16; h += 8) {
        __m256 p[8];
        for (int t = 0; t < 8; ++t) p[t] = half_sums<D>(q[g], k[h + t]);
        const __m256 sums = _mm256_mul_ps(sum8x8(p), s);
        _mm256_storeu_ps(scores + g * score_stride + j + h, sums);
        float* m = block_max + 16 * g + h;
        _mm256_storeu_ps(m, _mm256_max_ps(sums, _mm256_loadu_ps(m)));  // sums > m ? sums : m, lane by lane
      }
    }
  }
  return j;
}

// attend_rows.cpp's accumulate_values: up to 64 of a head's dimensions at a time in registers (each lane
// still adds the keys in order).
template <int D>
void accumulate_values(int group, const float* values, int64_t key_stride, const int64_t* slots, int64_t length,
                       const float* scores, int64_t score_stride, float* acc, int64_t block) {
  constexpr int H = std::min(D / 8, 8);  // 8-float accumulators per sweep over a block's keys
  for (int64_t b = 0; b < length; b += block) {
    const int64_t e = std::min(length, b + block);
    for (int g = 0; g < group; ++g) {
      const float* sg = scores + g * score_stride;
      for (int d0 = 0; d0 < D; d0 += 8 * H) {
        float* out = acc + g * D + d0;
        __m256 a[H];
        for (int h = 0; h < H; ++h) a[h] = _mm256_loadu_ps(out + 8 * h);
        for (int64_t r = b; r < e; ++r) {
          const float* v = values + (slots ? slots[r] : r) * key_stride + d0;
          const __m256 p = _mm256_broadcast_ss(sg + r);
          for (int h = 0; h < H; ++h) a[h] = _mm256_add_ps(a[h], _mm256_mul_ps(p, _mm256_loadu_ps(v + 8 * h)));
        }
        for (int h = 0; h < H; ++h) _mm256_storeu_ps(out + 8 * h, a[h]);
      }
    }
  }
}

}  // namespace attend_avx2
#else
#define SPECLM_ATTEND_AVX2 0
#endif
