// gguf_matmul: activation rows quantized once, then the output blocks over the threads in shrinking chunks
// taken as each thread is free, six rows per pass over its weights, with the weights' prefetch distance as a
// setting.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "gguf_activations.h"
#include "gguf_format.h"
#include "gguf_kernels.h"
#include "gguf_microkernel.h"
#include "gguf_microkernel_avx2.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

using namespace gguf;

#if SPECLM_GGUF_SIMD
namespace {
constexpr int kRows = 6;  // the most activation rows sharing one pass over a record (a verification of K <= 5 drafts)
// Rows sharing a pass (a speed setting: every number gives the same bits). On an AVX2 VM a 5-row pass was no
// faster with 3 or 4 (benchmarks/pass_cost/pass_cost_qwen1.5b_avx2_epyc.md).
int g_row_group = kRows;
// Bytes ahead of the weights being read that are prefetched (0: none): the decoding work per byte leaves
// too few loads in flight for the hardware prefetcher alone to keep a core's memory stream busy, and a
// multi-row pass (verification) then pays its compute and its memory time one after the other. A pass
// over several rows does more work per byte, so it looks further ahead. The defaults come from a sweep
// on the real pair (benchmarks/pass_cost/).
int64_t g_prefetch_one_row = 2048, g_prefetch_rows = 3072;
// A thread's next chunk: the blocks still left divided by kShareDivisor x threads, at least one (see run_type).
constexpr int64_t kShareDivisor = 2;

template <int64_t TYPE>
void run_type(const uint8_t* packed, int64_t out_blocks, int64_t blocks, int64_t record, const std::vector<QuantizedRow>& xq,
              float* y, int64_t y_stride, int64_t column, int64_t n_out) {
  const int64_t m = static_cast<int64_t>(xq.size());
  const int64_t prefetch = m > 1 ? g_prefetch_rows : g_prefetch_one_row;
  // The output blocks go to the threads in chunks, each thread taking the next one when done with its last.
  // A chunk is a share of the blocks still left: long at first (few hand-outs), one block at the end, so
  // neither thread waits long for the other's last chunk (the threads do not stream the weights equally
  // fast, and a fixed chunk of 1/16 of the blocks left one waiting). Which thread computes a block changes no bits.
  const int64_t threads = at::get_num_threads();
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    alignas(64) float tail[kRows][16];
    int64_t begin = next.load();
    while (begin < out_blocks) {
      const int64_t chunk = std::max<int64_t>(1, (out_blocks - begin) / (kShareDivisor * threads));
      if (!next.compare_exchange_weak(begin, begin + chunk)) continue;  // (begin now holds the new value)
      const int64_t end = std::min(out_blocks, begin + chunk);
      for (int64_t ob = begin; ob < end; ++ob) {
        const bool partial = ob * 16 + 16 > n_out;
        for (int64_t r0 = 0; r0 < m; r0 += g_row_group) {
          const int rows = static_cast<int>(std::min<int64_t>(g_row_group, m - r0));
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
      begin = next.load();
    }
  });
}
}  // namespace
#endif

bool gguf_available() { return kGgufAvailable; }

std::string gguf_path() { return SPECLM_GGUF_SIMD == 512 ? "AVX-512 VNNI" : SPECLM_GGUF_SIMD == 256 ? "AVX2" : ""; }

std::vector<int64_t> gguf_set_prefetch(int64_t one_row, int64_t rows) {
  TORCH_CHECK(one_row >= 0 && one_row % 64 == 0 && rows >= 0 && rows % 64 == 0,
              "gguf_set_prefetch: multiples of 64 bytes, >= 0");
#if SPECLM_GGUF_SIMD
  std::vector<int64_t> previous{g_prefetch_one_row, g_prefetch_rows};
  g_prefetch_one_row = one_row;
  g_prefetch_rows = rows;
  return previous;
#else
  return {one_row, rows};
#endif
}

int64_t gguf_set_row_group(int64_t rows) {
  TORCH_CHECK(rows >= 1 && rows <= 6, "gguf_set_row_group: 1 to 6 rows");
#if SPECLM_GGUF_SIMD
  const int64_t previous = g_row_group;
  g_row_group = static_cast<int>(rows);
  return previous;
#else
  return rows;
#endif
}

// x [M, K] fp32 times the repacked weights of several segments (their outputs side by side: a fused QKV
// projection whose parts have different types), plus bias [sum n] (optional) -> y [M, sum n] fp32.
at::Tensor gguf_matmul(const at::Tensor& x, const std::vector<at::Tensor>& packed, const std::vector<int64_t>& types,
                       const std::vector<int64_t>& n_outs, const at::Tensor& bias) {
  TORCH_CHECK(kGgufAvailable, "gguf_matmul: this build has neither AVX-512 VNNI nor AVX2 (check gguf_available() first)");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "gguf_matmul: x [M, K] fp32");
  TORCH_CHECK(packed.size() == types.size() && types.size() == n_outs.size() && !packed.empty(), "gguf_matmul: segments");
  auto xc = x.contiguous();
  const int64_t m = xc.size(0), k_in = xc.size(1);
  int64_t total = 0;
  for (int64_t n : n_outs) total += n;
  auto y = at::empty({m, total}, xc.options());
  if (m == 0) return y;
#if SPECLM_GGUF_SIMD
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
