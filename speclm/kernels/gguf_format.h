// The repacked layout of GGUF-native weights, which the packing (gguf_pack.cpp), conversion
// (gguf_convert.cpp) and matmul (gguf_matmul.cpp) sources share.
//
// A linear layer keeps its tensor's own quantization grid (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K),
// repacked for the CPU, and multiplies int8-quantized activations (gguf_activations.h) with integer dot
// products (AVX-512 VNNI, or AVX2), the way llama.cpp computes on the same files.
//
// Repacked layout. Outputs go in blocks of 16 (one 512-bit lane each). For every output block and every
// GGUF block along the input (32 or 256 weights) there is one record: the block's parameters for the 16
// outputs (fp16 d / m / dmin as stored, K-quant sub-block scales and mins unpacked to bytes), then the
// weights' unsigned integer codes in units of 32 inputs. Per-sub-block bytes go [sub-block][output] (Q4_K,
// Q5_K scales: byte 16 j + l), or in pairs of sub-blocks (Q4_K, Q5_K mins; Q6_K scales: byte
// 32 (j / 2) + 2 l + j % 2), so that one load widens to the 16-bit pairs of a VPDPWSSD; then the codes:
// - 4-bit codes: 256 bytes, 4 vectors; byte 4l+j of vector p holds code[l][4p+j] (low nibble) and
//   code[l][4(p+4)+j] (high nibble): inputs 0..15 of the unit in low nibbles, 16..31 in high ones;
// - 5-bit codes: the 4-bit plane, then 64 bytes whose byte 4l+j has bit p = bit 4 of code[l][4p+j];
// - 6-bit codes: the 4-bit plane, then 128 bytes: bits 2p..2p+1 of byte 4l+j of vector h hold bits 4..5
//   of code[l][4(4h+p)+j];
// - 8-bit codes: 512 bytes, 8 vectors; byte 4l+j of vector p holds code[l][4p+j].
// Codes are the file's: Q4_0 q (0..15, w = d (q - 8)), Q4_1 q (w = d q + m), Q5_0 q (0..31, w = d (q - 16)),
// Q5_1 q, Q8_0 q + 128 (w = d (code - 128)), Q4_K/Q5_K q (w = d sc q - dmin mn per 32), Q6_K q (0..63,
// w = d sc (q - 32) per 16). So memory is the file's size, give or take a few percent.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

namespace gguf {

enum Type : int64_t { kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14 };

struct Geometry {
  int64_t block_weights;  // weights per GGUF block
  int64_t block_bytes;    // its bytes in the file
  int bits;               // code bits: 4, 5, 6 or 8
  int64_t param_bytes;    // parameter bytes per record (16 outputs)
  bool k_quant;           // activations per 256 (Q8_K) instead of per 32 (Q8_0)
};

inline Geometry geometry(int64_t type) {
  switch (type) {
    case kQ4_0: return {32, 18, 4, 32, false};
    case kQ4_1: return {32, 20, 4, 64, false};
    case kQ5_0: return {32, 22, 5, 32, false};
    case kQ5_1: return {32, 24, 5, 64, false};
    case kQ8_0: return {32, 34, 8, 32, false};
    case kQ4_K: return {256, 144, 4, 320, true};
    case kQ5_K: return {256, 176, 5, 320, true};
    case kQ6_K: return {256, 210, 6, 288, true};
    default: TORCH_CHECK(false, "GGUF type ", type, " is not supported");
  }
}

inline int64_t unit_bytes(int bits) { return bits == 8 ? 512 : bits == 6 ? 384 : bits == 5 ? 320 : 256; }
inline int64_t record_bytes(const Geometry& g) { return g.param_bytes + g.block_weights / 32 * unit_bytes(g.bits); }
// Where sub-block j's byte for output l lies in a record: Q4_K/Q5_K scales one sub-block after another,
// their mins and Q6_K's scales in pairs of sub-blocks (the layout above).
inline int scale_at(int64_t type, int j, int l) { return type == kQ6_K ? 32 + 32 * (j / 2) + 2 * l + j % 2 : 64 + 16 * j + l; }
inline int min_at(int j, int l) { return 192 + 32 * (j / 2) + 2 * l + j % 2; }

// The matmul and the activations' quantization need AVX-512 VNNI (gguf_microkernel.h) or AVX2 with FMA and
// F16C (gguf_microkernel_avx2.h): SPECLM_GGUF_SIMD is 512, 256, or 0 where neither was compiled.
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
#define SPECLM_GGUF_SIMD 512
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define SPECLM_GGUF_SIMD 256
#else
#define SPECLM_GGUF_SIMD 0
#endif
constexpr bool kGgufAvailable = SPECLM_GGUF_SIMD != 0;

// -- the block codec (gguf_pack.cpp) ----------------------------------------------------------------
// One GGUF block of one output row, decoded: codes[block_weights] and its parameters.
struct Decoded {
  uint8_t codes[256];
  uint16_t d = 0, m = 0;    // fp16 bits: d, and m (Q4_1, Q5_1) or dmin (Q4_K, Q5_K)
  uint8_t sc[16] = {}, mn[8] = {};  // K-quant sub-block scales (Q6_K: 16 int8 as bytes) and mins
};

float fp16_to_float(uint16_t h);
// One GGUF block of one output row (its file bytes at `b`), decoded.
void decode_block(int64_t type, const uint8_t* b, Decoded& out);

}  // namespace gguf
