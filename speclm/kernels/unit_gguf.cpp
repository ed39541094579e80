// One translation unit for the GGUF-native weights: repacking, re-quantization to Q4_0, the activations'
// int8 quantization, the matmul, and the huge-page buffers they live in (see unit_rows.cpp for why).
#include "mapped_memory.cpp"
#include "gguf_pack.cpp"
#include "gguf_convert.cpp"
#include "gguf_activations.cpp"
#include "gguf_matmul.cpp"
