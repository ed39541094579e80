// Memory for weights: buffers backed by huge pages, and files mapped as tensors (a PackCache entry).
#include "mapped_memory.h"

#include <cstdint>

#if defined(__linux__)
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#endif

// A byte tensor whose memory the kernel is asked to back with 2 MB pages (Linux, THP in madvise mode):
// streaming a model's weights through 4 kB pages costs a TLB miss every 4 kB, and loading them a page
// fault every 4 kB. Only the 2 MB-aligned interior can be huge pages; a loader that bump-allocates its
// tensors from a few large buffers (speclm/models/gguf_weights.py: PackArena) puts nearly all of them there.
at::Tensor huge_page_buffer(int64_t bytes) {
  auto t = at::empty({bytes}, at::TensorOptions().dtype(at::kByte));
#if defined(__linux__)
  const uintptr_t huge = 2u << 20, p = reinterpret_cast<uintptr_t>(t.data_ptr());
  const uintptr_t start = (p + huge - 1) & ~(huge - 1), end = (p + static_cast<uintptr_t>(bytes)) & ~(huge - 1);
  if (end > start) madvise(reinterpret_cast<void*>(start), end - start, MADV_HUGEPAGE);
#endif
  return t;
}

// `bytes` bytes of a file from `offset` (a multiple of 2 MB), mapped as a uint8 tensor that unmaps when
// freed: a PackCache entry (a model's packed weights kept on disk, speclm/models/pack_cache.py).
// Writable: shared, so that packing writes straight into the page cache (the caller reserves the
// blocks it writes, and the file must reach offset + bytes). Read-only: private. The mapping starts on a
// 2 MB boundary and asks for huge pages, so the page cache's 2 MB folios (ext4 and xfs make them) are
// mapped as such: the weights stream through as few TLB entries as a PackArena's huge pages, and a load
// faults in 2 MB at a time, from the page cache when the file was used recently.
at::Tensor map_file(const std::string& path, int64_t offset, int64_t bytes, bool writable) {
  const int64_t huge = 2 << 20;
  TORCH_CHECK(bytes > 0 && offset >= 0 && offset % huge == 0, "map_file: bytes > 0 from a 2 MB-aligned offset");
#if defined(__linux__)
  const int fd = open(path.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
  TORCH_CHECK(fd >= 0, "map_file: cannot open ", path);
  struct stat st;
  const bool long_enough = fstat(fd, &st) == 0 && st.st_size >= offset + bytes;
  if (!long_enough) close(fd);
  TORCH_CHECK(long_enough, "map_file: ", path, " is shorter than ", offset + bytes, " bytes");
  const size_t length = static_cast<size_t>(bytes);
  // Reserve an aligned range, then map the file over it.
  void* reserved = mmap(nullptr, length + huge, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (reserved == MAP_FAILED) close(fd);
  TORCH_CHECK(reserved != MAP_FAILED, "map_file: no address space for ", bytes, " bytes");
  const uintptr_t base = reinterpret_cast<uintptr_t>(reserved), reserved_end = base + length + huge;
  const uintptr_t start = (base + huge - 1) & ~static_cast<uintptr_t>(huge - 1), end = start + length;
  void* data = mmap(reinterpret_cast<void*>(start), length, writable ? PROT_READ | PROT_WRITE : PROT_READ,
                    (writable ? MAP_SHARED : MAP_PRIVATE) | MAP_FIXED, fd, offset);
  close(fd);
  if (start > base) munmap(reserved, start - base);
  if (data == MAP_FAILED) munmap(reinterpret_cast<void*>(start), reserved_end - start);
  else if (reserved_end > end) munmap(reinterpret_cast<void*>(end), reserved_end - end);
  TORCH_CHECK(data != MAP_FAILED, "map_file: cannot map ", path);
  madvise(data, length, MADV_HUGEPAGE);
  // A read-only entry that is not in the page cache (after a reboot, or evicted) is read ahead from now on,
  // in the background, as llama.cpp does with its file: the first pass then finds its pages in memory
  // instead of faulting each one in from the disk. Nothing is mapped into this process by it (no RSS).
  if (!writable) madvise(data, length, MADV_WILLNEED);
  return at::from_blob(data, {bytes}, [length](void* p) { munmap(p, length); }, at::TensorOptions().dtype(at::kByte));
#else
  TORCH_CHECK(false, "map_file: Linux only");
#endif
}

// Make a writable map_file tensor read-only (a finished cache entry: nothing may write to it again).
void seal_mapping(const at::Tensor& mapped) {
  TORCH_CHECK(mapped.dim() == 1 && mapped.scalar_type() == at::kByte && mapped.storage_offset() == 0 &&
                  static_cast<int64_t>(mapped.storage().nbytes()) == mapped.numel(),
              "seal_mapping: a whole map_file tensor");
#if defined(__linux__)
  TORCH_CHECK(mprotect(mapped.data_ptr(), static_cast<size_t>(mapped.numel()), PROT_READ) == 0, "seal_mapping: mprotect failed");
#endif
}
