// The VM core's integer dot-product peak: independent VPDPBUSD (12 accumulators), one dependent chain, and
// VPMULLD. Build and run: g++ -O2 -mavx512f -mavx512bw -mavx512vnni vnni_peak.cpp -o /tmp/vnni_peak && /tmp/vnni_peak
// Its output on the AMD EPYC VM of code_epyc.md: vnni_peak_epyc.txt.
#include <immintrin.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
static void once() {
  __m512i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_epi32(i);
  __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(5);
  const long N = 200000000 / 12;
  auto t0 = std::chrono::steady_clock::now();
  for (long n = 0; n < N; ++n) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
    __asm__ volatile("" : "+v"(a));
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int sum = 0; for (int i = 0; i < 12; ++i) sum += _mm512_reduce_add_epi32(acc[i]);
  printf("dpbusd zmm: %.2f G/s (%.1f GMAC/s)  [%d]\n", N * 12 / s / 1e9, N * 12 * 64 / s / 1e9, sum);
  // latency: one chain
  __m512i c = _mm512_set1_epi32(1);
  t0 = std::chrono::steady_clock::now();
  for (long n = 0; n < 100000000; ++n) c = _mm512_dpbusd_epi32(c, a, b);
  s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  printf("dependent chain: %.3f ns per dpbusd [%d]\n", s / 1e8 * 1e9, _mm512_reduce_add_epi32(c));
  // mullo throughput
  __m512i m[12]; for (int i = 0; i < 12; ++i) m[i] = _mm512_set1_epi32(i + 1);
  t0 = std::chrono::steady_clock::now();
  for (long n = 0; n < N; ++n) { for (int i = 0; i < 12; ++i) m[i] = _mm512_mullo_epi32(m[i], b); __asm__ volatile("" : "+v"(b)); }
  s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  sum = 0; for (int i = 0; i < 12; ++i) sum += _mm512_reduce_add_epi32(m[i]);
  printf("mullo zmm: %.2f G/s [%d]\n", N * 12 / s / 1e9, sum);
}
int main() {  // five samples a second apart: the rate moves with what shares the core
  for (int i = 0; i < 5; ++i) {
    once();
    sleep(1);
  }
}
