"""Process settings that loading runs under: glibc's malloc returning big frees to the OS (peak RSS) and
then set for running, and torch on one thread for the many small ops of the float path."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from contextlib import contextmanager

import torch

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (malloc.h)


@functools.cache
def _libc():
    """glibc, or None (another C library: the settings below then do nothing)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


# glibc's malloc settings while a model runs: the ceilings its own dynamic thresholds would reach (a
# 32 MB mmap threshold, trimming past twice that): setting a threshold, as loading does, turns those off.
# Passes over many rows (a prompt chunk, a verification's logits) allocate temporaries of megabytes in
# every layer; served by mmap, each allocation pays a page fault per 4 KB when first written, which
# slowed prompt passes (benchmarks/prefill_malloc/). In the heap they are reused.
RUNNING_MMAP_THRESHOLD = 32 << 20
RUNNING_TRIM_THRESHOLD = 64 << 20


@contextmanager
def loading_memory(threshold: int = 1 << 20):
    """While loading, serve allocations of >= 1 MB by mmap, so freeing them returns the memory to the OS
    at once (loading's per-layer fp32 temporaries would otherwise stay in the heap, raising peak RSS);
    afterwards give the heap's free pages back and set the running thresholds above. Process-wide."""
    libc = _libc()
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, threshold)
    try:
        yield
    finally:
        if libc is not None:
            libc.malloc_trim(0)
            libc.mallopt(M_MMAP_THRESHOLD, RUNNING_MMAP_THRESHOLD)
            libc.mallopt(M_TRIM_THRESHOLD, RUNNING_TRIM_THRESHOLD)


@contextmanager
def single_threaded():
    """Run torch ops on one thread for a while. Loading is many small elementwise ops, and on a busy
    machine each multi-threaded op can stall for tens of milliseconds waiting for its other threads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
