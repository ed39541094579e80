// One translation unit for the row kernels (attention, rotary/RMSNorm/SiLU, the int4/w8a8 and dense matmuls)
// and the GGUF decoder loop that calls them. Compiled one by one, each source re-parsed ATen's headers,
// which was most of a first build's time; included together they parse them once
// (benchmarks/kernel_build/). The sources stay separate files and keep their own anonymous namespaces.
#include "attend_rows.cpp"
#include "dense_matmul.cpp"
#include "elementwise.cpp"
#include "int_matmul.cpp"
#include "gguf_decoder.cpp"
