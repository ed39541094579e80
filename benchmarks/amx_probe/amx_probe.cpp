// Would AMX make a verification pass (K+1 = 5 rows) cheaper than AVX-512 VNNI? A standalone probe on
// the shape that dominates the 1.5B target (a Q4_K-like 8960 x 1536 matrix in gguf_matmul's packed layout:
// 16 outputs x 32 inputs per 256-byte unit, one 6-bit scale per unit and output).
//
//   g++ -O3 -march=native -DROWS=5 -o /tmp/amx_probe benchmarks/amx_probe/amx_probe.cpp && /tmp/amx_probe
//
// vnni: gguf_matmul's way (vpdpbusd, one instruction per row, input quad and 16 outputs).
// amx:  the unit's nibbles unpacked to bytes, then tdpbsud on tiles. The per-unit scales mean a tile can sum
//       at most one unit (32 inputs) per output before it is scaled, so the result tile is stored and read
//       back per unit. Two units share one tdpbsud here (a block-diagonal A tile: rows of unit 0 hold its
//       inputs in bytes 0..31 and zeros after, rows of unit 1 the reverse), and the unpacking of a block of
//       8 units overlaps the tile work of the previous block.
// Both give the same int32 sums (checked). One thread; the best of 5 rounds of 20 products.
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#ifndef ROWS
#define ROWS 5
#endif
constexpr int T = ROWS, N = 8960, K = 1536, UNITS = K / 32;

void vnni(const uint8_t* w, const uint8_t* sc, const int8_t* x, int32_t* y) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  for (int ob = 0; ob < N / 16; ++ob) {
    __m512i sum[T];
    for (int t = 0; t < T; ++t) sum[t] = _mm512_setzero_si512();
    for (int u = 0; u < UNITS; ++u) {
      const uint8_t* unit = w + (static_cast<size_t>(ob) * UNITS + u) * 256;
      __m512i acc[T];
      for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_si512();
      for (int p = 0; p < 4; ++p) {
        const __m512i v = _mm512_loadu_si512(unit + 64 * p);
        const __m512i lo = _mm512_and_si512(v, low4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
        for (int t = 0; t < T; ++t) {
          const uint32_t* x4 = reinterpret_cast<const uint32_t*>(x + static_cast<size_t>(t) * K);
          acc[t] = _mm512_dpbusd_epi32(acc[t], lo, _mm512_set1_epi32(static_cast<int>(x4[8 * u + p])));
          acc[t] = _mm512_dpbusd_epi32(acc[t], hi, _mm512_set1_epi32(static_cast<int>(x4[8 * u + p + 4])));
        }
      }
      const __m512i s = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + (static_cast<size_t>(ob) * UNITS + u) * 16)));
      for (int t = 0; t < T; ++t) sum[t] = _mm512_add_epi32(sum[t], _mm512_mullo_epi32(acc[t], s));
    }
    for (int t = 0; t < T; ++t) _mm512_storeu_si512(y + static_cast<size_t>(t) * N + ob * 16, sum[t]);
  }
}

struct TileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

void amx(const uint8_t* w, const uint8_t* sc, const int8_t* x, int32_t* y) {
  std::vector<int8_t> a(static_cast<size_t>(UNITS) * T * 64, 0);  // block-diagonal A tiles, per pair of units
  for (int u = 0; u < UNITS; ++u)
    for (int t = 0; t < T; ++t)
      std::memcpy(&a[((static_cast<size_t>(u / 2) * 2 + u % 2) * T + t) * 64 + 32 * (u % 2)], x + static_cast<size_t>(t) * K + 32 * u, 32);
  TileConfig cfg{};
  cfg.palette = 1;
  for (int i = 0; i < 6; ++i) cfg.rows[i] = 2 * T, cfg.colsb[i] = 64;  // 0, 1: results; 4, 5: A
  for (int i = 6; i < 8; ++i) cfg.rows[i] = 16, cfg.colsb[i] = 64;     // B: two units' bytes
  _tile_loadconfig(&cfg);
  constexpr int BLOCK = 8;
  alignas(64) uint8_t b[2][BLOCK][512];
  alignas(64) int32_t c[2][BLOCK][T][16];
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  for (int ob = 0; ob < N / 16; ++ob) {
    __m512i sum[T];
    for (int t = 0; t < T; ++t) sum[t] = _mm512_setzero_si512();
    for (int blk = 0; blk <= UNITS / BLOCK; ++blk) {
      const int cur = blk & 1;
      if (blk < UNITS / BLOCK)
        for (int d = 0; d < BLOCK; ++d) {
          const uint8_t* unit = w + (static_cast<size_t>(ob) * UNITS + blk * BLOCK + d) * 256;
          for (int p = 0; p < 4; ++p) {
            const __m512i v = _mm512_loadu_si512(unit + 64 * p);
            _mm512_store_si512(b[cur][d] + 64 * p, _mm512_and_si512(v, low4));
            _mm512_store_si512(b[cur][d] + 64 * (p + 4), _mm512_and_si512(_mm512_srli_epi16(v, 4), low4));
          }
        }
      if (blk > 0)  // the previous block's sums, scaled
        for (int d = 0; d < BLOCK; ++d) {
          const size_t u = static_cast<size_t>(ob) * UNITS + (blk - 1) * BLOCK + d;
          const __m512i s = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + u * 16)));
          for (int t = 0; t < T; ++t) sum[t] = _mm512_add_epi32(sum[t], _mm512_mullo_epi32(_mm512_load_si512(c[cur ^ 1][d][t]), s));
        }
      if (blk < UNITS / BLOCK)
        for (int d = 0; d < BLOCK; d += 4) {
          const int u = blk * BLOCK + d;
          _tile_zero(0);
          _tile_zero(1);
          _tile_loadd(4, &a[static_cast<size_t>(u / 2) * 2 * T * 64], 64);
          _tile_loadd(5, &a[static_cast<size_t>(u / 2 + 1) * 2 * T * 64], 64);
          _tile_loadd(6, b[cur][d], 64);
          _tile_loadd(7, b[cur][d + 2], 64);
          _tile_dpbsud(0, 4, 6);
          _tile_dpbsud(1, 5, 7);
          _tile_stored(0, c[cur][d], 64);
          _tile_stored(1, c[cur][d + 2], 64);
        }
    }
    for (int t = 0; t < T; ++t) _mm512_storeu_si512(y + static_cast<size_t>(t) * N + ob * 16, sum[t]);
  }
  _tile_release();
}

int main() {
  if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) != 0) {
    std::puts("no AMX permission");
    return 1;
  }
  std::mt19937 rng(1);
  std::vector<uint8_t> w(static_cast<size_t>(N) / 16 * UNITS * 256), sc(static_cast<size_t>(N) / 16 * UNITS * 16);
  std::vector<int8_t> x(static_cast<size_t>(T) * K);
  for (auto& v : w) v = static_cast<uint8_t>(rng());
  for (auto& v : sc) v = static_cast<uint8_t>(rng() & 63);
  for (auto& v : x) v = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
  std::vector<int32_t> y_vnni(static_cast<size_t>(T) * N), y_amx(static_cast<size_t>(T) * N);
  auto best_ms = [&](auto fn, std::vector<int32_t>& y) {
    double best = 1e30;
    for (int round = 0; round < 5; ++round) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 20; ++i) fn(w.data(), sc.data(), x.data(), y.data());
      best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / 20);
    }
    return best;
  };
  const double v = best_ms(vnni, y_vnni), a = best_ms(amx, y_amx);
  std::printf("{\"rows\": %d, \"vnni_ms\": %.3f, \"amx_ms\": %.3f, \"equal\": %s}\n", T, v, a, y_vnni == y_amx ? "true" : "false");
  return y_vnni == y_amx ? 0 : 1;
}
