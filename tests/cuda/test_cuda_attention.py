"""The Triton paged-attention kernel against its torch reference on the GPU, and the GPU path's rows
against the CPU attention."""

from __future__ import annotations

import functools

import pytest
import torch

from speclm.models.attention import PagedAttentionMetadata
from speclm.models.gpu_attention import attend_rows, attend_rows_reference
from tests.cuda.conftest import DEVICE, needs_cuda
from tests.models.test_gpu_attention import HEAD_DIM, batch_entries, random_step

pytestmark = needs_cuda

TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads,kv,head_dim", [(4, 2, 8), (9, 3, 64), (12, 2, 128), (14, 2, 64)])
def test_triton_kernel_matches_reference(dtype, heads, kv, head_dim):
    g = torch.Generator().manual_seed(heads * head_dim)
    slots = 4096
    q = torch.randn(heads, 9, head_dim, generator=g).to(dtype).to(DEVICE)
    keys, values = (torch.randn(kv, slots, head_dim, generator=g).to(dtype).to(DEVICE) for _ in range(2))
    lengths = torch.tensor([1, 2, 15, 16, 17, 63, 64, 65, 1000]).to(DEVICE)
    table = torch.stack([torch.randperm(slots, generator=g)[:1024] for _ in range(4)]).to(DEVICE)
    table_rows = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3, 0]).to(DEVICE)
    args = (q, keys, values, lengths, table, table_rows, head_dim**-0.5)
    expected, got = attend_rows_reference(*args), attend_rows(*args)
    assert got.dtype == dtype and got.shape == q.shape
    err = (expected.float() - got.float()).abs().max().item()
    assert err <= TOL[dtype], err


def test_triton_kernel_reads_a_non_contiguous_query():
    """self_attention hands the kernel q as a view of the QKV projection ([heads, n, d] with row stride)."""
    qkv = torch.randn(5, 6 + 2 * 2, 64, device=DEVICE).transpose(0, 1)  # [heads + 2 kv, n, d]
    q = qkv[:6]
    keys, values = (torch.randn(2, 100, 64, device=DEVICE) for _ in range(2))
    lengths = torch.tensor([3, 50, 100, 7, 1], device=DEVICE)
    table = torch.arange(100, device=DEVICE)[None]
    table_rows = torch.zeros(5, dtype=torch.long, device=DEVICE)
    args = (q, keys, values, lengths, table, table_rows, 0.125)
    torch.testing.assert_close(attend_rows(*args), attend_rows_reference(q.contiguous(), *args[1:]))


def test_gpu_paged_step_matches_the_cpu_attention():
    """A mixed step (prompt, decode, chain, later chunk, tree) through the GPU path equals the CPU's."""
    meta, q, keys, values = random_step()
    expected = meta.attend_cached(q, keys, values)
    gpu_meta = PagedAttentionMetadata(batch_entries(), DEVICE)
    got = gpu_meta.attend_cached(q.to(DEVICE), keys.to(DEVICE), values.to(DEVICE))
    torch.testing.assert_close(got.cpu(), expected, atol=1e-4, rtol=1e-4)
    assert HEAD_DIM == q.shape[-1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_norm_and_swiglu_match_torch_and_keep_rows_independent(dtype):
    import torch.nn.functional as F

    from speclm.kernels.triton_ops import rms_norm, silu_mul

    g = torch.Generator().manual_seed(0)
    x = (3 * torch.randn(33, 1536, generator=g)).to(dtype).to(DEVICE)
    w = torch.randn(1536, generator=g).to(dtype).to(DEVICE)
    normed = torch.rms_norm(x.float(), (1536,), eps=1e-6)
    expected = w * (normed if dtype == torch.float32 else normed.to(dtype))
    got = rms_norm(x, w, 1e-6)
    torch.testing.assert_close(got.float(), expected.float(), atol=TOL[dtype], rtol=TOL[dtype])
    assert torch.equal(rms_norm(x[5:6], w, 1e-6), got[5:6])
    gate_up = (2 * torch.randn(33, 2 * 8960, generator=g)).to(dtype).to(DEVICE)
    gate, up = gate_up.split(8960, dim=-1)
    got = silu_mul(gate_up)
    torch.testing.assert_close(got.float(), (F.silu(gate) * up).float(), atol=TOL[dtype], rtol=TOL[dtype])
    assert torch.equal(silu_mul(gate_up[7:8]), got[7:8])


@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
def test_fused_residual_add_and_norm_give_the_two_ops_bits(x_dtype):
    from speclm.kernels.triton_ops import add_rms_norm, rms_norm

    g = torch.Generator().manual_seed(0)
    x, delta = ((3 * torch.randn(33, 1536, generator=g)).to(x_dtype).to(DEVICE) for _ in range(2))
    for w_dtype in (torch.float32, torch.bfloat16):
        w = torch.randn(1536, generator=g).to(w_dtype).to(DEVICE)
        total, normed = add_rms_norm(x, delta, w, 1e-6)
        assert torch.equal(total, x + delta) and total.dtype == x_dtype
        assert torch.equal(normed, rms_norm(x + delta, w, 1e-6))
        assert torch.equal(add_rms_norm(x[5:6], delta[5:6], w, 1e-6)[1], normed[5:6])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_argmax_rows_is_torchs_argmax(dtype):
    from speclm.kernels.triton_ops import argmax_rows

    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 151936, generator=g).to(dtype).to(DEVICE)
    x[3, 7] = x[3, 150000] = 40  # a tie across chunks: the first index, as torch's
    got = argmax_rows(x)
    assert got.dtype == torch.long and torch.equal(got, x.argmax(-1)) and got[3] == 7
    assert torch.equal(argmax_rows(x[:1]), got[:1])  # (a row alone: the same)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_rope_write_matches_the_unfused_ops(dtype):
    from speclm.kernels.triton_ops import rope_write
    from speclm.models.rope import apply_rope

    g = torch.Generator().manual_seed(1)
    heads, kv, d, n, pool = 12, 2, 128, 9, 500
    qkv = torch.randn(n, (heads + 2 * kv) * d, generator=g).to(dtype).to(DEVICE)
    cos, sin = (torch.randn(n, d, generator=g).to(dtype).to(DEVICE) for _ in range(2))
    slots = torch.randperm(pool, generator=g)[:n].to(DEVICE)
    k_cache, v_cache = (torch.randn(kv, pool, d, generator=g).to(dtype).to(DEVICE) for _ in range(2))
    k_expected, v_expected = k_cache.clone(), v_cache.clone()
    view = qkv.view(n, heads + 2 * kv, d).transpose(0, 1)
    qk = apply_rope(view[: heads + kv], cos, sin)
    k_expected[:, slots], v_expected[:, slots] = qk[heads:], view[heads + kv :]
    q = rope_write(qkv, cos, sin, heads, kv, k_cache, v_cache, slots)
    for got, expected in ((q, qk[:heads]), (k_cache, k_expected), (v_cache, v_expected)):
        torch.testing.assert_close(got, expected, atol=TOL[dtype], rtol=TOL[dtype])


def split_case(dtype, heads, kv, head_dim, seed=0):
    """Rows of 1 key to 4 whole partitions over scattered slots, table rows padded with a scratch slot."""
    from speclm.kernels.triton_attention import PARTITION_KEYS as P

    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([1, P - 1, P, P + 1, 2 * P + 5, 3 * P + 7, 4 * P, 17])
    slots = 4 * P * len(lengths) + 1
    table = torch.full((len(lengths), 4 * P), slots - 1)
    for i, n in enumerate(lengths.tolist()):
        table[i, :n] = torch.randperm(slots - 1, generator=g)[:n]
    q = torch.randn(heads, len(lengths), head_dim, generator=g).to(dtype)
    keys, values = (torch.randn(kv, slots, head_dim, generator=g).to(dtype) for _ in range(2))
    return [t.to(DEVICE) for t in (q, keys, values, lengths, table, torch.arange(len(lengths)))] + [head_dim**-0.5]


@pytest.mark.parametrize("window", [None, 100, 300])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads,kv,head_dim", [(12, 2, 128), (14, 2, 64), (9, 3, 64), (4, 2, 8)])
def test_split_kernel_matches_reference_and_keeps_a_rows_bits(dtype, heads, kv, head_dim, window):
    """Split-K against the reference; a row within one partition equals the single pass bit for bit, and
    a row alone (its table as wide as itself: the single pass when short) equals itself in the batch."""
    from speclm.kernels.triton_attention import PARTITION_KEYS as P
    from speclm.kernels.triton_attention import paged_attention

    q, keys, values, lengths, table, table_rows, scale = split_case(dtype, heads, kv, head_dim)
    args = (q, keys, values, lengths, table, table_rows, scale, window)
    split, single = paged_attention(*args, partition=P), paged_attention(*args, partition=0)
    expected = attend_rows_reference(*args)
    for got in (split, single):
        err = (expected.float() - got.float()).abs().max().item()
        assert err <= TOL[dtype], err
    first = (lengths - (window or 2**30)).clamp(min=0) // P
    one_partition = first == (lengths - 1) // P
    assert torch.equal(split[:, one_partition], single[:, one_partition])
    for i, n in enumerate(lengths.tolist()):
        own = (lengths[i : i + 1], table[i : i + 1, :n], table_rows[:1] * 0)
        alone = paged_attention(q[:, i : i + 1], keys, values, *own, scale, window, partition=P)
        assert torch.equal(alone, split[:, i : i + 1]), n


def test_split_kernel_replays_in_a_cuda_graph():
    """The split launch captured once (its grid from the table's width) serves other lengths on replay."""
    from speclm.kernels.triton_attention import PARTITION_KEYS as P
    from speclm.kernels.triton_attention import paged_attention

    q, keys, values, lengths, table, table_rows, scale = split_case(torch.bfloat16, 12, 2, 128)
    static_lengths = lengths.clone()
    split = functools.partial(paged_attention, partition=P)
    split(q, keys, values, static_lengths, table, table_rows, scale)  # (compiles outside the capture)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = split(q, keys, values, static_lengths, table, table_rows, scale)
    for shuffled in (lengths, lengths.flip(0).clamp(max=table.shape[1] // 2)):
        static_lengths.copy_(shuffled.minimum(lengths))  # (a row's slots past its own are the scratch slot)
        graph.replay()
        assert torch.equal(out, split(q, keys, values, static_lengths.clone(), table, table_rows, scale))
