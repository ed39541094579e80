// The Python module: every kernel's binding (speclm/kernels/__init__.py builds it from all the sources).
#include <torch/extension.h>

#include "cpu_kernels.h"
#include "gguf_decoder.h"
#include "gguf_kernels.h"
#include "mapped_memory.h"

// The kernels release the GIL while they run (the server's event loop keeps serving).
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("attend_rows", &attend_rows, "one-query-at-a-time attention rows (see attend_rows.cpp)",
        py::call_guard<py::gil_scoped_release>());
  m.def("rms_norm", &rms_norm, "RMSNorm of fp32 rows, result in the weight's dtype",
        py::call_guard<py::gil_scoped_release>());
  m.def("rope_qkv", &rope_qkv, "rotate q and k of a QKV projection, write k and v to cache slots; returns q",
        py::call_guard<py::gil_scoped_release>());
  m.def("silu_mul", &silu_mul, "silu(gate) * up of a fused gate/up projection, bf16 or fp32",
        py::call_guard<py::gil_scoped_release>());
  m.def("int4_matmul", &int4_matmul, "bf16 x @ int4 weights (AVX-512 BF16 or AVX2), row-invariant",
        py::call_guard<py::gil_scoped_release>());
  m.def("int4_available", &int4_available, "whether int4_matmul was compiled (AVX-512 BF16 or AVX2 with FMA)");
  m.def("int4_path", &int4_path, "the vector instructions int4_matmul was compiled for ('' where none)");
  m.def("w8a8_matmul", &w8a8_matmul, "fp32 x (int8 per row) @ int8 weights (AVX-512 VNNI), row-invariant",
        py::call_guard<py::gil_scoped_release>());
  m.def("w8a8_available", &w8a8_available, "whether w8a8_matmul was compiled (AVX-512 VNNI)");
  m.def("gguf_pack", &gguf_pack, "repack a GGUF tensor's rows (raw bytes) for gguf_matmul, into `out` if not empty",
        py::call_guard<py::gil_scoped_release>());
  m.def("gguf_packed_bytes", &gguf_packed_bytes, "bytes of a repacked tensor of `rows` rows of `row_bytes` file bytes");
  m.def("huge_page_buffer", &huge_page_buffer, "a uint8 tensor whose 2 MB-aligned interior is advised onto huge pages");
  m.def("map_file", &map_file, "bytes of a file from a 2 MB-aligned offset, mapped (shared and writable, or private and "
        "read-only) from a 2 MB boundary, as a uint8 tensor", py::call_guard<py::gil_scoped_release>());
  m.def("seal_mapping", &seal_mapping, "make a writable map_file tensor read-only");
  m.def("gguf_to_q4_0", &gguf_to_q4_0, "a GGUF tensor's rows (raw bytes) re-quantized to Q4_0 (raw bytes)",
        py::call_guard<py::gil_scoped_release>());
  m.def("gguf_unpack_rows", &gguf_unpack_rows, "dequantize rows of a repacked GGUF tensor to fp32",
        py::call_guard<py::gil_scoped_release>());
  m.def("gguf_matmul", &gguf_matmul, "fp32 x (int8 per row and block) @ repacked GGUF weights, row-invariant",
        py::call_guard<py::gil_scoped_release>());
  m.def("gguf_quantize_activations", &gguf_quantize_activations,
        "fp32 rows quantized as gguf_matmul quantizes them (Q8_K or Q8_0): codes, block scales, code sums");
  m.def("gguf_select_rows", &gguf_select_rows, "a repacked GGUF tensor of some rows of another",
        py::call_guard<py::gil_scoped_release>());
  m.def("gguf_available", &gguf_available, "whether gguf_matmul was compiled (AVX-512 VNNI or AVX2)");
  m.def("gguf_path", &gguf_path, "the vector instructions gguf_matmul was compiled for ('' where none)");
  m.def("gguf_set_row_group", &gguf_set_row_group, py::arg("rows"),
        "activation rows gguf_matmul multiplies in one pass over the weights (1 to 6); returns the previous number");
  m.def("gguf_set_prefetch", &gguf_set_prefetch, py::arg("one_row"), py::arg("rows"),
        "bytes gguf_matmul prefetches ahead of the weights in a pass over one row and over several (multiples of 64; "
        "0: none); returns the previous two");
  py::class_<GGUFDecoder>(m, "GGUFDecoder", "a GGUF-native model's decoder layers run from C++ (gguf_decoder.cpp)")
      .def(py::init<int64_t, int64_t, int64_t, double>())
      .def("add_layer", &GGUFDecoder::add_layer)
      .def("run", &GGUFDecoder::run, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("num_layers", &GGUFDecoder::num_layers);
  m.def("dense_matmul", &dense_matmul, "x @ w.T (+ bias) for fp32 or bf16 weights [N, K], row-invariant, fp32 out",
        py::call_guard<py::gil_scoped_release>());
}
