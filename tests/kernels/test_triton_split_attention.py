"""Split-K paged attention (speclm/kernels/triton_attention.py) in Triton's interpreter on the CPU
(TRITON_INTERPRET=1, in a subprocess): against the torch reference over rows of 0 to 3 partitions, GQA,
windows and padded table rows; a row within one partition equal bit for bit to the single pass; and a row's
bits independent of its batch (alone with a table of its own width, among others, with fewer programs per
row or fewer rows per launch). Skipped where Triton is not installed (CI). The interpreter computes through
numpy, which has no bf16: fp16 stands in for half precision here, tests/cuda/test_cuda_attention.py runs
bf16 on a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

from tests.kernels.test_triton_interpreter import PATCH  # noqa: E402

SCRIPT = PATCH + textwrap.dedent(
    """
    from speclm.kernels import triton_attention
    from speclm.kernels.triton_attention import paged_attention
    from speclm.models.gpu_attention import attend_rows_reference

    P, SCRATCH, WIDTH = 32, 299, 100  # partition; the slot padded table rows hold; 4 partitions at most
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([0, 1, 31, 32, 33, 64, 65, 100])  # 0 to 3 partitions and part of a fourth
    table_rows = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7])


    def same(a, b):
        return torch.equal(a.nan_to_num(), b.nan_to_num()) and torch.equal(a.isnan(), b.isnan())


    for heads, kv, d, dtype in [(4, 2, 8, torch.float32), (6, 2, 64, torch.float32), (9, 3, 64, torch.float16),
                                (7, 1, 16, torch.float32)]:
        q = torch.randn(heads, len(lengths), d, generator=g).to(dtype)
        keys, values = (torch.randn(kv, SCRATCH + 1, d, generator=g).to(dtype) for _ in range(2))
        table = torch.full((len(lengths), WIDTH), SCRATCH)  # each row's slots, then the scratch slot
        for i, n in enumerate(lengths.tolist()):
            table[i, :n] = torch.randperm(SCRATCH, generator=g)[:n]
        args = (q, keys, values, lengths, table, table_rows, d**-0.5)
        tol = 1e-2 if dtype == torch.float16 else 1e-5
        for window in (None, 1, 20, 40):  # 40: a window across two partitions
            expected = attend_rows_reference(*args, window)
            split = paged_attention(*args, window, partition=P)
            single = paged_attention(*args, window, partition=0)
            for got in (split, single):
                assert got.dtype == dtype and got.shape == q.shape
                assert torch.allclose(got.float(), expected.float(), atol=tol, rtol=0, equal_nan=True), (
                    heads, d, dtype, window, (got.float() - expected.float()).abs().nan_to_num().max())
            assert expected[:, 0].isnan().all() and not expected[:, 1:].isnan().any()  # (no keys: no value)
            first = (lengths - (window or 2**30)).clamp(min=0) // P
            one_partition = first == (lengths - 1).clamp(min=0) // P
            assert same(split[:, one_partition], single[:, one_partition]), (heads, window)
            for i, n in enumerate(lengths.tolist()):  # alone, its table as wide as itself (short: the single pass)
                own = (lengths[i : i + 1], table[i : i + 1, : max(n, 1)], torch.zeros(1, dtype=torch.long))
                alone = paged_attention(q[:, i : i + 1], keys, values, *own, d**-0.5, window, partition=P)
                assert same(alone, split[:, i : i + 1]), (heads, window, n)
            saved = triton_attention.SPLIT_PROGRAMS, triton_attention.SPLIT_BUFFER_BYTES
            triton_attention.SPLIT_PROGRAMS, triton_attention.SPLIT_BUFFER_BYTES = 1, 1  # one program, one row a launch
            try:
                assert same(paged_attention(*args, window, partition=P), split), (heads, window)
            finally:
                triton_attention.SPLIT_PROGRAMS, triton_attention.SPLIT_BUFFER_BYTES = saved
    print("ok")
    """
)


def test_split_kernel_in_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
