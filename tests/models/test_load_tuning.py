"""Loading's malloc settings end when loading does: afterwards a big temporary freed and allocated again
is served from the heap, not by a fresh mmap whose every page faults when first written."""

from __future__ import annotations

import resource

import pytest
import torch

from speclm.models import builder
from speclm.models.load_tuning import _libc
from speclm.models.loader import load_checkpoint

pytestmark = pytest.mark.skipif(_libc() is None, reason="glibc's mallopt")


def page_faults_of_an_8mb_temporary() -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.empty(2 << 20).fill_(1.0)  # 8 MB, allocated, written and freed
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def test_big_temporaries_reuse_heap_memory_after_a_model_is_built():
    builder.build_model(load_checkpoint(None), weights="auto")
    # The fewest faults of several (the first may land in pages loading gave back, and another thread may
    # take a freed block in between); under loading's 1 MB mmap threshold each one faults on its 2048 pages.
    assert min(page_faults_of_an_8mb_temporary() for _ in range(5)) < 200
