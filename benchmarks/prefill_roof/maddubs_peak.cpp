// The most 8-bit multiply-adds one core can do through AVX2's densest integer instruction: eight independent
// VPMADDUBSW + VPADDW chains (32 multiply-adds each), no memory traffic. What gguf_matmul's AVX2 kernel
// (speclm/kernels/gguf_microkernel_avx2.h) spends at least one VPMADDUBSW on per 32 weights x 1 row.
// Prints multiply-adds per second (GMAC/s).
#include <immintrin.h>

#include <chrono>
#include <cstdio>

int main() {
  __m256i w[8], acc[8];
  for (int i = 0; i < 8; ++i) {
    w[i] = _mm256_set1_epi8(static_cast<char>(3 + i));
    acc[i] = _mm256_setzero_si256();
  }
  __m256i x = _mm256_set1_epi8(1);
  const long n = 200000000;
  const auto t0 = std::chrono::steady_clock::now();
  for (long k = 0; k < n; ++k) {
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) acc[i] = _mm256_add_epi16(acc[i], _mm256_maddubs_epi16(w[i], x));
    asm volatile("" : "+x"(x));  // x is unknown each round: nothing is hoisted
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  __m256i sum = acc[0];
  for (int i = 1; i < 8; ++i) sum = _mm256_add_epi16(sum, acc[i]);
  std::printf("%.2f %d\n", n * 8.0 * 32.0 / s / 1e9, _mm256_extract_epi16(sum, 0));
  return 0;
}
