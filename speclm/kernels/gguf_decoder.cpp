// A GGUF-native model's decoder layers run from C++ for rows that attend like decoding: the engine's
// passes over its paged pool and a draft model's over its contiguous cache. The Python loop over
// layers makes ~14 torch and kernel calls per layer through the interpreter, which a one-token pass of
// a small draft model feels (benchmarks/pass_cost/). This loop calls the same kernels and ATen ops in the
// same order as speclm/models/layers.py's decoder_layer (rms_norm, gguf_matmul, rope_qkv, attend_rows,
// silu_mul, add), so its results are the Python path's bit for bit (tests/kernels/test_gguf_decoder.py).
#include "gguf_decoder.h"

#include <cmath>

#include "cpu_kernels.h"
#include "gguf_kernels.h"

GGUFDecoder::GGUFDecoder(int64_t heads, int64_t kv_heads, int64_t head_dim, double eps)
    : heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim), eps_(eps) {
  TORCH_CHECK(heads > 0 && kv_heads > 0 && heads % kv_heads == 0 && head_dim > 0,
              "GGUFDecoder: shapes");
}

void GGUFDecoder::add_layer(const at::Tensor& input_norm, const at::Tensor& post_norm,
                            const std::vector<std::vector<at::Tensor>>& packed,
                            const std::vector<std::vector<int64_t>>& types,
                            const std::vector<std::vector<int64_t>>& sizes, const std::vector<at::Tensor>& biases) {
  TORCH_CHECK(packed.size() == 4 && types.size() == 4 && sizes.size() == 4 && biases.size() == 4,
              "GGUFDecoder.add_layer: four projections (qkv, o, gate_up, down)");
  TORCH_CHECK(input_norm.scalar_type() == at::kFloat && post_norm.scalar_type() == at::kFloat,
              "GGUFDecoder.add_layer: fp32 norm weights");
  Projection p[4];
  for (int i = 0; i < 4; ++i) p[i] = Projection{packed[i], types[i], sizes[i], biases[i]};
  layers_.push_back(Layer{input_norm.contiguous(), post_norm.contiguous(), p[0], p[1], p[2], p[3]});
}

// x [n, hidden] fp32: the new rows (cos/signed_sin [n, rotary_dim] fp32 at their positions); keys/values
// [layers, kv_heads, slots, head_dim] fp32: a contiguous cache or a paged pool. Row i's key and value go
// to slot write_slots[i]; it then attends as attend_rows says (lengths, table, table_rows: a DecodeRows).
// Returns the hidden states after `num_layers` layers (before the final norm).
at::Tensor GGUFDecoder::run(const at::Tensor& x_in, const at::Tensor& cos, const at::Tensor& signed_sin,
                            const at::Tensor& keys, const at::Tensor& values, const at::Tensor& write_slots,
                            const at::Tensor& lengths, const at::Tensor& table, const at::Tensor& table_rows,
                            int64_t num_layers) const {
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kFloat, "GGUFDecoder.run: x [n, hidden] fp32");
  TORCH_CHECK(num_layers >= 1 && num_layers <= static_cast<int64_t>(layers_.size()), "GGUFDecoder.run: num_layers");
  TORCH_CHECK(keys.dim() == 4 && keys.size(0) >= num_layers && values.sizes() == keys.sizes() &&
                  keys.scalar_type() == at::kFloat && values.scalar_type() == at::kFloat,
              "GGUFDecoder.run: fp32 caches [layers, kv_heads, slots, head_dim]");
  const int64_t n = x_in.size(0);
  const double scale = std::pow(static_cast<double>(head_dim_), -0.5);  // as Python's head_dim ** -0.5
  at::Tensor x = x_in.contiguous();
  for (int64_t l = 0; l < num_layers; ++l) {
    const Layer& layer = layers_[l];
    at::Tensor k_cache = keys.select(0, l), v_cache = values.select(0, l);
    const at::Tensor qkv = gguf_matmul(rms_norm(x, layer.input_norm, eps_), layer.qkv.packed, layer.qkv.types,
                                   layer.qkv.sizes, layer.qkv.bias);
    const at::Tensor q = rope_qkv(qkv, cos, signed_sin, heads_, kv_heads_, k_cache, v_cache, write_slots);
    const at::Tensor attended =
        attend_rows(q, k_cache, v_cache, lengths, table, table_rows, scale).transpose(0, 1).reshape({n, -1});
    x = x + gguf_matmul(attended, layer.o.packed, layer.o.types, layer.o.sizes, layer.o.bias);
    const at::Tensor gate_up = gguf_matmul(rms_norm(x, layer.post_norm, eps_), layer.gate_up.packed, layer.gate_up.types,
                                       layer.gate_up.sizes, layer.gate_up.bias);
    x = x + gguf_matmul(silu_mul(gate_up), layer.down.packed, layer.down.types, layer.down.sizes, layer.down.bias);
  }
  return x;
}
