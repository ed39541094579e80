// The element-wise kernels: rotary with the KV cache write (rope_qkv), SiLU of the fused gate/up
// projection (silu_mul) and RMSNorm (rms_norm), each one call where torch's decomposed forms are several ops.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "cpu_kernels.h"
#include "vector16.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <vector>

using namespace vec16;

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
// calls' dispatch costs more than their arithmetic. Elementwise in floatv vectors (vector16.h), rows
// over the threads.
namespace {
inline floatv silu(floatv x) {  // x * sigmoid(x)
  const floatv e = exp_nonpositive(x < 0.0f ? x : -x);  // exp(-|x|), no overflow
  return (x < 0.0f ? x * e : x) / (1.0f + e);
}

void silu_mul_row(const float* g, const float* u, float* y, int64_t width) {
  int64_t j = 0;
  for (; j + kLanes <= width; j += kLanes) {
    const floatv r = silu(loadv(g + j)) * loadv(u + j);
    std::memcpy(y + j, &r, sizeof(r));
  }
  if (j < width) {  // a short tail, padded with zeros
    float gate[kLanes] = {}, up[kLanes] = {}, r[kLanes];
    std::memcpy(gate, g + j, sizeof(float) * (width - j));
    std::memcpy(up, u + j, sizeof(float) * (width - j));
    const floatv v = silu(loadv(gate)) * loadv(up);
    std::memcpy(r, &v, sizeof(v));
    std::memcpy(y + j, r, sizeof(float) * (width - j));
  }
}

void silu_mul_row(const c10::BFloat16* g, const c10::BFloat16* u, c10::BFloat16* y, int64_t width) {
  float gate[kLanes], silu_out[kLanes];
  for (int64_t j0 = 0; j0 < width; j0 += kLanes) {  // a short tail is padded with zeros
    const int64_t count = std::min<int64_t>(kLanes, width - j0);
    for (int64_t j = 0; j < kLanes; ++j) gate[j] = j < count ? static_cast<float>(g[j0 + j]) : 0.0f;
    const floatv r = silu(loadv(gate));
    std::memcpy(silu_out, &r, sizeof(r));
    for (int64_t j = 0; j < count; ++j)
      y[j0 + j] = c10::BFloat16(static_cast<float>(c10::BFloat16(silu_out[j])) * static_cast<float>(u[j0 + j]));
  }
}

template <class T>
void silu_mul_rows(const T* src, int64_t stride, T* dst, int64_t n, int64_t width) {
  const auto rows = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) silu_mul_row(src + i * stride, src + i * stride + width, dst + i * width, width);
  };
  if (n > 1)
    at::parallel_for(0, n, 1, rows);
  else
    rows(0, n);  // one row: less work than waking the other threads
}
}  // namespace

at::Tensor silu_mul(const at::Tensor& gate_up) {
  const bool bf16 = gate_up.scalar_type() == at::kBFloat16;
  TORCH_CHECK(gate_up.dim() == 2 && (bf16 || gate_up.scalar_type() == at::kFloat) && gate_up.stride(1) == 1,
              "silu_mul: bf16 or fp32 [n, 2 * width], rows contiguous");
  const int64_t n = gate_up.size(0), width = gate_up.size(1) / 2, stride = gate_up.stride(0);
  auto out = at::empty({n, width}, gate_up.options());
  if (bf16)
    silu_mul_rows(gate_up.data_ptr<c10::BFloat16>(), stride, out.data_ptr<c10::BFloat16>(), n, width);
  else
    silu_mul_rows(gate_up.data_ptr<float>(), stride, out.data_ptr<float>(), n, width);
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
