// Activations quantized row by row as gguf_matmul multiplies them (gguf_activations.cpp).
//
// Each row is quantized on its own, as llama.cpp does for the weights' dot-product type:
// per 32 inputs (Q8_0: d = absmax / 127 rounded to fp16) for the 32-weight types, per 256 (Q8_K: d = -max /
// 127 for the value of largest magnitude) for the K-quants. Integer dot products are exact, every output is
// summed in a fixed order, and a row's result depends on that row only (exact speculative verification).
#pragma once
#include <cstdint>
#include <vector>

namespace gguf {

// One row quantized for the 32-weight types (Q8_0: per 32, d = absmax / 127 stored as fp16, codes
// round(x / d) to nearest even) or for the K-quants (Q8_K: per 256, d = -max / 127 with max the value of
// largest magnitude, codes min(127, round(x * -127 / max))). sums[g]: the codes' sum per 32 inputs (Q8_0)
// or per 16 (Q8_K), which the weights' offsets and mins multiply. Q8_K's sums also go in 16-bit pairs
// (low half first), as the K-quant kernels' VPDPWSSD takes them: pairs16 per 32 inputs (two sums of 16),
// pairs32 per 64 (two sums of 32). A sum of 32 codes fits: |sum| <= 32 * 127.
struct QuantizedRow {
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int32_t> sums;
  std::vector<int32_t> pairs16, pairs32;
};

// Defined where gguf_matmul was compiled (SPECLM_GGUF_SIMD, gguf_format.h).
void quantize_q8_0(const float* x, int64_t k, QuantizedRow& r);
void quantize_q8_k(const float* x, int64_t k, QuantizedRow& r);

}  // namespace gguf
