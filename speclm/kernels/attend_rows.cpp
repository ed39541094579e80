// attend_rows: attention rows, each (row, head) pair computed with the same operations in the same order
// whatever the number of rows, so one call serves decoding, verification and token trees alike (the
// query heads that share a kv head go through its keys together, which changes no result).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "cpu_kernels.h"
#include "attend_avx2.h"
#include "vector16.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <vector>

using namespace vec16;

namespace {

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
  for (int64_t j = 0; j < length; j += kLanes) {  // scores has room for whole blocks of 16
    const floatv e = exp_nonpositive(loadv(scores + j) - max_score);
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
constexpr int64_t kValueBlock = 32;  // keys whose values stay in L1 while every head of a group adds them up

#if SPECLM_ATTEND_AVX2
using attend_avx2::accumulate_values;
using attend_avx2::score_blocks;
#else
// The scores of the keys in whole blocks of 16, for each head g of a group: head g's q.k * scale into
// scores[g * score_stride + key], and its lane-wise maximum over the blocks into block_max[16 g .. 16 g + 15]
// (lane t: keys t, t + 16, ...; seeded with -inf). Each key's 16-lane products are summed by sum16's tree,
// 16 keys at once (sum16x16: ~3 shuffles/adds per key instead of sum16's 8). Returns the keys covered. A row's
// split into blocks and a tail depends on its length only, so its scores do not depend on the other rows.
template <int D>
int64_t score_blocks(const float* const* q, int group, const float* keys, int64_t key_stride, const int64_t* slots,
                     int64_t length, float scale, float* scores, int64_t score_stride, float* block_max) {
  constexpr int V = D / 16;
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
      float16v m = load16(block_max + 16 * g);
      m = s > m ? s : m;
      std::memcpy(block_max + 16 * g, &m, sizeof(m));
    }
  }
  return j;
}

// acc[g * D ..] += each key's value row times head g's score (its exp), in key order: a block of `block`
// keys' values is read from memory once for the group, then served from L1 to every head.
template <int D>
void accumulate_values(int group, const float* values, int64_t key_stride, const int64_t* slots, int64_t length,
                       const float* scores, int64_t score_stride, float* acc, int64_t block) {
  constexpr int V = D / 16;
  for (int64_t b = 0; b < length; b += block) {
    const int64_t e = std::min(length, b + block);
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
}
#endif

// The query rows of several heads that read the same kv head (grouped-query attention), over the same
// keys: for each, softmax(q.k * scale) @ v accumulated in key order, with head_dim D known at compile time
// (a multiple of 16). Each head's operations and their order do not depend on the others in the group
// (only the loops are interleaved), so a (head, row) pair gets the same bits in any group. The scores and
// the values' sums run as score_blocks and accumulate_values (above, or attend_avx2.h's on a CPU with AVX2
// but no AVX-512: the same operations lane for lane, so the same bits).
// q[g], out[g]: head g's query row and output; scores: `group` rows of score_stride floats; acc: `group`
// rows of D floats (scratch).
template <int D>
void attend_group(const float* const* q, int group, const float* keys, const float* values, int64_t key_stride,
                  const int64_t* slots, int64_t length, float scale, float* scores, int64_t score_stride, float* acc,
                  float* const* out) {
  constexpr int V = D / 16;
  // (-inf in every lane. Not derived from `scores`: it holds an earlier row's leftovers, possibly inf or
  // NaN, and a NaN lane would hide its keys from the maximum; the softmax then shifts by another value,
  // and the row's result depends on which rows ran before it on this thread.)
  float block_max[kMaxGroup * 16];
  std::fill(block_max, block_max + 16 * group, -INFINITY);
  const int64_t j = score_blocks<D>(q, group, keys, key_stride, slots, length, scale, scores, score_stride, block_max);
  for (int g = 0; g < group; ++g) {
    float max_score = -INFINITY;
    for (int t = 0; t < 16; ++t) max_score = block_max[16 * g + t] > max_score ? block_max[16 * g + t] : max_score;
    float16v qv[V];
    for (int c = 0; c < V; ++c) qv[c] = load16(q[g] + 16 * c);
    float* sg = scores + g * score_stride;
    for (int64_t r = j; r < length; ++r) {
      const float* k = keys + (slots ? slots[r] : r) * key_stride;
      float16v a = qv[0] * load16(k);
      for (int c = 1; c < V; ++c) a += qv[c] * load16(k + 16 * c);
      sg[r] = sum16(a) * scale;
      max_score = sg[r] > max_score ? sg[r] : max_score;
    }
    for (int64_t r = 0; r < length; r += kLanes) {
      const floatv e = exp_nonpositive(loadv(sg + r) - max_score);
      std::memcpy(sg + r, &e, sizeof(e));
    }
  }
  std::memset(acc, 0, sizeof(float) * D * group);
  accumulate_values<D>(group, values, key_stride, slots, length, scores, score_stride, acc, kValueBlock);
  // Each head's sum of its exps in key order, the heads' sums side by side (independent chains overlap).
  float total[kMaxGroup] = {};
  for (int64_t r = 0; r < length; ++r)
    for (int g = 0; g < group; ++g) total[g] += scores[g * score_stride + r];
  for (int g = 0; g < group; ++g) {
    const float inv = 1.0f / total[g];
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
