// The kernels of cpu_kernels.cpp that other sources call (gguf_decoder.cpp).
#pragma once
#include <torch/extension.h>

at::Tensor attend_rows(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                       const at::Tensor& lengths, const at::Tensor& slots, const at::Tensor& slot_rows, double scale);
at::Tensor rope_qkv(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& signed_sin, int64_t heads,
                    int64_t kv_heads, at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& slots);
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor silu_mul(const at::Tensor& gate_up);
