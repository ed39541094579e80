// The integer-weight matmuls: int4 weight-only (bf16 activations, AVX-512 BF16 or AVX2) and w8a8 (int8 activations,
// AVX-512 VNNI; an int4 model's lm_head). Each row's result depends on that row only.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

// -- int4 weight-only matmul ---------------------------------------------------------------------
// y [M, N] bf16 = x [M, K] bf16 @ W.T, W[n, k] = (q[n, k] - 8) * scale[g, n] + zero[g, n] for the group
// g = k / group_size (torch's int4 grid). scales_and_zeros [N/16, K/group, 16, 2] bf16: torch's (scale, zero)
// pairs regrouped so that one output block reads its groups' pairs in one sequential stream.
// q is packed per block of 16 outputs and 8 inputs, 64 bytes (pack_int4 in quant_linear.py): byte 2l+e
// holds q[l, k+e] (low nibble) and q[l, k+2+e] (high), byte 32+2l+e holds q[l, k+4+e] and q[l, k+6+e].
// Activations are not requantized: every product of a code and a bf16 activation is exact in fp32, and
// is summed in fp32. Two instruction sets compute it:
// - AVX-512 BF16: nibbles become the bf16 values q-8 through a table, and vdpbf16ps multiplies them by
//   pairs of activations;
// - AVX2 with FMA: nibbles become fp32 codes q, FMAs sum q * x per group, and the group adds
//   scale * sum(q x) + (zero - 8 scale) * sum(x).
// Each output block of each row is computed in a fixed order by one thread: a row's result does not depend
// on the other rows of the call (exact speculative verification).
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#define SPECLM_INT4_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__)
#define SPECLM_INT4_AVX2 1
#endif

#if defined(SPECLM_INT4_AVX512) || defined(SPECLM_INT4_AVX2)
constexpr bool kInt4Available = true;

namespace {
struct Int4Call {  // one int4_matmul call, shared by its output blocks
  const void* x_rows;      // [m, k_in]: the activations as int4_rows gives them
  const float* x_sums;     // [m, groups]: each row's sum over each group of inputs
  const uint8_t* packed;
  const uint32_t* scale_zero;  // (scale, zero) bf16 pairs
  int64_t m, k_in, n_out, group_size, groups;
  c10::BFloat16* y;  // [m, n_out]
};

#if defined(SPECLM_INT4_AVX512)
constexpr int kRowTile = 8;
at::Tensor int4_rows(const at::Tensor& xc) { return xc; }  // read in place, as bf16 pairs

template <int T>
void int4_block(const uint32_t* const* x_pairs, const float* const* x_sums, const uint8_t* packed,
                const uint32_t* scale_zero, int64_t k_in, int64_t group_size,
                c10::BFloat16* const* y, int64_t block) {
  alignas(64) static const int16_t table_words[32] = {
      // bf16 bit patterns of -8..7, twice (vpermw reads the low 5 bits of each index)
      (int16_t)0xC100, (int16_t)0xC0E0, (int16_t)0xC0C0, (int16_t)0xC0A0, (int16_t)0xC080, (int16_t)0xC040,
      (int16_t)0xC000, (int16_t)0xBF80, 0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0,
      (int16_t)0xC100, (int16_t)0xC0E0, (int16_t)0xC0C0, (int16_t)0xC0A0, (int16_t)0xC080, (int16_t)0xC040,
      (int16_t)0xC000, (int16_t)0xBF80, 0x0000, 0x3F80, 0x4000, 0x4040, 0x4080, 0x40A0, 0x40C0, 0x40E0};
  const __m512i table = _mm512_load_si512(table_words);
  const __m512i high_mask = _mm512_set1_epi32((int)0xFFFF0000u);
  const int64_t octets = k_in / 8, groups = k_in / group_size, octets_per_group = group_size / 8;
  const uint8_t* w = packed + block * octets * 64;
  __m512 y_acc[T];
  for (int t = 0; t < T; ++t) y_acc[t] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512 dot[T];
    for (int t = 0; t < T; ++t) dot[t] = _mm512_setzero_ps();
    for (int64_t o = g * octets_per_group; o < (g + 1) * octets_per_group; ++o) {
      const __m512i v0 = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + o * 64)));
      const __m512i v1 = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + o * 64 + 32)));
      const __m512bh a = (__m512bh)_mm512_permutexvar_epi16(v0, table);
      const __m512bh b = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(v0, 4), table);
      const __m512bh c = (__m512bh)_mm512_permutexvar_epi16(v1, table);
      const __m512bh d = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(v1, 4), table);
      for (int t = 0; t < T; ++t) {
        const uint32_t* xp = x_pairs[t] + o * 4;
        dot[t] = _mm512_dpbf16_ps(dot[t], a, (__m512bh)_mm512_set1_epi32((int)xp[0]));
        dot[t] = _mm512_dpbf16_ps(dot[t], b, (__m512bh)_mm512_set1_epi32((int)xp[1]));
        dot[t] = _mm512_dpbf16_ps(dot[t], c, (__m512bh)_mm512_set1_epi32((int)xp[2]));
        dot[t] = _mm512_dpbf16_ps(dot[t], d, (__m512bh)_mm512_set1_epi32((int)xp[3]));
      }
    }
    const __m512i sz = _mm512_loadu_si512(scale_zero + (block * groups + g) * 16);
    const __m512 scale = _mm512_castsi512_ps(_mm512_slli_epi32(sz, 16));
    const __m512 zero = _mm512_castsi512_ps(_mm512_and_si512(sz, high_mask));
    for (int t = 0; t < T; ++t) {
      y_acc[t] = _mm512_fmadd_ps(scale, dot[t], y_acc[t]);
      y_acc[t] = _mm512_fmadd_ps(zero, _mm512_set1_ps(x_sums[t][g]), y_acc[t]);
    }
  }
  for (int t = 0; t < T; ++t)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[t] + block * 16), (__m256i)_mm512_cvtneps_pbh(y_acc[t]));
}
using Int4Block = void (*)(const uint32_t* const*, const float* const*, const uint8_t*, const uint32_t*, int64_t,
                           int64_t, c10::BFloat16* const*, int64_t);
const Int4Block kInt4Blocks[kRowTile] = {int4_block<1>, int4_block<2>, int4_block<3>, int4_block<4>,
                                         int4_block<5>, int4_block<6>, int4_block<7>, int4_block<8>};

void int4_output_block(const Int4Call& c, int64_t block) {  // the rows in tiles: each tile reads the weights once
  for (int64_t r0 = 0; r0 < c.m; r0 += kRowTile) {
    const int tile = static_cast<int>(std::min<int64_t>(kRowTile, c.m - r0));
    const uint32_t* x_pairs[kRowTile];
    const float* x_sums[kRowTile];
    c10::BFloat16* rows[kRowTile];
    for (int t = 0; t < tile; ++t) {
      x_pairs[t] = static_cast<const uint32_t*>(c.x_rows) + (r0 + t) * c.k_in / 2;
      x_sums[t] = c.x_sums + (r0 + t) * c.groups;
      rows[t] = c.y + (r0 + t) * c.n_out;
    }
    kInt4Blocks[tile - 1](x_pairs, x_sums, c.packed, c.scale_zero, c.k_in, c.group_size, rows, block);
  }
}
#else
// The rows in tiles of up to kRowTile, each tile reading the weights once. Every row takes the same steps
// whatever its tile: per half of 8 outputs and group of inputs, 2 FMA chains (inputs k mod 2) summed in a
// fixed order, so a row's sums never depend on how many rows the call has.
constexpr int kRowTile = 4;
at::Tensor int4_rows(const at::Tensor& xc) { return xc.to(at::kFloat); }  // exact; broadcast from memory

template <int T>
void int4_tile(const float* const* x, const float* const* x_sums, const Int4Call& c, float (*out)[16],
               int64_t block) {
  const __m256i nibble = _mm256_set1_epi32(0xF);
  const __m256i high_mask = _mm256_set1_epi32((int)0xFFFF0000u);
  const int64_t octets_per_group = c.group_size / 8;
  const uint8_t* w = c.packed + block * (c.k_in / 8) * 64;
  for (int half = 0; half < 2; ++half) {  // outputs 8 half .. 8 half + 7: bytes 16 half.. of each 32
    __m256 y_acc[T];
    for (int t = 0; t < T; ++t) y_acc[t] = _mm256_setzero_ps();
    for (int64_t g = 0; g < c.groups; ++g) {
      __m256 dot[T][2];
      for (int t = 0; t < T; ++t) dot[t][0] = dot[t][1] = _mm256_setzero_ps();
      for (int64_t o = g * octets_per_group; o < (g + 1) * octets_per_group; ++o) {
        const uint8_t* wo = w + o * 64 + 16 * half;
        // dword l = byte 2l | byte 2l+1 << 8: the codes of inputs k, k+1, k+2, k+3 at bits 0, 8, 4, 12
        const __m256i words[2] = {_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wo))),
                                  _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wo + 32)))};
        for (int j = 0; j < 8; ++j) {
          static constexpr int kShift[4] = {0, 8, 4, 12};
          const __m256 q =
              _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(words[j / 4], kShift[j % 4]), nibble));
          for (int t = 0; t < T; ++t)
            dot[t][j % 2] = _mm256_fmadd_ps(q, _mm256_broadcast_ss(x[t] + o * 8 + j), dot[t][j % 2]);
        }
      }
      const __m256i sz = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(c.scale_zero + (block * c.groups + g) * 16 + 8 * half));
      const __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(sz, 16));
      const __m256 zero = _mm256_castsi256_ps(_mm256_and_si256(sz, high_mask));
      const __m256 offset = _mm256_fnmadd_ps(_mm256_set1_ps(8.0f), scale, zero);  // the codes are q, not q - 8
      for (int t = 0; t < T; ++t) {
        y_acc[t] = _mm256_fmadd_ps(scale, _mm256_add_ps(dot[t][0], dot[t][1]), y_acc[t]);
        y_acc[t] = _mm256_fmadd_ps(offset, _mm256_set1_ps(x_sums[t][g]), y_acc[t]);
      }
    }
    for (int t = 0; t < T; ++t) _mm256_storeu_ps(out[t] + 8 * half, y_acc[t]);
  }
}

using Int4Tile = void (*)(const float* const*, const float* const*, const Int4Call&, float (*)[16], int64_t);
const Int4Tile kInt4Tiles[kRowTile] = {int4_tile<1>, int4_tile<2>, int4_tile<3>, int4_tile<4>};

void int4_output_block(const Int4Call& c, int64_t block) {
  for (int64_t r0 = 0; r0 < c.m; r0 += kRowTile) {
    const int tile = static_cast<int>(std::min<int64_t>(kRowTile, c.m - r0));
    const float* x[kRowTile];
    const float* x_sums[kRowTile];
    for (int t = 0; t < tile; ++t) {
      x[t] = static_cast<const float*>(c.x_rows) + (r0 + t) * c.k_in;
      x_sums[t] = c.x_sums + (r0 + t) * c.groups;
    }
    float out[kRowTile][16];
    kInt4Tiles[tile - 1](x, x_sums, c, out, block);
    for (int t = 0; t < tile; ++t)
      for (int l = 0; l < 16; ++l) c.y[(r0 + t) * c.n_out + block * 16 + l] = c10::BFloat16(out[t][l]);  // nearest even
  }
}
#endif
}  // namespace

at::Tensor int4_matmul(const at::Tensor& x, const at::Tensor& packed, int64_t group_size,
                       const at::Tensor& scales_and_zeros) {  // torch's _weight_int4pack_mm_for_cpu argument order
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16, "int4_matmul: x [M, K] bf16");
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == at::kByte && packed.size(2) == 64 && packed.is_contiguous(),
              "int4_matmul: packed [N/16, K/8, 64] uint8");
  TORCH_CHECK(scales_and_zeros.scalar_type() == at::kBFloat16 && scales_and_zeros.is_contiguous() &&
              scales_and_zeros.dim() == 4, "int4_matmul: scales_and_zeros [N/16, K/group, 16, 2] bf16");
  auto xc = x.contiguous();
  const int64_t m = xc.size(0), k_in = xc.size(1), n_out = packed.size(0) * 16;
  TORCH_CHECK(packed.size(1) * 8 == k_in && group_size % 8 == 0 && k_in % group_size == 0, "int4_matmul: shapes");
  TORCH_CHECK(scales_and_zeros.size(0) == n_out / 16 && scales_and_zeros.size(1) == k_in / group_size,
              "int4_matmul: scale shape");
  auto y = at::empty({m, n_out}, xc.options());
  const int64_t groups = k_in / group_size;
  std::vector<float> sums(m * groups);
  const c10::BFloat16* xp = xc.data_ptr<c10::BFloat16>();
  for (int64_t r = 0; r < m; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      float s = 0.0f;
      for (int64_t k = g * group_size; k < (g + 1) * group_size; ++k) s += static_cast<float>(xp[r * k_in + k]);
      sums[r * groups + g] = s;
    }
  const at::Tensor rows = int4_rows(xc);
  const Int4Call call{rows.data_ptr(), sums.data(), packed.data_ptr<uint8_t>(),
                      reinterpret_cast<const uint32_t*>(scales_and_zeros.data_ptr<c10::BFloat16>()),
                      m, k_in, n_out, group_size, groups, y.data_ptr<c10::BFloat16>()};
  at::parallel_for(0, n_out / 16, 1, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) int4_output_block(call, block);
  });
  return y;
}
#else
constexpr bool kInt4Available = false;

at::Tensor int4_matmul(const at::Tensor&, const at::Tensor&, int64_t, const at::Tensor&) {
  TORCH_CHECK(false, "int4_matmul: this build has neither AVX-512 BF16 nor AVX2 (check int4_available() first)");
}
#endif

bool int4_available() { return kInt4Available; }

std::string int4_path() {
#if defined(SPECLM_INT4_AVX512)
  return "AVX-512 BF16";
#elif defined(SPECLM_INT4_AVX2)
  return "AVX2";
#else
  return "";
#endif
}


// -- w8a8 matmul (an int4 model's lm_head) --------------------------------------------------------
// y [M, N] fp32 = x [M, K] fp32 @ W.T with W = q [N, K] int8 * scale[n], and each row of x quantized
// on its own to int8 (absmax / 127, round to nearest even): integer products summed exactly with
// AVX-512 VNNI (vpdpbusd, activations offset by 128 to unsigned, corrected by 128 * sum_k q[n, k]).
// Packed q (pack_int8 in w8a8_linear.py): per block of 16 outputs and 4 inputs, 64 bytes; byte 4l+j
// holds q[l, k+j]. A row's result depends on that row only.
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
constexpr bool kInt8Available = true;

namespace {
template <int T>
void int8_block(const uint32_t* const* x_quads, const float* row_scales, const int8_t* packed,
                const float* weight_scales, const int32_t* weight_sums, int64_t k_in, float* const* y,
                int64_t block) {
  const int64_t quads = k_in / 4;
  const int8_t* w = packed + block * quads * 64;
  __m512i acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_si512();
  for (int64_t q = 0; q < quads; ++q) {
    const __m512i wq = _mm512_loadu_si512(w + q * 64);
    for (int t = 0; t < T; ++t) acc[t] = _mm512_dpbusd_epi32(acc[t], _mm512_set1_epi32((int)x_quads[t][q]), wq);
  }
  const __m512i correction = _mm512_slli_epi32(_mm512_loadu_si512(weight_sums + block * 16), 7);  // 128 * sum q
  const __m512 scales = _mm512_loadu_ps(weight_scales + block * 16);
  for (int t = 0; t < T; ++t) {
    const __m512 dot = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[t], correction));
    _mm512_storeu_ps(y[t] + block * 16, _mm512_mul_ps(dot, _mm512_mul_ps(scales, _mm512_set1_ps(row_scales[t]))));
  }
}

using Int8Block = void (*)(const uint32_t* const*, const float*, const int8_t*, const float*, const int32_t*, int64_t,
                           float* const*, int64_t);
constexpr int kInt8RowTile = 5;  // rows per pass over the weights: more rows per pass ran slower
const Int8Block kInt8Blocks[kInt8RowTile] = {int8_block<1>, int8_block<2>, int8_block<3>, int8_block<4>,
                                             int8_block<5>};
}  // namespace

at::Tensor w8a8_matmul(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& weight_scales,
                       const at::Tensor& weight_sums) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "w8a8_matmul: x [M, K] fp32");
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == at::kChar && packed.size(2) == 64 && packed.is_contiguous(),
              "w8a8_matmul: packed [N/16, K/4, 64] int8");
  auto xc = x.contiguous();
  const int64_t m = xc.size(0), k_in = xc.size(1), n_out = packed.size(0) * 16;
  TORCH_CHECK(packed.size(1) * 4 == k_in, "w8a8_matmul: shapes");
  TORCH_CHECK(weight_scales.scalar_type() == at::kFloat && weight_scales.numel() == n_out && weight_scales.is_contiguous() &&
              weight_sums.scalar_type() == at::kInt && weight_sums.numel() == n_out && weight_sums.is_contiguous(),
              "w8a8_matmul: weight_scales fp32 [N], weight_sums int32 [N]");
  // Each row on its own int8 grid, stored offset by 128 (unsigned, for vpdpbusd).
  std::vector<uint8_t> x_u8(m * k_in);
  std::vector<float> row_scales(m);
  const float* xp = xc.data_ptr<float>();
  for (int64_t r = 0; r < m; ++r) {
    const float* row = xp + r * k_in;
    float absmax = 0.0f;
    for (int64_t k = 0; k < k_in; ++k) absmax = std::max(absmax, std::fabs(row[k]));
    absmax = std::max(absmax, 1e-30f);
    const float inv = 127.0f / absmax;
    for (int64_t k = 0; k < k_in; ++k) x_u8[r * k_in + k] = static_cast<uint8_t>(std::nearbyint(row[k] * inv) + 128.0f);
    row_scales[r] = absmax / 127.0f;
  }
  auto y = at::empty({m, n_out}, xc.options());
  const int8_t* wp = packed.data_ptr<int8_t>();
  const float* ws = weight_scales.data_ptr<float>();
  const int32_t* wsum = weight_sums.data_ptr<int32_t>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, n_out / 16, 1, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      for (int64_t r0 = 0; r0 < m; r0 += kInt8RowTile) {
        const int tile = static_cast<int>(std::min<int64_t>(kInt8RowTile, m - r0));
        const uint32_t* quads[kInt8RowTile];
        float* rows[kInt8RowTile];
        for (int t = 0; t < tile; ++t) {
          quads[t] = reinterpret_cast<const uint32_t*>(x_u8.data() + (r0 + t) * k_in);
          rows[t] = yp + (r0 + t) * n_out;
        }
        kInt8Blocks[tile - 1](quads, row_scales.data() + r0, wp, ws, wsum, k_in, rows, block);
      }
    }
  });
  return y;
}
#else
constexpr bool kInt8Available = false;

at::Tensor w8a8_matmul(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&) {
  TORCH_CHECK(false, "w8a8_matmul: this build has no AVX-512 VNNI (check w8a8_available() first)");
}
#endif

bool w8a8_available() { return kInt8Available; }
