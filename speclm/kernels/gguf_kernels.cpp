// GGUF-native weights: a linear layer keeps its tensor's own quantization grid (Q4_0, Q4_1, Q5_0,
// Q5_1, Q8_0, Q4_K, Q5_K, Q6_K), repacked for the CPU, and multiplies int8-quantized activations with
// AVX-512 VNNI integer dot products, the way llama.cpp computes on the same files.
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
//
// Activations. Each row is quantized on its own, as llama.cpp does for the weights' dot-product type:
// per 32 inputs (Q8_0: d = absmax / 127 rounded to fp16) for the 32-weight types, per 256 (Q8_K: d = -max /
// 127 for the value of largest magnitude) for the K-quants. Integer dot products are exact, every output is
// summed in a fixed order, and a row's result depends on that row only (exact speculative verification).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#if defined(__linux__)
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#endif

namespace {

enum Type : int64_t { kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14 };

struct Geometry {
  int64_t block_weights;  // weights per GGUF block
  int64_t block_bytes;    // its bytes in the file
  int bits;               // code bits: 4, 5, 6 or 8
  int64_t param_bytes;    // parameter bytes per record (16 outputs)
  bool k_quant;           // activations per 256 (Q8_K) instead of per 32 (Q8_0)
};

Geometry geometry(int64_t type) {
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

}  // namespace

// A byte tensor whose memory the kernel is asked to back with 2 MB pages (Linux, THP in madvise mode):
// streaming a model's weights through 4 kB pages costs a TLB miss every 4 kB, and loading them a page
// fault every 4 kB. Only the 2 MB-aligned interior can be huge pages; a loader that bump-allocates its
// tensors from a few large buffers (speclm/models/gguf_weights.py: PackArena) puts nearly all of them there.
at::Tensor huge_page_buffer(int64_t bytes) {
  auto t = at::empty({bytes}, at::TensorOptions().dtype(at::kByte));
#if defined(__linux__)
  const uintptr_t huge = 2u << 20, p = reinterpret_cast<uintptr_t>(t.data_ptr());
  const uintptr_t start = (p + huge - 1) & ~(huge - 1), end = (p + static_cast<uintptr_t>(bytes)) & ~(huge - 1);
  if (end > start) madvise(reinterpret_cast<void*>(start), end - start, MADV_HUGEPAGE);
#endif
  return t;
}

// `bytes` bytes of a file from `offset` (a multiple of 2 MB), mapped as a uint8 tensor that unmaps when
// freed: a PackCache entry (a model's packed weights kept on disk, speclm/models/pack_cache.py).
// Writable: shared, so that packing writes straight into the page cache (the caller reserves the
// blocks it writes, and the file must reach offset + bytes). Read-only: private. The mapping starts on a
// 2 MB boundary and asks for huge pages, so the page cache's 2 MB folios (ext4 and xfs make them) are
// mapped as such: the weights stream through as few TLB entries as a PackArena's huge pages, and a load
// faults in 2 MB at a time, from the page cache when the file was used recently.
at::Tensor map_file(const std::string& path, int64_t offset, int64_t bytes, bool writable) {
  const int64_t huge = 2 << 20;
  TORCH_CHECK(bytes > 0 && offset >= 0 && offset % huge == 0, "map_file: bytes > 0 from a 2 MB-aligned offset");
#if defined(__linux__)
  const int fd = open(path.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
  TORCH_CHECK(fd >= 0, "map_file: cannot open ", path);
  struct stat st;
  const bool long_enough = fstat(fd, &st) == 0 && st.st_size >= offset + bytes;
  if (!long_enough) close(fd);
  TORCH_CHECK(long_enough, "map_file: ", path, " is shorter than ", offset + bytes, " bytes");
  const size_t length = static_cast<size_t>(bytes);
  // Reserve an aligned range, then map the file over it.
  void* reserved = mmap(nullptr, length + huge, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (reserved == MAP_FAILED) close(fd);
  TORCH_CHECK(reserved != MAP_FAILED, "map_file: no address space for ", bytes, " bytes");
  const uintptr_t base = reinterpret_cast<uintptr_t>(reserved), reserved_end = base + length + huge;
  const uintptr_t start = (base + huge - 1) & ~static_cast<uintptr_t>(huge - 1), end = start + length;
  void* data = mmap(reinterpret_cast<void*>(start), length, writable ? PROT_READ | PROT_WRITE : PROT_READ,
                    (writable ? MAP_SHARED : MAP_PRIVATE) | MAP_FIXED, fd, offset);
  close(fd);
  if (start > base) munmap(reserved, start - base);
  if (data == MAP_FAILED) munmap(reinterpret_cast<void*>(start), reserved_end - start);
  else if (reserved_end > end) munmap(reinterpret_cast<void*>(end), reserved_end - end);
  TORCH_CHECK(data != MAP_FAILED, "map_file: cannot map ", path);
  madvise(data, length, MADV_HUGEPAGE);
  // A read-only entry that is not in the page cache (after a reboot, or evicted) is read ahead from now on,
  // in the background, as llama.cpp does with its file: the first pass then finds its pages in memory
  // instead of faulting each one in from the disk. Nothing is mapped into this process by it (no RSS).
  if (!writable) madvise(data, length, MADV_WILLNEED);
  return at::from_blob(data, {bytes}, [length](void* p) { munmap(p, length); }, at::TensorOptions().dtype(at::kByte));
#else
  TORCH_CHECK(false, "map_file: Linux only");
#endif
}

// Make a writable map_file tensor read-only (a finished cache entry: nothing may write to it again).
void seal_mapping(const at::Tensor& mapped) {
  TORCH_CHECK(mapped.dim() == 1 && mapped.scalar_type() == at::kByte && mapped.storage_offset() == 0 &&
                  static_cast<int64_t>(mapped.storage().nbytes()) == mapped.numel(),
              "seal_mapping: a whole map_file tensor");
#if defined(__linux__)
  TORCH_CHECK(mprotect(mapped.data_ptr(), static_cast<size_t>(mapped.numel()), PROT_READ) == 0, "seal_mapping: mprotect failed");
#endif
}

namespace {

int64_t unit_bytes(int bits) { return bits == 8 ? 512 : bits == 6 ? 384 : bits == 5 ? 320 : 256; }
int64_t record_bytes(const Geometry& g) { return g.param_bytes + g.block_weights / 32 * unit_bytes(g.bits); }
// Where sub-block j's byte for output l lies in a record: Q4_K/Q5_K scales one sub-block after another,
// their mins and Q6_K's scales in pairs of sub-blocks (the layout comment at the top).
int scale_at(int64_t type, int j, int l) { return type == kQ6_K ? 32 + 32 * (j / 2) + 2 * l + j % 2 : 64 + 16 * j + l; }
int min_at(int j, int l) { return 192 + 32 * (j / 2) + 2 * l + j % 2; }

// Packing writes every byte of a full output block, so only the last one is zeroed, for its padding
// outputs (a pass over the whole model's memory is time at load).
void zero_last_block(at::Tensor& packed, int64_t block_bytes) {
  const int64_t bytes = packed.numel();
  if (bytes > 0) std::memset(packed.data_ptr<uint8_t>() + bytes - block_bytes, 0, block_bytes);
}

at::Tensor packed_buffer(int64_t out_blocks, int64_t block_bytes) {
  auto t = huge_page_buffer(out_blocks * block_bytes);
  zero_last_block(t, block_bytes);
  return t;
}

float fp16_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
  float value;
  if (exponent == 0) {
    value = std::ldexp(static_cast<float>(mantissa), -24);
  } else if (exponent == 31) {
    value = mantissa ? NAN : INFINITY;
  } else {
    uint32_t bits = ((exponent + 112) << 23) | (mantissa << 13);
    std::memcpy(&value, &bits, 4);
  }
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  bits |= sign;
  std::memcpy(&value, &bits, 4);
  return value;
}

uint16_t load16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

// One GGUF block of one output row, decoded: codes[block_weights] and its parameters.
struct Decoded {
  uint8_t codes[256];
  uint16_t d = 0, m = 0;    // fp16 bits: d, and m (Q4_1, Q5_1) or dmin (Q4_K, Q5_K)
  uint8_t sc[16] = {}, mn[8] = {};  // K-quant sub-block scales (Q6_K: 16 int8 as bytes) and mins
};

void k_scale_min(int j, const uint8_t* s, uint8_t* sc, uint8_t* mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

void decode_block(int64_t type, const uint8_t* b, Decoded& out) {
  uint8_t* q = out.codes;
  switch (type) {
    case kQ4_0:
    case kQ4_1: {
      out.d = load16(b);
      const uint8_t* qs = b + (type == kQ4_1 ? 4 : 2);
      if (type == kQ4_1) out.m = load16(b + 2);
      for (int j = 0; j < 16; ++j) {
        q[j] = qs[j] & 0xF;
        q[j + 16] = qs[j] >> 4;
      }
      break;
    }
    case kQ5_0:
    case kQ5_1: {
      out.d = load16(b);
      const int off = type == kQ5_1 ? 4 : 2;
      if (type == kQ5_1) out.m = load16(b + 2);
      uint32_t qh;
      std::memcpy(&qh, b + off, 4);
      const uint8_t* qs = b + off + 4;
      for (int j = 0; j < 16; ++j) {
        q[j] = (qs[j] & 0xF) | (((qh >> j) & 1) << 4);
        q[j + 16] = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      }
      break;
    }
    case kQ8_0:
      out.d = load16(b);
      for (int j = 0; j < 32; ++j) q[j] = static_cast<uint8_t>(static_cast<int8_t>(b[2 + j]) + 128);
      break;
    case kQ4_K:
    case kQ5_K: {
      out.d = load16(b);
      out.m = load16(b + 2);
      const uint8_t* scales = b + 4;
      for (int j = 0; j < 8; ++j) k_scale_min(j, scales, &out.sc[j], &out.mn[j]);
      const uint8_t* qh = b + 16;
      const uint8_t* ql = b + (type == kQ5_K ? 48 : 16);
      for (int j = 0; j < 4; ++j) {  // 64 weights: sub-block 2j from low nibbles, 2j+1 from high ones
        for (int l = 0; l < 32; ++l) {
          uint8_t lo = ql[32 * j + l] & 0xF, hi = ql[32 * j + l] >> 4;
          if (type == kQ5_K) {
            lo |= ((qh[l] >> (2 * j)) & 1) << 4;
            hi |= ((qh[l] >> (2 * j + 1)) & 1) << 4;
          }
          q[64 * j + l] = lo;
          q[64 * j + 32 + l] = hi;
        }
      }
      break;
    }
    case kQ6_K: {
      const uint8_t* ql = b;
      const uint8_t* qh = b + 128;
      std::memcpy(out.sc, b + 192, 16);
      out.d = load16(b + 208);
      for (int n = 0; n < 2; ++n) {  // 128 weights each
        for (int l = 0; l < 32; ++l) {
          const uint8_t h = qh[32 * n + l];
          q[128 * n + l] = (ql[64 * n + l] & 0xF) | ((h & 3) << 4);
          q[128 * n + l + 32] = (ql[64 * n + l + 32] & 0xF) | (((h >> 2) & 3) << 4);
          q[128 * n + l + 64] = (ql[64 * n + l] >> 4) | (((h >> 4) & 3) << 4);
          q[128 * n + l + 96] = (ql[64 * n + l + 32] >> 4) | (((h >> 6) & 3) << 4);
        }
      }
      break;
    }
    default: TORCH_CHECK(false, "GGUF type ", type, " is not supported");
  }
}

// Write one output row's decoded block into its record (row l of the 16 in the output block).
void pack_block(const Geometry& g, int64_t type, const Decoded& dec, int l, uint8_t* record) {
  uint16_t* d = reinterpret_cast<uint16_t*>(record);
  d[l] = dec.d;
  if (type == kQ4_1 || type == kQ5_1 || (g.k_quant && type != kQ6_K)) d[16 + l] = dec.m;
  if (type == kQ4_K || type == kQ5_K) {
    for (int j = 0; j < 8; ++j) {
      record[scale_at(type, j, l)] = dec.sc[j];
      record[min_at(j, l)] = dec.mn[j];
    }
  } else if (type == kQ6_K) {
    for (int j = 0; j < 16; ++j) record[scale_at(type, j, l)] = dec.sc[j];
  }
  uint8_t* units = record + g.param_bytes;
  const int64_t ub = unit_bytes(g.bits);
  // Input k = 4 * quad + j of a unit lands in byte 4 * l + j of row group `quad` (8-bit codes), or in the
  // low (quad < 4) or high nibble of group quad % 4, its high bits in the bit planes after byte 256.
  // Every byte of row l is written whole here (no read-modify-write), so rows pack independently.
  for (int64_t u = 0; u < g.block_weights / 32; ++u) {
    uint8_t* unit = units + u * ub + 4 * l;
    const uint8_t* c = dec.codes + 32 * u;
    if (g.bits == 8) {
      for (int quad = 0; quad < 8; ++quad) std::memcpy(unit + 64 * quad, c + 4 * quad, 4);
      continue;
    }
    for (int quad = 0; quad < 4; ++quad)
      for (int j = 0; j < 4; ++j)
        unit[64 * quad + j] = static_cast<uint8_t>((c[4 * quad + j] & 0xF) | ((c[16 + 4 * quad + j] & 0xF) << 4));
    if (g.bits == 5) {
      for (int j = 0; j < 4; ++j) {
        uint8_t plane = 0;
        for (int quad = 0; quad < 8; ++quad) plane |= static_cast<uint8_t>(((c[4 * quad + j] >> 4) & 1) << quad);
        unit[256 + j] = plane;
      }
    } else if (g.bits == 6) {
      for (int half = 0; half < 2; ++half)
        for (int j = 0; j < 4; ++j) {
          uint8_t plane = 0;
          for (int q = 0; q < 4; ++q) plane |= static_cast<uint8_t>(((c[4 * (4 * half + q) + j] >> 4) & 3) << (2 * q));
          unit[256 + 64 * half + j] = plane;
        }
    }
  }
}

// The code of input k of row l in a record (the inverse of pack_block's placement).
int record_code(const Geometry& g, const uint8_t* record, int l, int64_t k) {
  const uint8_t* unit = record + g.param_bytes + (k / 32) * unit_bytes(g.bits);
  const int kk = static_cast<int>(k % 32), quad = kk / 4, byte = 4 * l + kk % 4;
  if (g.bits == 8) return unit[64 * quad + byte];
  const uint8_t slot = unit[64 * (quad % 4) + byte];
  int code = quad < 4 ? (slot & 0xF) : (slot >> 4);
  if (g.bits == 5) code |= ((unit[256 + byte] >> quad) & 1) << 4;
  if (g.bits == 6) code |= ((unit[256 + 64 * (quad / 4) + byte] >> (2 * (quad % 4))) & 3) << 4;
  return code;
}

// Row l's decoded block back out of a record (the inverse of pack_block).
void unpack_block(const Geometry& g, int64_t type, const uint8_t* record, int l, Decoded& out) {
  const uint16_t* d16 = reinterpret_cast<const uint16_t*>(record);
  out.d = d16[l];
  out.m = (type == kQ4_1 || type == kQ5_1 || (g.k_quant && type != kQ6_K)) ? d16[16 + l] : 0;
  if (type == kQ4_K || type == kQ5_K) {
    for (int j = 0; j < 8; ++j) {
      out.sc[j] = record[scale_at(type, j, l)];
      out.mn[j] = record[min_at(j, l)];
    }
  } else if (type == kQ6_K) {
    for (int j = 0; j < 16; ++j) out.sc[j] = record[scale_at(type, j, l)];
  }
  for (int64_t k = 0; k < g.block_weights; ++k) out.codes[k] = static_cast<uint8_t>(record_code(g, record, l, k));
}

// The code and the weight of input k of row l, from a record (the inverse of pack_block, for dequantizing).
float unpack_weight(const Geometry& g, int64_t type, const uint8_t* record, int l, int64_t k) {
  const uint16_t* d16 = reinterpret_cast<const uint16_t*>(record);
  const int code = record_code(g, record, l, k);
  const float d = fp16_to_float(d16[l]);
  switch (type) {
    case kQ4_0: return d * static_cast<float>(code - 8);
    case kQ5_0: return d * static_cast<float>(code - 16);
    case kQ8_0: return d * static_cast<float>(code - 128);
    case kQ4_1:
    case kQ5_1: return d * static_cast<float>(code) + fp16_to_float(d16[16 + l]);
    case kQ4_K:
    case kQ5_K: {
      const int j = static_cast<int>(k / 32);
      return d * record[scale_at(type, j, l)] * static_cast<float>(code) - fp16_to_float(d16[16 + l]) * record[min_at(j, l)];
    }
    case kQ6_K: {
      const int j = static_cast<int>(k / 16);
      return d * static_cast<int8_t>(record[scale_at(type, j, l)]) * static_cast<float>(code - 32);
    }
    default: return 0.0f;
  }
}

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

namespace {

// -- activations ------------------------------------------------------------------------------------
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

int32_t pair16(int32_t low, int32_t high) { return static_cast<int32_t>((static_cast<uint32_t>(high) << 16) | (static_cast<uint32_t>(low) & 0xFFFF)); }

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
// Vectorized: every pass quantizes each layer's four inputs once per row, and a scalar loop was a visible
// share of a multi-row pass (benchmarks/pass_cost_qwen1.5b.md). The same float operations as llama.cpp's
// scalar reference, so the same codes: x * (1 / d) (Q8_0) or x * (-127 / max) (Q8_K), rounded to nearest
// even under the default rounding mode.
void quantize_q8_0(const float* x, int64_t k, QuantizedRow& r) {
  r.q.resize(k);
  r.d.resize(k / 32);
  r.sums.resize(k / 32);
  const __m512 sign = _mm512_set1_ps(-0.0f);
  for (int64_t b = 0; b < k / 32; ++b) {
    const __m512 lo = _mm512_loadu_ps(x + 32 * b), hi = _mm512_loadu_ps(x + 32 * b + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, lo), _mm512_andnot_ps(sign, hi)));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    const __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, _mm512_set1_ps(id)));
    const __m512i qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, _mm512_set1_ps(id)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(r.q.data() + 32 * b), _mm512_cvtsepi32_epi8(qlo));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(r.q.data() + 32 * b + 16), _mm512_cvtsepi32_epi8(qhi));
    r.sums[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(qlo, qhi));
    r.d[b] = static_cast<float>(c10::Half(d));  // llama.cpp stores the block scale as fp16
  }
}

void quantize_q8_k(const float* x, int64_t k, QuantizedRow& r) {
  r.q.resize(k);
  r.d.resize(k / 256);
  r.sums.resize(k / 16);
  r.pairs16.resize(k / 32);
  r.pairs32.resize(k / 64);
  const __m512 sign = _mm512_set1_ps(-0.0f);
  for (int64_t b = 0; b < k / 256; ++b) {
    const float* xb = x + 256 * b;
    __m512 amax16 = _mm512_setzero_ps();
    for (int v = 0; v < 16; ++v) amax16 = _mm512_max_ps(amax16, _mm512_andnot_ps(sign, _mm512_loadu_ps(xb + 16 * v)));
    const float amax = _mm512_reduce_max_ps(amax16);
    if (amax == 0.0f) {
      std::fill(r.q.begin() + 256 * b, r.q.begin() + 256 * (b + 1), 0);
      r.d[b] = 0.0f;
      std::fill(r.sums.begin() + 16 * b, r.sums.begin() + 16 * (b + 1), 0);
      std::fill(r.pairs16.begin() + 8 * b, r.pairs16.begin() + 8 * (b + 1), 0);
      std::fill(r.pairs32.begin() + 4 * b, r.pairs32.begin() + 4 * (b + 1), 0);
      continue;
    }
    float max = 0.0f;  // the first input of largest magnitude, with its sign
    for (int v = 0; v < 16; ++v) {
      const __mmask16 at = _mm512_cmp_ps_mask(_mm512_andnot_ps(sign, _mm512_loadu_ps(xb + 16 * v)), _mm512_set1_ps(amax), _CMP_EQ_OQ);
      if (at) {
        max = xb[16 * v + __builtin_ctz(at)];
        break;
      }
    }
    const float iscale = -127.0f / max;
    for (int v = 0; v < 16; ++v) {
      const __m512i q = _mm512_min_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + 16 * v), _mm512_set1_ps(iscale))),
                                         _mm512_set1_epi32(127));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(r.q.data() + 256 * b + 16 * v), _mm512_cvtsepi32_epi8(q));
      r.sums[16 * b + v] = _mm512_reduce_add_epi32(q);
    }
    const int32_t* s = r.sums.data() + 16 * b;
    for (int i = 0; i < 8; ++i) r.pairs16[8 * b + i] = pair16(s[2 * i], s[2 * i + 1]);
    for (int i = 0; i < 4; ++i) r.pairs32[4 * b + i] = pair16(s[4 * i] + s[4 * i + 1], s[4 * i + 2] + s[4 * i + 3]);
    r.d[b] = 1.0f / iscale;
  }
}
#endif

}  // namespace

// raw [N, row_bytes] uint8 (a GGUF tensor's bytes, one row per output) -> the repacked tensor, its output
// count padded to 16 (padding outputs are zero). `order` (int64, optional): packed row i is raw row
// order[i] (llama.cpp's rotary row order becomes the half-split one at no cost). `out` (optional): the
// uint8 tensor to pack into (a view of a loader's PackArena), of gguf_packed_bytes bytes for the whole
// tensor; the rows of `raw` then become its outputs from `first_row` (a multiple of 16) on, so a large
// tensor can be read and packed a slice at a time (without `order`).
int64_t gguf_packed_bytes(int64_t type, int64_t rows, int64_t row_bytes) {
  const Geometry g = geometry(type);
  TORCH_CHECK(row_bytes % g.block_bytes == 0, "gguf_packed_bytes: row bytes not a whole number of blocks");
  return (rows + 15) / 16 * (row_bytes / g.block_bytes) * record_bytes(g);
}

at::Tensor gguf_pack(const at::Tensor& raw, int64_t type, const at::Tensor& order, const at::Tensor& out, int64_t first_row) {
  const Geometry g = geometry(type);
  TORCH_CHECK(raw.dim() == 2 && raw.scalar_type() == at::kByte && raw.is_contiguous(), "gguf_pack: raw [N, row_bytes] uint8");
  const int64_t n = raw.size(0), row_bytes = raw.size(1);
  TORCH_CHECK(row_bytes % g.block_bytes == 0, "gguf_pack: row bytes not a whole number of blocks");
  const bool ordered = order.numel() > 0;
  at::Tensor order_c;
  if (ordered) order_c = order.to(at::kLong).contiguous();
  TORCH_CHECK(!ordered || order_c.numel() == n, "gguf_pack: one source row per output");
  const int64_t blocks = row_bytes / g.block_bytes, out_blocks = (n + 15) / 16, rb = record_bytes(g);
  const int64_t* idx = ordered ? order_c.data_ptr<int64_t>() : nullptr;
  for (int64_t i = 0; idx && i < n; ++i) TORCH_CHECK(idx[i] >= 0 && idx[i] < n, "gguf_pack: order out of range");
  TORCH_CHECK(first_row >= 0 && first_row % 16 == 0 && (first_row == 0 || (out.numel() > 0 && !ordered)),
              "gguf_pack: first_row must be a multiple of 16, into `out`, without `order`");
  at::Tensor packed = out;
  if (out.numel() == 0) {
    packed = packed_buffer(out_blocks, blocks * rb);
  } else {
    TORCH_CHECK(out.scalar_type() == at::kByte && out.is_contiguous() && out.numel() % (blocks * rb) == 0 &&
                    out.numel() >= (first_row / 16 + out_blocks) * blocks * rb,
                "gguf_pack: out must be contiguous uint8 of gguf_packed_bytes bytes for the whole tensor");
  }
  uint8_t* dst = packed.data_ptr<uint8_t>() + first_row / 16 * blocks * rb;
  if (n % 16 != 0)  // the padding outputs of the last block: written nowhere else
    std::memset(dst + (out_blocks - 1) * blocks * rb, 0, blocks * rb);
  const uint8_t* src = raw.data_ptr<uint8_t>();
  at::parallel_for(0, out_blocks, 1, [&](int64_t begin, int64_t end) {
    Decoded dec;
    for (int64_t ob = begin; ob < end; ++ob) {
      for (int l = 0; l < 16 && ob * 16 + l < n; ++l) {
        const int64_t row = idx ? idx[ob * 16 + l] : ob * 16 + l;
        for (int64_t b = 0; b < blocks; ++b) {
          decode_block(type, src + row * row_bytes + b * g.block_bytes, dec);
          pack_block(g, type, dec, l, dst + (ob * blocks + b) * rb);
        }
      }
    }
  });
  return packed;
}

// Rows `rows` (int64) of a packed tensor with k_in inputs, dequantized: fp32 [len(rows), k_in].
at::Tensor gguf_unpack_rows(const at::Tensor& packed, int64_t type, int64_t k_in, const at::Tensor& rows) {
  const Geometry g = geometry(type);
  TORCH_CHECK(k_in % g.block_weights == 0, "gguf_unpack_rows: k_in not a whole number of blocks");
  auto rows_c = rows.to(at::kLong).contiguous();
  const int64_t blocks = k_in / g.block_weights, rb = record_bytes(g), count = rows_c.numel();
  const int64_t out_blocks = packed.numel() / (blocks * rb);
  auto out = at::empty({count, k_in}, packed.options().dtype(at::kFloat));
  const uint8_t* src = packed.data_ptr<uint8_t>();
  const int64_t* r = rows_c.data_ptr<int64_t>();
  float* o = out.data_ptr<float>();
  for (int64_t i = 0; i < count; ++i) TORCH_CHECK(r[i] >= 0 && r[i] < out_blocks * 16, "gguf_unpack_rows: row out of range");
  at::parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t ob = r[i] / 16;
      const int l = static_cast<int>(r[i] % 16);
      for (int64_t k = 0; k < k_in; ++k)
        o[i * k_in + k] = unpack_weight(g, type, src + (ob * blocks + k / g.block_weights) * rb, l, k % g.block_weights);
    }
  });
  return out;
}

int64_t gguf_record_bytes(int64_t type) { return record_bytes(geometry(type)); }

// A packed tensor of the rows `rows` (int64) of another, on the same grid (a head over a token subset).
at::Tensor gguf_select_rows(const at::Tensor& packed, int64_t type, int64_t k_in, const at::Tensor& rows) {
  const Geometry g = geometry(type);
  TORCH_CHECK(k_in % g.block_weights == 0, "gguf_select_rows: k_in not a whole number of blocks");
  auto rows_c = rows.to(at::kLong).contiguous();
  const int64_t blocks = k_in / g.block_weights, rb = record_bytes(g), count = rows_c.numel();
  const int64_t src_blocks = packed.numel() / (blocks * rb), out_blocks = (count + 15) / 16;
  const int64_t* r = rows_c.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i) TORCH_CHECK(r[i] >= 0 && r[i] < src_blocks * 16, "gguf_select_rows: row out of range");
  auto out = packed_buffer(out_blocks, blocks * rb);
  const uint8_t* src = packed.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  at::parallel_for(0, out_blocks, 1, [&](int64_t begin, int64_t end) {
    Decoded dec;
    for (int64_t ob = begin; ob < end; ++ob)
      for (int l = 0; l < 16 && ob * 16 + l < count; ++l) {
        const int64_t row = r[ob * 16 + l];
        for (int64_t b = 0; b < blocks; ++b) {
          unpack_block(g, type, src + ((row / 16) * blocks + b) * rb, static_cast<int>(row % 16), dec);
          pack_block(g, type, dec, l, dst + (ob * blocks + b) * rb);
        }
      }
  });
  return out;
}


// -- the matmul ------------------------------------------------------------------------------------------
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
namespace {
constexpr int kRows = 6;  // activation rows sharing one pass over a record (a verification of K <= 5 drafts)
// Bytes ahead of the weights being read that are prefetched (0: none): the decoding work per byte leaves
// too few loads in flight for the hardware prefetcher alone to keep a core's memory stream busy, and a
// multi-row pass (verification) then pays its compute and its memory time one after the other. A pass
// over several rows does more work per byte, so it looks further ahead. The defaults come from a sweep
// on the real pair (`python -m speclm.bench.pass_cost`).
int64_t g_prefetch_one_row = 2048, g_prefetch_rows = 3072;

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

template <int64_t TYPE>
void run_type(const uint8_t* packed, int64_t out_blocks, int64_t blocks, int64_t record, const std::vector<QuantizedRow>& xq,
              float* y, int64_t y_stride, int64_t column, int64_t n_out) {
  const int64_t m = static_cast<int64_t>(xq.size());
  const int64_t prefetch = m > 1 ? g_prefetch_rows : g_prefetch_one_row;
  at::parallel_for(0, out_blocks, 1, [&](int64_t begin, int64_t end) {
    alignas(64) float tail[kRows][16];
    for (int64_t ob = begin; ob < end; ++ob) {
      const bool partial = ob * 16 + 16 > n_out;
      for (int64_t r0 = 0; r0 < m; r0 += kRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kRows, m - r0));
        const QuantizedRow* xr[kRows];
        float* out[kRows];
        for (int t = 0; t < rows; ++t) {
          xr[t] = &xq[r0 + t];
          out[t] = partial ? tail[t] : y + (r0 + t) * y_stride + column + ob * 16;
        }
        const uint8_t* rec = packed + ob * blocks * record;
        switch (rows) {
          case 1: block_rows<1, TYPE>(rec, blocks, xr, out, prefetch); break;
          case 2: block_rows<2, TYPE>(rec, blocks, xr, out, prefetch); break;
          case 3: block_rows<3, TYPE>(rec, blocks, xr, out, prefetch); break;
          case 4: block_rows<4, TYPE>(rec, blocks, xr, out, prefetch); break;
          case 5: block_rows<5, TYPE>(rec, blocks, xr, out, prefetch); break;
          default: block_rows<6, TYPE>(rec, blocks, xr, out, prefetch); break;
        }
        if (partial)
          for (int t = 0; t < rows; ++t)
            std::memcpy(y + (r0 + t) * y_stride + column + ob * 16, tail[t], sizeof(float) * (n_out - ob * 16));
      }
    }
  });
}
}  // namespace

constexpr bool kGgufAvailable = true;
#else
constexpr bool kGgufAvailable = false;
#endif

bool gguf_available() { return kGgufAvailable; }

std::vector<int64_t> gguf_set_prefetch(int64_t one_row, int64_t rows) {
  TORCH_CHECK(one_row >= 0 && one_row % 64 == 0 && rows >= 0 && rows % 64 == 0,
              "gguf_set_prefetch: multiples of 64 bytes, >= 0");
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
  std::vector<int64_t> previous{g_prefetch_one_row, g_prefetch_rows};
  g_prefetch_one_row = one_row;
  g_prefetch_rows = rows;
  return previous;
#else
  return {one_row, rows};
#endif
}

// x [M, K] fp32 quantized as gguf_matmul quantizes its activations (the K-quants' Q8_K, per 256, or Q8_0,
// per 32): (codes int8 [M, K], block scales fp32 [M, K / block], code sums int32 [M, K / 16 or K / 32]).
std::vector<at::Tensor> gguf_quantize_activations(const at::Tensor& x, bool k_quant) {
  TORCH_CHECK(kGgufAvailable, "gguf_quantize_activations: this build has no AVX-512 VNNI");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "gguf_quantize_activations: x [M, K] fp32");
  const int64_t m = x.size(0), k = x.size(1), block = k_quant ? 256 : 32, group = k_quant ? 16 : 32;
  TORCH_CHECK(k % block == 0, "gguf_quantize_activations: K is not a whole number of blocks");
  auto xc = x.contiguous();
  auto codes = at::empty({m, k}, xc.options().dtype(at::kChar));
  auto scales = at::empty({m, k / block}, xc.options());
  auto sums = at::empty({m, k / group}, xc.options().dtype(at::kInt));
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
  QuantizedRow row;
  for (int64_t r = 0; r < m; ++r) {
    k_quant ? quantize_q8_k(xc.data_ptr<float>() + r * k, k, row) : quantize_q8_0(xc.data_ptr<float>() + r * k, k, row);
    std::memcpy(codes.data_ptr<int8_t>() + r * k, row.q.data(), k);
    std::memcpy(scales.data_ptr<float>() + r * (k / block), row.d.data(), sizeof(float) * (k / block));
    std::memcpy(sums.data_ptr<int32_t>() + r * (k / group), row.sums.data(), sizeof(int32_t) * (k / group));
  }
#endif
  return {codes, scales, sums};
}

// x [M, K] fp32 times the repacked weights of several segments (their outputs side by side: a fused QKV
// projection whose parts have different types), plus bias [sum n] (optional) -> y [M, sum n] fp32.
at::Tensor gguf_matmul(const at::Tensor& x, const std::vector<at::Tensor>& packed, const std::vector<int64_t>& types,
                       const std::vector<int64_t>& n_outs, const at::Tensor& bias) {
  TORCH_CHECK(kGgufAvailable, "gguf_matmul: this build has no AVX-512 VNNI (check gguf_available() first)");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "gguf_matmul: x [M, K] fp32");
  TORCH_CHECK(packed.size() == types.size() && types.size() == n_outs.size() && !packed.empty(), "gguf_matmul: segments");
  auto xc = x.contiguous();
  const int64_t m = xc.size(0), k_in = xc.size(1);
  int64_t total = 0;
  for (int64_t n : n_outs) total += n;
  auto y = at::empty({m, total}, xc.options());
  if (m == 0) return y;
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
  std::vector<QuantizedRow> q8_0, q8_k;  // each row quantized once per kind, shared by the segments
  const float* xp = xc.data_ptr<float>();
  int64_t column = 0;
  for (size_t s = 0; s < packed.size(); ++s) {
    const Geometry g = geometry(types[s]);
    TORCH_CHECK(k_in % g.block_weights == 0, "gguf_matmul: K is not a whole number of blocks");
    std::vector<QuantizedRow>& xq = g.k_quant ? q8_k : q8_0;
    if (xq.empty()) {
      xq.resize(m);
      at::parallel_for(0, m, 1, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r)
          g.k_quant ? quantize_q8_k(xp + r * k_in, k_in, xq[r]) : quantize_q8_0(xp + r * k_in, k_in, xq[r]);
      });
    }
    const int64_t blocks = k_in / g.block_weights, rb = record_bytes(g), out_blocks = (n_outs[s] + 15) / 16;
    TORCH_CHECK(packed[s].numel() == out_blocks * blocks * rb && packed[s].is_contiguous(), "gguf_matmul: packed size");
    const uint8_t* w = packed[s].data_ptr<uint8_t>();
    float* yp = y.data_ptr<float>();
    switch (types[s]) {
      case kQ4_0: run_type<kQ4_0>(w, out_blocks, blocks, rb, xq, yp, total, column, n_outs[s]); break;
      case kQ4_1: run_type<kQ4_1>(w, out_blocks, blocks, rb, xq, yp, total, column, n_outs[s]); break;
      case kQ5_0: run_type<kQ5_0>(w, out_blocks, blocks, rb, xq, yp, total, column, n_outs[s]); break;
      case kQ5_1: run_type<kQ5_1>(w, out_blocks, blocks, rb, xq, yp, total, column, n_outs[s]); break;
      case kQ8_0: run_type<kQ8_0>(w, out_blocks, blocks, rb, xq, yp, total, column, n_outs[s]); break;
      case kQ4_K: run_type<kQ4_K>(w, out_blocks, blocks, rb, xq, yp, total, column, n_outs[s]); break;
      case kQ5_K: run_type<kQ5_K>(w, out_blocks, blocks, rb, xq, yp, total, column, n_outs[s]); break;
      case kQ6_K: run_type<kQ6_K>(w, out_blocks, blocks, rb, xq, yp, total, column, n_outs[s]); break;
      default: TORCH_CHECK(false, "gguf_matmul: unsupported type ", types[s]);
    }
    column += n_outs[s];
  }
#endif
  if (bias.numel() > 0) y.add_(bias);
  return y;
}
