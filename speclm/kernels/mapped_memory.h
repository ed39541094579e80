// Memory for weights: buffers backed by huge pages, and files mapped as tensors (mapped_memory.cpp).
#pragma once
#include <ATen/ATen.h>

#include <string>

at::Tensor huge_page_buffer(int64_t bytes);
at::Tensor map_file(const std::string& path, int64_t offset, int64_t bytes, bool writable);
void seal_mapping(const at::Tensor& mapped);
