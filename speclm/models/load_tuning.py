"""Process settings that loading runs under: glibc's malloc returning big frees to the OS (peak RSS),
and torch on one thread for the many small ops of the float path."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from contextlib import contextmanager

import torch


@functools.cache
def _libc():
    """glibc, or None (another C library: the two calls below then do nothing)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def return_big_frees_to_os(threshold: int = 1 << 20) -> None:
    """Serve allocations of >= 1 MB by mmap, so freeing them returns the memory to the OS at once.
    glibc otherwise raises its mmap threshold after the first big frees, and loading's per-layer fp32
    temporaries then stay in the heap, raising peak RSS. (Process-wide. Per decoded token nothing
    this big is allocated; a verification pass over many rows, whose logits pass 1 MB, pays one mmap.)"""
    libc = _libc()
    if libc is not None:
        libc.mallopt(-3, threshold)  # M_MMAP_THRESHOLD


def trim_freed_memory() -> None:
    """Give the heap's free pages back to the OS (after loading)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


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
