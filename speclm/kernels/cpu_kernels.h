// speclm's CPU kernels, each computing a row in a fixed order whatever the number of rows: attention rows
// (attend_rows.cpp), rotary, RMSNorm and SiLU (elementwise.cpp), the int4 and w8a8 matmuls (int_matmul.cpp)
// and the dense matmul (dense_matmul.cpp); bound in bindings.cpp, and gguf_decoder.cpp calls the first four.
//
// Why our own: exact speculative decoding needs a verification row's logits to equal, bit for bit,
// the logits plain decoding computes for that token. torch's SDPA (and its GEMMs) accumulate a many-row
// call in another order than a one-row call, and take other paths for one row than for several.
#pragma once
#include <ATen/ATen.h>

#include <string>

at::Tensor attend_rows(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                       const at::Tensor& lengths, const at::Tensor& slots, const at::Tensor& slot_rows, double scale);
at::Tensor rope_qkv(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& signed_sin, int64_t heads,
                    int64_t kv_heads, at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& slots);
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor silu_mul(const at::Tensor& gate_up);
at::Tensor int4_matmul(const at::Tensor& x, const at::Tensor& packed, int64_t group_size,
                       const at::Tensor& scales_and_zeros);
bool int4_available();
std::string int4_path();
at::Tensor w8a8_matmul(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& weight_scales,
                       const at::Tensor& weight_sums);
bool w8a8_available();
at::Tensor dense_matmul(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias);
