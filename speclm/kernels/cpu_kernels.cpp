// speclm's CPU kernels: attention rows, rotary, RMSNorm and SiLU, and the dense, int4 and w8a8 matmuls,
// each computing a row in a fixed order whatever the number of rows.
//
// Why our own: exact speculative decoding needs a verification row's logits to equal, bit for bit,
// the logits plain decoding computes for that token. torch's SDPA (and its GEMMs) accumulate a many-row
// call in another order than a one-row call. attend_rows computes every (row, head) pair with the same
// operations in the same order, whatever the number of rows (the query heads that share a kv head go
// through its keys together, which changes no result), so one call serves decoding, verification and
// token trees alike. rms_norm is one call where torch's decomposed rms_norm is six ops.
#include <torch/extension.h>
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

namespace {

typedef float float16v __attribute__((vector_size(64)));  // 16 floats: one AVX-512 register, or two AVX2
typedef int32_t int16v __attribute__((vector_size(64)));

// exp(x) for x <= 0 (softmax arguments), 16 at a time: 2^(x log2 e) split into 2^n * 2^f with a
// degree-6 polynomial for 2^f on [-0.5, 0.5] (Cephes exp2f's coefficients); relative error ~2e-7.
// Written with vector types so that every element, wherever it sits, runs the same instructions.
inline float16v exp_nonpositive(float16v x) {
  const float16v lowest = x - x - 87.0f;
  x = x < lowest ? lowest : x;
  const float16v t = x * 1.4426950408889634f;
  const float16v n = (t + 12582912.0f) - 12582912.0f;  // round to nearest (|t| < 2^22)
  const float16v f = t - n;  // [-0.5, 0.5]
  float16v p = f * 1.535336188e-4f + 1.339887440e-3f;
  p = p * f + 9.618437358e-3f;
  p = p * f + 5.550332471e-2f;
  p = p * f + 2.402264791e-1f;
  p = p * f + 6.931472029e-1f;
  p = p * f + 1.0f;
  const int16v bits = (__builtin_convertvector(n, int16v) + 127) << 23;
  return p * reinterpret_cast<const float16v&>(bits);
}

inline float16v load16(const float* p) {
  float16v v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline float sum16(float16v v) {  // a fixed pairwise order, in registers
  v += __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  v += __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3);
  v += __builtin_shufflevector(v, v, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1);
  v += __builtin_shufflevector(v, v, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0);
  return v[0];
}

// The lane sums of 16 vectors, as one vector (lane t = sum of v[t]): a transpose-and-add tree.
inline float16v sum16x16(const float16v* v) {
  float16v x[8], y[4], z[2];
  for (int i = 0; i < 8; ++i)
    x[i] = __builtin_shufflevector(v[2 * i], v[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           __builtin_shufflevector(v[2 * i], v[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  for (int i = 0; i < 4; ++i)
    y[i] = __builtin_shufflevector(x[2 * i], x[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           __builtin_shufflevector(x[2 * i], x[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  for (int i = 0; i < 2; ++i)
    z[i] = __builtin_shufflevector(y[2 * i], y[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
           __builtin_shufflevector(y[2 * i], y[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  return __builtin_shufflevector(z[0], z[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         __builtin_shufflevector(z[0], z[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

// One query row of one head over its keys: softmax(q.k * scale) @ v, accumulated in key order, for a
// head_dim that attend_group has no compiled form of (scalar loops).
void attend_one(const float* q, const float* keys, const float* values, int64_t key_stride, const int64_t* slots,
                int64_t length, int64_t head_dim, float scale, float* scores, float* out) {
  float max_score = -INFINITY;
  for (int64_t j = 0; j < length; ++j) {
    const float* k = keys + (slots ? slots[j] : j) * key_stride;
    float dot = 0.0f;
    for (int64_t d = 0; d < head_dim; ++d) dot += q[d] * k[d];
    scores[j] = dot * scale;
    max_score = scores[j] > max_score ? scores[j] : max_score;
  }
  for (int64_t j = 0; j < length; j += 16) {  // scores has room for whole blocks of 16
    const float16v e = exp_nonpositive(load16(scores + j) - max_score);
    std::memcpy(scores + j, &e, sizeof(e));
  }
  float total = 0.0f;
  for (int64_t j = 0; j < length; ++j) total += scores[j];  // in key order
  const float inv = 1.0f / total;
  for (int64_t d = 0; d < head_dim; ++d) out[d] = 0.0f;
  for (int64_t j = 0; j < length; ++j) {
    const float* v = values + (slots ? slots[j] : j) * key_stride;
    const float p = scores[j];
    for (int64_t d = 0; d < head_dim; ++d) out[d] += p * v[d];
  }
  for (int64_t d = 0; d < head_dim; ++d) out[d] *= inv;
}

constexpr int kMaxGroup = 16;  // heads per attend_group call

// The query rows of several heads that read the same kv head (grouped-query attention), over the same
// keys: for each, softmax(q.k * scale) @ v accumulated in key order, with head_dim D known at compile time
// (a multiple of 16). Each head's operations and their order do not depend on the others in the group
// (only the loops are interleaved), so a (head, row) pair gets the same bits in any group. A block of keys
// and values is read from memory once for the group and then served from L1 to every head, where one head
// at a time would stream all of them from L2 per head.
// q[g], out[g]: head g's query row and output; scores: `group` rows of score_stride floats; acc: `group`
// rows of D floats (scratch).
template <int D>
void attend_group(const float* const* q, int group, const float* keys, const float* values, int64_t key_stride,
                  const int64_t* slots, int64_t length, float scale, float* scores, int64_t score_stride, float* acc,
                  float* const* out) {
  constexpr int V = D / 16;
  constexpr int64_t kBlock = 32;  // keys whose values stay in L1 while every head adds them up
  float max_score[kMaxGroup];
  for (int g = 0; g < group; ++g) max_score[g] = -INFINITY;
  float16v block_max[kMaxGroup];
  // (-inf in every lane. Not derived from `scores`: it holds an earlier row's leftovers, possibly inf or
  // NaN, and a NaN lane would hide its keys from the maximum; the softmax then shifts by another value,
  // and the row's result depends on which rows ran before it on this thread.)
  for (int g = 0; g < group; ++g) block_max[g] = float16v{} - INFINITY;
  // Whole blocks of 16 keys: 16 partial-sum vectors reduced together (sum16x16), which costs ~3
  // shuffles/adds per key instead of sum16's 8. A row's split into blocks and a tail depends on its
  // length only, so its scores do not depend on the other rows.
  int64_t j = 0;
  for (; j + 16 <= length; j += 16) {
    for (int g = 0; g < group; ++g) {
      float16v qv[V];
      for (int c = 0; c < V; ++c) qv[c] = load16(q[g] + 16 * c);
      float16v parts[16];
      for (int t = 0; t < 16; ++t) {
        const float* k = keys + (slots ? slots[j + t] : j + t) * key_stride;
        float16v a = qv[0] * load16(k);
        for (int c = 1; c < V; ++c) a += qv[c] * load16(k + 16 * c);
        parts[t] = a;
      }
      const float16v s = sum16x16(parts) * scale;
      std::memcpy(scores + g * score_stride + j, &s, sizeof(s));
      block_max[g] = s > block_max[g] ? s : block_max[g];
    }
  }
  for (int g = 0; g < group; ++g) {
    for (int t = 0; t < 16; ++t) max_score[g] = block_max[g][t] > max_score[g] ? block_max[g][t] : max_score[g];
    float16v qv[V];
    for (int c = 0; c < V; ++c) qv[c] = load16(q[g] + 16 * c);
    float* sg = scores + g * score_stride;
    for (int64_t r = j; r < length; ++r) {
      const float* k = keys + (slots ? slots[r] : r) * key_stride;
      float16v a = qv[0] * load16(k);
      for (int c = 1; c < V; ++c) a += qv[c] * load16(k + 16 * c);
      sg[r] = sum16(a) * scale;
      max_score[g] = sg[r] > max_score[g] ? sg[r] : max_score[g];
    }
    for (int64_t r = 0; r < length; r += 16) {
      const float16v e = exp_nonpositive(load16(sg + r) - max_score[g]);
      std::memcpy(sg + r, &e, sizeof(e));
    }
    std::memset(acc + g * D, 0, sizeof(float) * D);
  }
  for (int64_t b = 0; b < length; b += kBlock) {
    const int64_t e = std::min(length, b + kBlock);
    for (int g = 0; g < group; ++g) {
      float16v a[V];
      for (int c = 0; c < V; ++c) a[c] = load16(acc + g * D + 16 * c);
      const float* sg = scores + g * score_stride;
      for (int64_t r = b; r < e; ++r) {
        const float* v = values + (slots ? slots[r] : r) * key_stride;
        const float p = sg[r];
        for (int c = 0; c < V; ++c) a[c] += p * load16(v + 16 * c);
      }
      std::memcpy(acc + g * D, a, sizeof(a));
    }
  }
  for (int g = 0; g < group; ++g) {
    const float* sg = scores + g * score_stride;
    float total = 0.0f;
    for (int64_t r = 0; r < length; ++r) total += sg[r];  // in key order
    const float inv = 1.0f / total;
    for (int c = 0; c < V; ++c) {
      const float16v r = load16(acc + g * D + 16 * c) * inv;
      std::memcpy(out[g] + 16 * c, &r, sizeof(r));
    }
  }
}

using AttendGroup = void (*)(const float* const*, int, const float*, const float*, int64_t, const int64_t*, int64_t,
                             float, float*, int64_t, float*, float* const*);

AttendGroup attend_group_for(int64_t head_dim) {
  switch (head_dim) {
    case 64: return attend_group<64>;
    case 128: return attend_group<128>;
    case 32: return attend_group<32>;
    default: return nullptr;
  }
}

}  // namespace

// q [heads, n, head_dim], keys/values [kv_heads, num_slots, head_dim] (fp32, last dim contiguous).
// Row i attends to lengths[i] keys: those at slots[r, :lengths[i]] with r = slot_rows[i] (or r = i when
// slot_rows is empty) when slots is a table [rows, >= longest length], else keys 0..lengths[i]-1.
// Rows of one sequence's causal chunk share one table row. Query head h reads kv head
// h / (heads / kv_heads). Returns [heads, n, head_dim].
at::Tensor attend_rows(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                       const at::Tensor& lengths, const at::Tensor& slots, const at::Tensor& slot_rows, double scale) {
  TORCH_CHECK(q.dim() == 3 && keys.dim() == 3 && values.dim() == 3, "attend_rows: 3-d q, keys, values");
  TORCH_CHECK(q.scalar_type() == at::kFloat && keys.scalar_type() == at::kFloat &&
                  values.scalar_type() == at::kFloat, "attend_rows: fp32 tensors");
  TORCH_CHECK(q.stride(2) == 1 && keys.stride(2) == 1 && values.stride(2) == 1, "attend_rows: last dim contiguous");
  TORCH_CHECK(keys.stride(1) == values.stride(1) && keys.stride(0) == values.stride(0), "attend_rows: keys/values strides");
  const int64_t heads = q.size(0), n = q.size(1), head_dim = q.size(2), kv_heads = keys.size(0);
  TORCH_CHECK(heads % kv_heads == 0 && keys.size(2) == head_dim, "attend_rows: head shapes");
  auto lengths_c = lengths.to(at::kLong).contiguous();
  TORCH_CHECK(lengths_c.numel() == n, "attend_rows: one length per row");
  const int64_t* length_of = lengths_c.data_ptr<int64_t>();
  int64_t max_length = 0;
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(length_of[i] > 0, "attend_rows: a row needs a key");
    max_length = std::max(max_length, length_of[i]);
  }
  const bool indexed = slots.numel() > 0;
  at::Tensor slots_c, rows_c;
  std::vector<int64_t> table_row(n);
  if (indexed) {
    slots_c = slots.to(at::kLong).contiguous();
    TORCH_CHECK(slots_c.dim() == 2, "attend_rows: slots [rows, >= max length]");
    const bool shared = slot_rows.numel() > 0;
    if (shared) {
      rows_c = slot_rows.to(at::kLong).contiguous();
      TORCH_CHECK(rows_c.numel() == n, "attend_rows: one slot row per query row");
    }
    for (int64_t i = 0; i < n; ++i) {
      table_row[i] = shared ? rows_c.data_ptr<int64_t>()[i] : i;
      TORCH_CHECK(table_row[i] >= 0 && table_row[i] < slots_c.size(0) && slots_c.size(1) >= length_of[i],
                  "attend_rows: a row's slots are out of the table");
    }
  } else {
    TORCH_CHECK(max_length <= keys.size(1), "attend_rows: a length exceeds the keys");
  }
  // [heads, n, head_dim] with [n, heads, head_dim] memory: the caller's transpose to [n, heads * head_dim]
  // (o_proj's input) is then a view.
  auto out = at::empty({n, heads, head_dim}, q.options().memory_format(at::MemoryFormat::Contiguous)).transpose(0, 1);
  const float* qp = q.data_ptr<float>();
  const float* kp = keys.data_ptr<float>();
  const float* vp = values.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t* sp = indexed ? slots_c.data_ptr<int64_t>() : nullptr;
  const int64_t slot_row = indexed ? slots_c.size(1) : 0;
  const int64_t group = heads / kv_heads;
  const int64_t qs0 = q.stride(0), qs1 = q.stride(1), ks0 = keys.stride(0), ks1 = keys.stride(1);
  // One task = one row and some of the query heads of one kv head, computed start to end by one thread,
  // every (head, row) pair with the same operations in the same order whatever the grouping: the result
  // cannot depend on how many rows share the call or how the tasks are spread over threads. A kv head's
  // query heads go in as few tasks as keep every thread busy (a one-row pass has only kv_heads rows of work).
  const AttendGroup attend_grouped = attend_group_for(head_dim);
  const int64_t threads = at::get_num_threads();
  int64_t parts = std::max<int64_t>(1, (2 * threads + kv_heads * n - 1) / (kv_heads * n));
  parts = std::min(group, std::max(parts, (group + kMaxGroup - 1) / kMaxGroup));
  const int64_t per_part = (group + parts - 1) / parts;
  const int64_t score_stride = (max_length + 15) / 16 * 16;
  at::parallel_for(0, kv_heads * n * parts, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(per_part * score_stride, 0.0f), acc(per_part * std::max<int64_t>(head_dim, 1));
    const float* qs[kMaxGroup];
    float* outs[kMaxGroup];
    for (int64_t task = begin; task < end; ++task) {
      const int64_t kvh = task / (n * parts), i = task / parts % n, part = task % parts;
      const int64_t h0 = kvh * group + part * per_part, h1 = std::min(kvh * group + group, h0 + per_part);
      if (h1 <= h0) continue;
      const int64_t* row_slots = sp ? sp + table_row[i] * slot_row : nullptr;
      if (attend_grouped == nullptr) {
        for (int64_t h = h0; h < h1; ++h)
          attend_one(qp + h * qs0 + i * qs1, kp + kvh * ks0, vp + kvh * ks0, ks1, row_slots, length_of[i], head_dim,
                 static_cast<float>(scale), scores.data(), op + (i * heads + h) * head_dim);
        continue;
      }
      for (int64_t h = h0; h < h1; ++h) {
        qs[h - h0] = qp + h * qs0 + i * qs1;
        outs[h - h0] = op + (i * heads + h) * head_dim;
      }
      attend_grouped(qs, static_cast<int>(h1 - h0), kp + kvh * ks0, vp + kvh * ks0, ks1, row_slots, length_of[i],
                     static_cast<float>(scale), scores.data(), score_stride, acc.data(), outs);
    }
  });
  return out;
}


// qkv [n, (heads + 2 kv_heads) * head_dim] (bf16 or fp32, the QKV projection's output) -> q
// [heads, n, head_dim] fp32, rotated; the rotated keys and the values are written to k_cache /
// v_cache [kv_heads, num_slots, head_dim] (fp32) at slots[i] for row i. Rotation as apply_rope in
// rope.py: x * cos + roll(x, rotary / 2) * signed_sin over each head's first `rotary` dims, with cos/signed_sin
// [n, rotary] fp32 (rotary = head_dim, or fewer where the model turns part of each head); the rest pass.
at::Tensor rope_qkv(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& signed_sin, int64_t heads,
                    int64_t kv_heads, at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& slots) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.stride(1) == 1, "rope_qkv: qkv [n, width], rows contiguous");
  TORCH_CHECK(qkv.scalar_type() == at::kFloat || qkv.scalar_type() == at::kBFloat16, "rope_qkv: fp32 or bf16 qkv");
  const int64_t n = qkv.size(0), head_dim = k_cache.size(2), rotary = cos.size(1), half = rotary / 2;
  TORCH_CHECK(qkv.size(1) == (heads + 2 * kv_heads) * head_dim && head_dim % 2 == 0, "rope_qkv: widths");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && signed_sin.scalar_type() == at::kFloat && cos.is_contiguous() &&
              signed_sin.is_contiguous() && cos.size(0) == n && signed_sin.size(1) == rotary && rotary <= head_dim &&
              rotary % 2 == 0, "rope_qkv: cos/sin [n, rotary <= head_dim] fp32");
  TORCH_CHECK(k_cache.scalar_type() == at::kFloat && v_cache.scalar_type() == at::kFloat && k_cache.stride(2) == 1 &&
              v_cache.stride(2) == 1 && k_cache.size(0) == kv_heads, "rope_qkv: fp32 caches [kv_heads, slots, head_dim]");
  auto slots_c = slots.to(at::kLong).contiguous();
  TORCH_CHECK(slots_c.numel() == n, "rope_qkv: one slot per row");
  const int64_t* slot = slots_c.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    TORCH_CHECK(slot[i] >= 0 && slot[i] < k_cache.size(1), "rope_qkv: slot out of range");
  auto q = at::empty({heads, n, head_dim}, cos.options());
  float* qp = q.data_ptr<float>();
  float* kp = k_cache.data_ptr<float>();
  float* vp = v_cache.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = signed_sin.data_ptr<float>();
  const bool bf16 = qkv.scalar_type() == at::kBFloat16;
  std::vector<float> x(head_dim);
  for (int64_t i = 0; i < n; ++i) {
    const float* c = cp + i * rotary;
    const float* sn = sp + i * rotary;
    for (int64_t h = 0; h < heads + 2 * kv_heads; ++h) {
      const int64_t offset = i * qkv.stride(0) + h * head_dim;
      if (bf16) {
        const c10::BFloat16* src = qkv.data_ptr<c10::BFloat16>() + offset;
        for (int64_t d = 0; d < head_dim; ++d) x[d] = static_cast<float>(src[d]);
      } else {
        const float* src = qkv.data_ptr<float>() + offset;
        for (int64_t d = 0; d < head_dim; ++d) x[d] = src[d];
      }
      float* dst = h < heads ? qp + (h * n + i) * head_dim
                 : h < heads + kv_heads ? kp + (h - heads) * k_cache.stride(0) + slot[i] * k_cache.stride(1)
                                        : vp + (h - heads - kv_heads) * v_cache.stride(0) + slot[i] * v_cache.stride(1);
      if (h >= heads + kv_heads) {
        for (int64_t d = 0; d < head_dim; ++d) dst[d] = x[d];
        continue;
      }
      for (int64_t d = 0; d < rotary; ++d) {
        const float rolled = x[d < half ? d + half : d - half];
        const float a = x[d] * c[d];
        const float b = rolled * sn[d];
        dst[d] = a + b;
      }
      for (int64_t d = rotary; d < head_dim; ++d) dst[d] = x[d];
    }
  }
  return q;
}

// silu(gate) * up for gate_up [n, 2 * width] (the fused gate/up projection) -> [n, width], in its dtype:
// fp32, or bf16 rounding as torch's bf16 ops do (silu's result to bf16, then the product to bf16).
// One call instead of torch's silu, mul and two slices: in a one-token pass of a small model those
// calls' dispatch costs more than their arithmetic.
inline float16v silu16(float16v x) {  // x * sigmoid(x)
  const float16v e = exp_nonpositive(x < 0.0f ? x : -x);  // exp(-|x|), no overflow
  return (x < 0.0f ? x * e : x) / (1.0f + e);
}

at::Tensor silu_mul(const at::Tensor& gate_up) {
  const bool bf16 = gate_up.scalar_type() == at::kBFloat16;
  TORCH_CHECK(gate_up.dim() == 2 && (bf16 || gate_up.scalar_type() == at::kFloat) && gate_up.stride(1) == 1,
              "silu_mul: bf16 or fp32 [n, 2 * width], rows contiguous");
  const int64_t n = gate_up.size(0), width = gate_up.size(1) / 2, stride = gate_up.stride(0);
  auto out = at::empty({n, width}, gate_up.options());
  if (!bf16) {
    const float* src = gate_up.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) {
      const float *g = src + i * stride, *u = g + width;
      float* y = dst + i * width;
      int64_t j = 0;
      for (; j + 16 <= width; j += 16) {
        const float16v r = silu16(load16(g + j)) * load16(u + j);
        std::memcpy(y + j, &r, sizeof(r));
      }
      if (j < width) {  // a short tail, padded with zeros
        float gate[16] = {}, up[16] = {}, r[16];
        std::memcpy(gate, g + j, sizeof(float) * (width - j));
        std::memcpy(up, u + j, sizeof(float) * (width - j));
        const float16v v = silu16(load16(gate)) * load16(up);
        std::memcpy(r, &v, sizeof(v));
        std::memcpy(y + j, r, sizeof(float) * (width - j));
      }
    }
    return out;
  }
  const c10::BFloat16* src = gate_up.data_ptr<c10::BFloat16>();
  c10::BFloat16* dst = out.data_ptr<c10::BFloat16>();
  float gate[16], silu[16];
  for (int64_t i = 0; i < n; ++i) {
    const c10::BFloat16* g = src + i * stride;
    const c10::BFloat16* u = g + width;
    for (int64_t j0 = 0; j0 < width; j0 += 16) {  // 16 at a time; a short tail is padded with zeros
      const int64_t count = std::min<int64_t>(16, width - j0);
      for (int64_t j = 0; j < 16; ++j) gate[j] = j < count ? static_cast<float>(g[j0 + j]) : 0.0f;
      const float16v r = silu16(load16(gate));
      std::memcpy(silu, &r, sizeof(r));
      for (int64_t j = 0; j < count; ++j)
        dst[i * width + j0 + j] = c10::BFloat16(static_cast<float>(c10::BFloat16(silu[j])) * static_cast<float>(u[j0 + j]));
    }
  }
  return out;
}

// x [n, hidden] fp32 -> weight * x / sqrt(mean(x^2) + eps), in weight's dtype (fp32 or bf16; with
// bf16 the normalized row is rounded to bf16 before the multiply, as torch's bf16 arithmetic does).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.stride(1) == 1, "rms_norm: fp32 [n, hidden], rows contiguous");
  const int64_t n = x.size(0), hidden = x.size(1);
  TORCH_CHECK(weight.numel() == hidden, "rms_norm: weight size");
  auto w = weight.contiguous();
  const bool bf16 = w.scalar_type() == at::kBFloat16;
  TORCH_CHECK(bf16 || w.scalar_type() == at::kFloat, "rms_norm: fp32 or bf16 weight");
  auto out = at::empty({n, hidden}, x.options().dtype(w.scalar_type()));
  const float* xp = x.data_ptr<float>();
  const int64_t xs = x.stride(0);
  for (int64_t i = 0; i < n; ++i) {
    const float* row = xp + i * xs;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t d = 0; d < hidden; ++d) sum += row[d] * row[d];
    const float r = 1.0f / std::sqrt(sum / static_cast<float>(hidden) + static_cast<float>(eps));
    if (bf16) {
      const c10::BFloat16* wp = w.data_ptr<c10::BFloat16>();
      c10::BFloat16* o = out.data_ptr<c10::BFloat16>() + i * hidden;
      for (int64_t d = 0; d < hidden; ++d)
        o[d] = c10::BFloat16(static_cast<float>(wp[d]) * static_cast<float>(c10::BFloat16(row[d] * r)));
    } else {
      const float* wp = w.data_ptr<float>();
      float* o = out.data_ptr<float>() + i * hidden;
#pragma omp simd
      for (int64_t d = 0; d < hidden; ++d) o[d] = wp[d] * (row[d] * r);
    }
  }
  return out;
}


// -- int4 weight-only matmul ---------------------------------------------------------------------
// y [M, N] bf16 = x [M, K] bf16 @ W.T, W[n, k] = (q[n, k] - 8) * scale[g, n] + zero[g, n] for the group
// g = k / group_size (torch's int4 grid). scales_and_zeros [N/16, K/group, 16, 2] bf16: torch's (scale, zero)
// pairs regrouped so that one output block reads its groups' pairs in one sequential stream.
// q is packed for AVX-512 BF16 dot products (pack_int4 in quant_linear.py): per block of 16 outputs
// and 8 inputs, 64 bytes; byte 2l+e holds q[l, k+e] (low nibble) and q[l, k+2+e] (high), byte
// 32+2l+e holds q[l, k+4+e] and q[l, k+6+e]. Nibbles become the bf16 values q-8 through a table,
// and vdpbf16ps multiplies them by the bf16 activations (exact products, fp32 sums), so activations
// are not requantized. Each output block of each row is computed in a fixed order by one thread:
// a row's result does not depend on the other rows of the call (exact speculative verification).
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
constexpr bool kInt4Available = true;

namespace {
constexpr int kRowTile = 8;

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
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  const uint32_t* szp = reinterpret_cast<const uint32_t*>(scales_and_zeros.data_ptr<c10::BFloat16>());
  c10::BFloat16* yp = y.data_ptr<c10::BFloat16>();
  at::parallel_for(0, n_out / 16, 1, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      for (int64_t r0 = 0; r0 < m; r0 += kRowTile) {
        const int tile = static_cast<int>(std::min<int64_t>(kRowTile, m - r0));
        const uint32_t* x_pairs[kRowTile];
        const float* x_sums[kRowTile];
        c10::BFloat16* rows[kRowTile];
        for (int t = 0; t < tile; ++t) {
          x_pairs[t] = reinterpret_cast<const uint32_t*>(xp + (r0 + t) * k_in);
          x_sums[t] = sums.data() + (r0 + t) * groups;
          rows[t] = yp + (r0 + t) * n_out;
        }
        kInt4Blocks[tile - 1](x_pairs, x_sums, wp, szp, k_in, group_size, rows, block);
      }
    }
  });
  return y;
}
#else
constexpr bool kInt4Available = false;

at::Tensor int4_matmul(const at::Tensor&, const at::Tensor&, int64_t, const at::Tensor&) {
  TORCH_CHECK(false, "int4_matmul: this build has no AVX-512 BF16 (check int4_available() first)");
}
#endif

bool int4_available() { return kInt4Available; }


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

// -- dense matmul: fp32 or bf16 weights in nn.Linear's [N, K] layout ------------------------------
// y [M, N] fp32 = x [M, K] @ w.T (+ bias), x in w's dtype. Every output is a dot product along k in
// 16-lane vectors (fp32 FMAs, or vdpbf16ps pairs for bf16) reduced with sum16 at the end: the same
// instructions for every (row, output) whatever M and whatever tile it falls in, so a row's result
// does not depend on the other rows. torch's GEMM takes another path for one row than for several
// (fp32: every row differed here), and for bf16 another again past 16 rows (AMX), which made
// verification rows differ from plain decoding and a request's tokens depend on the batch.
namespace {
constexpr int kDenseRows = 4, kDenseCols = 4;

#if defined(__AVX512F__)
template <typename T>
inline __m512 dense_dot(__m512 acc, const T* x, const T* w, int64_t count);

template <>
inline __m512 dense_dot<float>(__m512 acc, const float* x, const float* w, int64_t count) {
  if (count >= 16) return _mm512_fmadd_ps(_mm512_loadu_ps(x), _mm512_loadu_ps(w), acc);
  const __mmask16 mask = static_cast<__mmask16>((1u << count) - 1);
  return _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, x), _mm512_maskz_loadu_ps(mask, w), acc);
}
#endif

// The products of one chunk of k (16 fp32 or 32 bf16 values) of one row and one output, added to acc.
template <typename T>
inline float16v dense_chunk(float16v acc, const T* x, const T* w, int64_t count);

template <>
inline float16v dense_chunk<float>(float16v acc, const float* x, const float* w, int64_t count) {
#if defined(__AVX512F__)
  __m512 a;
  std::memcpy(&a, &acc, sizeof(a));
  a = dense_dot<float>(a, x, w, count);
  std::memcpy(&acc, &a, sizeof(a));
  return acc;
#else
  float xb[16] = {}, wb[16] = {};
  std::memcpy(xb, x, sizeof(float) * std::min<int64_t>(count, 16));
  std::memcpy(wb, w, sizeof(float) * std::min<int64_t>(count, 16));
  return acc + load16(xb) * load16(wb);
#endif
}

template <>
inline float16v dense_chunk<c10::BFloat16>(float16v acc, const c10::BFloat16* x, const c10::BFloat16* w,
                                           int64_t count) {
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
  __m512 a;
  std::memcpy(&a, &acc, sizeof(a));
  __m512i xv, wv;
  if (count >= 32) {
    xv = _mm512_loadu_si512(x);
    wv = _mm512_loadu_si512(w);
  } else {
    const __mmask32 mask = static_cast<__mmask32>((1ull << count) - 1);
    xv = _mm512_maskz_loadu_epi16(mask, x);
    wv = _mm512_maskz_loadu_epi16(mask, w);
  }
  a = _mm512_dpbf16_ps(a, (__m512bh)xv, (__m512bh)wv);
  std::memcpy(&acc, &a, sizeof(a));
  return acc;
#else
  float even[16] = {}, odd[16] = {};  // lane l: pair (2l, 2l+1), as vdpbf16ps pairs them
  for (int64_t j = 0; j < std::min<int64_t>(count, 32); ++j)
    (j % 2 ? odd : even)[j / 2] = static_cast<float>(x[j]) * static_cast<float>(w[j]);
  return acc + (load16(even) + load16(odd));
#endif
}

template <typename T>
constexpr int64_t dense_chunk_size() { return 64 / sizeof(T); }

template <typename T, int R, int C>
void dense_tile(const T* x, int64_t k_in, const T* w, const float* bias, float* y, int64_t n_out) {
  constexpr int64_t step = dense_chunk_size<T>();
  float16v acc[R][C] = {};
  for (int64_t k = 0; k < k_in; k += step) {
    const int64_t count = std::min<int64_t>(step, k_in - k);
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = dense_chunk<T>(acc[r][c], x + r * k_in + k, w + c * k_in + k, count);
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[r * n_out + c] = sum16(acc[r][c]) + (bias ? bias[c] : 0.0f);
}

template <typename T>
using DenseTile = void (*)(const T*, int64_t, const T*, const float*, float*, int64_t);

template <typename T>
DenseTile<T> dense_tile_for(int rows, int cols) {
  static const DenseTile<T> table[kDenseRows][kDenseCols] = {
      {dense_tile<T, 1, 1>, dense_tile<T, 1, 2>, dense_tile<T, 1, 3>, dense_tile<T, 1, 4>},
      {dense_tile<T, 2, 1>, dense_tile<T, 2, 2>, dense_tile<T, 2, 3>, dense_tile<T, 2, 4>},
      {dense_tile<T, 3, 1>, dense_tile<T, 3, 2>, dense_tile<T, 3, 3>, dense_tile<T, 3, 4>},
      {dense_tile<T, 4, 1>, dense_tile<T, 4, 2>, dense_tile<T, 4, 3>, dense_tile<T, 4, 4>}};
  return table[rows - 1][cols - 1];
}

template <typename T>
void dense_run(const T* xp, const T* wp, const float* bias, float* yp, int64_t m, int64_t k_in, int64_t n_out) {
  at::parallel_for(0, (n_out + kDenseCols - 1) / kDenseCols, 1, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      const int64_t c0 = block * kDenseCols;
      const int cols = static_cast<int>(std::min<int64_t>(kDenseCols, n_out - c0));
      for (int64_t r0 = 0; r0 < m; r0 += kDenseRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kDenseRows, m - r0));
        dense_tile_for<T>(rows, cols)(xp + r0 * k_in, k_in, wp + c0 * k_in, bias ? bias + c0 : nullptr,
                                      yp + r0 * n_out + c0, n_out);
      }
    }
  });
}
}  // namespace

// x [M, K] and w [N, K] both fp32 or both bf16, bias [N] fp32 or an empty tensor. Returns fp32 [M, N].
at::Tensor dense_matmul(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "dense_matmul: x [M, K], w [N, K]");
  TORCH_CHECK(x.scalar_type() == w.scalar_type() &&
                  (w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16),
              "dense_matmul: x and w both fp32 or both bf16");
  const bool has_bias = bias.numel() > 0;
  TORCH_CHECK(!has_bias || (bias.scalar_type() == at::kFloat && bias.numel() == w.size(0)), "dense_matmul: bias [N] fp32");
  auto xc = x.contiguous(), wc = w.contiguous();
  auto bc = has_bias ? bias.contiguous() : bias;
  const int64_t m = xc.size(0), k_in = xc.size(1), n_out = wc.size(0);
  auto y = at::empty({m, n_out}, xc.options().dtype(at::kFloat));
  const float* bp = has_bias ? bc.data_ptr<float>() : nullptr;
  if (m == 0 || n_out == 0) return y;
  if (w.scalar_type() == at::kFloat)
    dense_run<float>(xc.data_ptr<float>(), wc.data_ptr<float>(), bp, y.data_ptr<float>(), m, k_in, n_out);
  else
    dense_run<c10::BFloat16>(xc.data_ptr<c10::BFloat16>(), wc.data_ptr<c10::BFloat16>(), bp, y.data_ptr<float>(), m,
                             k_in, n_out);
  return y;
}
