"""The GPU attention's torch reference (the interface of the Triton kernel) and its step plan, checked on
the CPU against speclm's CPU attention: the same rows, the same slots, the same masking for prompts,
decode and verification rows and token trees in a paged batch."""

from __future__ import annotations

import pytest
import torch

from speclm.models import gpu_attention
from speclm.models.attention import BatchEntry, PagedAttentionMetadata, attend_like_decoding
from speclm.models.gpu_attention import GpuBatchPlan, attend_rows_reference

HEADS, KV_HEADS, HEAD_DIM, POOL = 6, 2, 16, 256


def batch_entries() -> list[BatchEntry]:
    """A prompt from slot 0, a decode row, a verification chain, a later prompt chunk and a token tree,
    each over scattered pool slots."""
    perm = torch.randperm(POOL, generator=torch.Generator().manual_seed(0)).tolist()
    take = iter(range(0, POOL, 40))

    def slots(n: int) -> list[int]:
        first = next(take)
        return perm[first : first + n]

    return [
        BatchEntry(tokens=[1] * 7, start=0, slots=slots(7), num_logits=1),  # prompt
        BatchEntry(tokens=[1], start=12, slots=slots(13), num_logits=1),  # decode
        BatchEntry(tokens=[1] * 4, start=20, slots=slots(24), num_logits=4),  # verification chain
        BatchEntry(tokens=[1] * 5, start=9, slots=slots(14), num_logits=5),  # a second prompt chunk
        BatchEntry(  # a tree: pending token, then nodes 1 (child of 0), 2 (child of 0), 3 (child of 1)
            tokens=[1] * 4, start=10, slots=slots(14), num_logits=4, row_paths=[[0], [0, 1], [0, 2], [0, 1, 3]]
        ),
    ]


def random_step(dtype=torch.float32):
    g = torch.Generator().manual_seed(1)
    entries = batch_entries()
    meta = PagedAttentionMetadata(entries)
    q = torch.randn(HEADS, meta.num_tokens, HEAD_DIM, generator=g).to(dtype)
    keys = torch.randn(KV_HEADS, POOL, HEAD_DIM, generator=g).to(dtype)
    values = torch.randn(KV_HEADS, POOL, HEAD_DIM, generator=g).to(dtype)
    return meta, q, keys, values


def test_reference_equals_cpu_attention_on_a_mixed_paged_batch():
    meta, q, keys, values = random_step()
    expected = meta.attend_cached(q, keys, values)  # the CPU path (kernel or per-row SDPA)
    rows = meta.pooled()
    got = attend_rows_reference(q, keys, values, rows.lengths, rows.slots, rows.slot_rows, HEAD_DIM**-0.5)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)


def test_reference_equals_cpu_attention_on_a_contiguous_cache():
    g = torch.Generator().manual_seed(2)
    q = torch.randn(HEADS, 3, HEAD_DIM, generator=g)
    keys, values = (torch.randn(KV_HEADS, 40, HEAD_DIM, generator=g) for _ in range(2))
    from speclm.models.attention import DecodeRows

    rows = DecodeRows.causal(30, 3)
    expected = attend_like_decoding(q, keys, values, rows)
    table = torch.arange(40)[None]
    got = attend_rows_reference(q, keys, values, rows.lengths, table, torch.zeros(3, dtype=torch.long), HEAD_DIM**-0.5)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)


def test_gpu_step_plan_sends_whole_prompts_to_sdpa_and_the_rest_to_the_kernel(monkeypatch):
    """GpuBatchPlan on CPU tensors, with the reference standing in for the Triton kernel: the whole
    prompt runs one causal SDPA call, every other row the kernel, and the result is the CPU path's."""
    meta, q, keys, values = random_step()
    expected = meta.attend_cached(q, keys, values)
    calls = []

    def reference(q, keys, values, lengths, table, table_rows, scale, window=None):
        calls.append(len(lengths))
        return attend_rows_reference(q, keys, values, lengths, table, table_rows, scale, window)

    monkeypatch.setattr(gpu_attention, "attend_rows", reference)
    plan = GpuBatchPlan(meta.sequences, q.device, meta._completes)
    # the prompt's rows by SDPA but its last (it completes the prompt: a speculating sequence runs that
    # token as a decode row, so plain decoding computes it as one too)
    assert [(first, n) for first, n, _ in plan.prefill] == [(0, 6)]
    got = plan.attend(q, keys, values, meta.pooled)
    assert calls == [meta.num_tokens - 6]  # one kernel call for all the other rows
    # a prompt chunk that does not complete its prompt runs whole by SDPA
    assert [(f, n) for f, n, _ in GpuBatchPlan(meta.sequences, q.device, [False] * 5).prefill] == [(0, 7)]
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reference_in_half_precision_stays_near_fp32(dtype):
    meta, q, keys, values = random_step()
    rows = meta.pooled()
    args = (rows.lengths, rows.slots, rows.slot_rows, HEAD_DIM**-0.5)
    full = attend_rows_reference(q, keys, values, *args)
    half = attend_rows_reference(q.to(dtype), keys.to(dtype), values.to(dtype), *args)
    assert half.dtype == dtype
    torch.testing.assert_close(half.float(), full, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("window", [3, 6, 100])
def test_windowed_reference_and_step_plan_equal_the_cpu_windowed_attention(window, monkeypatch):
    """A sliding-window layer: the reference (the kernel's interface) and the GPU step plan (a prompt by
    SDPA with a banded mask, the other rows by the kernel with its window) against the CPU's windowed rows."""
    meta, q, keys, values = random_step()
    expected = meta.attend_cached(q, keys, values, window)
    rows = meta.pooled()
    got = attend_rows_reference(q, keys, values, rows.lengths, rows.slots, rows.slot_rows, HEAD_DIM**-0.5, window)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)

    def reference(q, keys, values, lengths, table, table_rows, scale, window=None):
        return attend_rows_reference(q, keys, values, lengths, table, table_rows, scale, window)

    monkeypatch.setattr(gpu_attention, "attend_rows", reference)
    plan = GpuBatchPlan(meta.sequences, q.device, meta._completes)
    torch.testing.assert_close(plan.attend(q, keys, values, meta.pooled, window), expected, atol=2e-5, rtol=1e-5)
