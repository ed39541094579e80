// Repacking a GGUF tensor's rows into records (the layout in gguf_format.h), and rows back out of them.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "gguf_format.h"
#include "gguf_kernels.h"
#include "mapped_memory.h"

#include <cmath>
#include <cstdint>
#include <cstring>

using namespace gguf;

namespace {

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

uint16_t load16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

void k_scale_min(int j, const uint8_t* s, uint8_t* sc, uint8_t* mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

}  // namespace

namespace gguf {

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

}  // namespace gguf

namespace {

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
