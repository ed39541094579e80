// A GGUF-native model's decoder layers, run from C++ (gguf_decoder.cpp).
#pragma once
#include <ATen/ATen.h>

#include <vector>

class GGUFDecoder {
 public:
  GGUFDecoder(int64_t heads, int64_t kv_heads, int64_t head_dim, double eps);
  // One layer: its two norms' fp32 weights and its four projections (qkv, o, gate_up, down), each as
  // gguf_matmul's segments (packed tensors, type ids, output sizes) and bias (empty: none).
  void add_layer(const at::Tensor& input_norm, const at::Tensor& post_norm,
                 const std::vector<std::vector<at::Tensor>>& packed, const std::vector<std::vector<int64_t>>& types,
                 const std::vector<std::vector<int64_t>>& sizes, const std::vector<at::Tensor>& biases);
  at::Tensor run(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& signed_sin, const at::Tensor& keys,
                 const at::Tensor& values, const at::Tensor& write_slots, const at::Tensor& lengths,
                 const at::Tensor& table, const at::Tensor& table_rows, int64_t num_layers) const;
  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }

 private:
  struct Projection {
    std::vector<at::Tensor> packed;
    std::vector<int64_t> types, sizes;
    at::Tensor bias;
  };
  struct Layer {
    at::Tensor input_norm, post_norm;
    Projection qkv, o, gate_up, down;
  };
  int64_t heads_, kv_heads_, head_dim_;
  double eps_;
  std::vector<Layer> layers_;
};
