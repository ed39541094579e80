// GGUF-native weights: repacking and reading rows back (gguf_pack.cpp), conversion to Q4_0 (gguf_convert.cpp),
// the activations' quantization (gguf_activations.cpp) and the matmul (gguf_matmul.cpp).
#pragma once
#include <ATen/ATen.h>

#include <string>
#include <vector>

int64_t gguf_packed_bytes(int64_t type, int64_t rows, int64_t row_bytes);
at::Tensor gguf_pack(const at::Tensor& raw, int64_t type, const at::Tensor& order, const at::Tensor& out, int64_t first_row);
at::Tensor gguf_to_q4_0(const at::Tensor& raw, int64_t type, const at::Tensor& scratch);
at::Tensor gguf_unpack_rows(const at::Tensor& packed, int64_t type, int64_t k_in, const at::Tensor& rows);
at::Tensor gguf_matmul(const at::Tensor& x, const std::vector<at::Tensor>& packed, const std::vector<int64_t>& types,
                       const std::vector<int64_t>& n_outs, const at::Tensor& bias);
std::vector<at::Tensor> gguf_quantize_activations(const at::Tensor& x, bool k_quant);
at::Tensor gguf_select_rows(const at::Tensor& packed, int64_t type, int64_t k_in, const at::Tensor& rows);
bool gguf_available();
std::string gguf_path();
// Bytes prefetched ahead of the weights in a pass over one row and over several; returns the previous two.
std::vector<int64_t> gguf_set_prefetch(int64_t one_row, int64_t rows);
// Activation rows that share one pass over the weights (1 to 6); returns the previous number.
int64_t gguf_set_row_group(int64_t rows);
