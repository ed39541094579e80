"""Paged attention for rows that attend like decoding, in Triton (GPU; imported only for CUDA tensors, or
by tests under TRITON_INTERPRET=1). Row i reads its keys and values where the slot table says they lie (a
sliding-window layer's row: its last `window` ones), with an online softmax in fp32; all query heads of a
KV head are one program's rows. The interface and the result are
speclm.models.gpu_attention.attend_rows_reference's.

Two ways through the keys; split-K by default (SPLIT_K_BY_DEFAULT) where the table's width (the longest row
it can hold, known on the host) spans more than one partition, else the single pass:
- single pass: one program per (row, KV head) walks the row's keys serially (short contexts);
- split-K (flash-decoding): a row's keys fall into partitions of PARTITION_KEYS keys, counted from key 0;
  each partition's max, sum and weighted values are written in fp32, and a second kernel merges a row's
  partitions in ascending order. A partition's arithmetic depends only on its row, so how many programs
  share the partitions (chosen from the batch, for occupancy) never changes a bit, and a row within one
  partition gets the single pass's bits (the merge of one partition multiplies by exp(0) = 1).
Neither reads a row's length on the host: the grids come from host-side sizes, so CUDA graphs capture them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

NO_WINDOW = 2**30  # (a window no row reaches)
PARTITION_KEYS = 256  # keys per split-K partition
# Split-K pays from a few hundred keys on and costs a merge launch below (benchmarks/cuda/splitk_bench_h100.md).
SPLIT_K_BY_DEFAULT = True
# Split-K programs a launch aims at (a row's partitions are shared among its programs). A CUDA-graph step
# counts its padded rows too, so at batch 1 the real row gets SPLIT_PROGRAMS / (bucket rows * KV heads).
SPLIT_PROGRAMS = 2048
SPLIT_BUFFER_BYTES = 128 << 20  # partial results one launch may hold (more rows: several launches)
# Both kernels' launch plan where tl.dot applies (head_dim a power of two from 16): keys per block (the
# online softmax's order, so a row's bits), warps and software-pipeline stages (neither changes a bit). Key rows
# of up to 256 bytes (bf16 at head_dim 128) take the wider blocks (benchmarks/cuda/attention_plans_h100.md);
# wider rows keep blocks whose stages fit in shared memory. PLAN, when set, overrides both (a benchmark's sweep).
NARROW_ROWS_PLAN = dict(BLOCK_N=128, num_warps=4, num_stages=2)
WIDE_ROWS_PLAN = dict(BLOCK_N=64, num_warps=4, num_stages=3)
PLAN: dict | None = None


@triton.jit
def _load_query(q_ptr, row, kv, stride_qh, stride_qn, GROUP, GROUP_PAD: tl.constexpr, HEAD_DIM, DIM_PAD: tl.constexpr):
    """A row's query heads of KV head `kv`: [GROUP_PAD, DIM_PAD], padding zero."""
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, DIM_PAD)
    heads = kv * GROUP + g
    ok = (g < GROUP)[:, None] & (d < HEAD_DIM)[None, :]
    return tl.load(q_ptr + heads[:, None] * stride_qh + row * stride_qn + d[None, :], mask=ok, other=0.0)


@triton.jit
def _attend_span(
    q,  # [GROUP_PAD, DIM_PAD]
    k_ptr,  # this KV head's keys
    v_ptr,
    slots_of_row,  # the row's slot table row
    stride_ks,
    stride_vs,
    lo,  # keys lo..hi-1 of the row
    hi,
    scale,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM,
    DIM_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    USE_DOT: tl.constexpr,
):
    """Online softmax over keys lo..hi-1, BLOCK_N at a time from lo: (max [GROUP_PAD], sum [GROUP_PAD],
    weighted values [GROUP_PAD, DIM_PAD]), fp32. Both kernels run this, so their blocks match."""
    d = tl.arange(0, DIM_PAD)
    d_ok = d < HEAD_DIM
    q32 = q.to(tl.float32)
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    total = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, DIM_PAD], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        n_ok = offs < hi
        slot = tl.load(slots_of_row + offs, mask=n_ok, other=0)
        kv_ok = n_ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + slot[:, None] * stride_ks + d[None, :], mask=kv_ok, other=0.0)
        v = tl.load(v_ptr + slot[:, None] * stride_vs + d[None, :], mask=kv_ok, other=0.0)
        if USE_DOT:
            if k.dtype == tl.float32:
                s = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                s = tl.dot(q, tl.trans(k))
        else:
            s = tl.sum(q32[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)  # [GROUP_PAD, BLOCK_N]
        s = tl.where(n_ok[None, :], s * scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        total = total * alpha + tl.sum(p, axis=1)
        if USE_DOT:
            if v.dtype == tl.float32:
                acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        else:
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
        m = m_new
    return m, total, acc


@triton.jit
def _store_rows(
    out_ptr, row, kv, stride_oh, stride_on, acc, total, GROUP, GROUP_PAD: tl.constexpr, HEAD_DIM, DIM_PAD: tl.constexpr
):
    """out[heads of kv, row] = acc / total, in out's dtype."""
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, DIM_PAD)
    heads = kv * GROUP + g
    tl.store(
        out_ptr + heads[:, None] * stride_oh + row * stride_on + d[None, :],
        (acc / total[:, None]).to(out_ptr.dtype.element_ty),
        mask=(g < GROUP)[:, None] & (d < HEAD_DIM)[None, :],
    )


@triton.jit
def _paged_attention_kernel(
    q_ptr,  # [heads, n, head_dim]
    k_ptr,  # [kv_heads, num_slots, head_dim]
    v_ptr,
    out_ptr,  # [heads, n, head_dim]
    lengths_ptr,  # [n]
    table_ptr,  # [table rows, width]
    table_rows_ptr,  # [n]
    scale,
    stride_qh,
    stride_qn,
    stride_kh,
    stride_ks,
    stride_vh,
    stride_vs,
    stride_oh,
    stride_on,
    stride_t,
    window,  # keys a row reads at most (its last ones): a sliding-window layer's; a huge number otherwise
    GROUP: tl.constexpr,  # query heads per KV head
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    USE_DOT: tl.constexpr,
):
    """The single pass: one program per (row, KV head) over all the row's keys."""
    row = tl.program_id(0)
    kv = tl.program_id(1)
    length = tl.load(lengths_ptr + row).to(tl.int32)
    slots_of_row = table_ptr + tl.load(table_rows_ptr + row) * stride_t
    q = _load_query(q_ptr, row, kv, stride_qh, stride_qn, GROUP, GROUP_PAD, HEAD_DIM, DIM_PAD)
    m, total, acc = _attend_span(
        q, k_ptr + kv * stride_kh, v_ptr + kv * stride_vh, slots_of_row, stride_ks, stride_vs,
        tl.maximum(length - window, 0), length, scale, GROUP_PAD, HEAD_DIM, DIM_PAD, BLOCK_N, USE_DOT,
    )  # fmt: skip
    _store_rows(out_ptr, row, kv, stride_oh, stride_on, acc, total, GROUP, GROUP_PAD, HEAD_DIM, DIM_PAD)


@triton.jit
def _split_partitions_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    part_m_ptr,  # [heads, n, parts] fp32: each partition's max score
    part_l_ptr,  # [heads, n, parts] fp32: its sum of exp(score - max)
    part_acc_ptr,  # [heads, n, parts, HEAD_DIM] fp32: its values weighted by exp(score - max)
    lengths_ptr,
    table_ptr,
    table_rows_ptr,
    scale,
    rows,  # n
    parts,  # partitions a row may have (the table's width / PARTITION)
    programs,  # programs per (row, KV head): program j takes the row's partitions j, j + programs, ...
    stride_qh,
    stride_qn,
    stride_kh,
    stride_ks,
    stride_vh,
    stride_vs,
    stride_t,
    window,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    USE_DOT: tl.constexpr,
    PARTITION: tl.constexpr,
):
    """Split-K, first kernel: the partial results of a row's partitions (partition p: keys p * PARTITION
    up to the next partition, within the row's window)."""
    row = tl.program_id(0)
    kv = tl.program_id(1)
    j = tl.program_id(2)
    length = tl.load(lengths_ptr + row).to(tl.int32)
    lo = tl.maximum(length - window, 0)
    slots_of_row = table_ptr + tl.load(table_rows_ptr + row) * stride_t
    q = _load_query(q_ptr, row, kv, stride_qh, stride_qn, GROUP, GROUP_PAD, HEAD_DIM, DIM_PAD)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, DIM_PAD)
    g_ok = g < GROUP
    at = ((kv * GROUP + g) * rows + row) * parts  # [GROUP_PAD]: partition 0 of each head's row
    for part in range(lo // PARTITION + j, tl.cdiv(length, PARTITION), programs):
        m, total, acc = _attend_span(
            q, k_ptr + kv * stride_kh, v_ptr + kv * stride_vh, slots_of_row, stride_ks, stride_vs,
            tl.maximum(lo, part * PARTITION), tl.minimum(length, (part + 1) * PARTITION), scale,
            GROUP_PAD, HEAD_DIM, DIM_PAD, BLOCK_N, USE_DOT,
        )  # fmt: skip
        tl.store(part_m_ptr + at + part, m, mask=g_ok)
        tl.store(part_l_ptr + at + part, total, mask=g_ok)
        acc_at = (at + part)[:, None] * HEAD_DIM + d[None, :]
        tl.store(part_acc_ptr + acc_at, acc, mask=g_ok[:, None] & (d < HEAD_DIM)[None, :])


@triton.jit
def _merge_partitions_kernel(
    part_m_ptr,
    part_l_ptr,
    part_acc_ptr,
    out_ptr,
    lengths_ptr,
    rows,
    parts,
    stride_oh,
    stride_on,
    window,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    PARTITION: tl.constexpr,
):
    """Split-K, second kernel: one program per (row, KV head) merges the row's partitions in ascending
    order, as the single pass merges its blocks."""
    row = tl.program_id(0)
    kv = tl.program_id(1)
    length = tl.load(lengths_ptr + row).to(tl.int32)
    lo = tl.maximum(length - window, 0)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, DIM_PAD)
    g_ok = g < GROUP
    ok = g_ok[:, None] & (d < HEAD_DIM)[None, :]
    at = ((kv * GROUP + g) * rows + row) * parts
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    total = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, DIM_PAD], tl.float32)
    for part in range(lo // PARTITION, tl.cdiv(length, PARTITION)):
        m_part = tl.load(part_m_ptr + at + part, mask=g_ok, other=0.0)
        m_new = tl.maximum(m, m_part)
        alpha = tl.exp(m - m_new)
        beta = tl.where(m_part == m_new, 1.0, tl.exp(m_part - m_new))  # (exactly 1: one partition's own bits)
        total = total * alpha + tl.load(part_l_ptr + at + part, mask=g_ok, other=0.0) * beta
        acc_part = tl.load(part_acc_ptr + (at + part)[:, None] * HEAD_DIM + d[None, :], mask=ok, other=0.0)
        acc = acc * alpha[:, None] + acc_part * beta[:, None]
        m = m_new
    _store_rows(out_ptr, row, kv, stride_oh, stride_on, acc, total, GROUP, GROUP_PAD, HEAD_DIM, DIM_PAD)


def paged_attention(
    q: torch.Tensor,  # [heads, n, head_dim]
    keys: torch.Tensor,  # [kv_heads, num_slots, head_dim]
    values: torch.Tensor,
    lengths: torch.Tensor,  # [n] int64
    table: torch.Tensor,  # [table rows, width] int64
    table_rows: torch.Tensor,  # [n] int64
    scale: float,
    window: int | None = None,
    partition: int | None = None,
) -> torch.Tensor:
    """Row i attends to the keys at slots table[table_rows[i], :lengths[i]] (with `window`, the last `window`
    of them only); returns [heads, n, head_dim] in q's dtype. Split-K when a row of the table's width would
    span more than one partition of `partition` keys (default: PARTITION_KEYS if SPLIT_K_BY_DEFAULT, else 0;
    0: the single pass). No host synchronisation: the kernels read each row's length themselves."""
    heads, n, head_dim = q.shape
    kv = keys.shape[0]
    # [heads, n, head_dim] laid out as [n, heads, head_dim]: the caller's transpose to [n, heads * head_dim]
    # for o_proj is then a view, not a copy
    out = torch.empty((n, heads, head_dim), dtype=q.dtype, device=q.device).transpose(0, 1)
    if n == 0:
        return out
    assert heads % kv == 0 and q.stride(-1) == 1 and keys.stride(-1) == 1 and values.stride(-1) == 1
    if partition is None:
        partition = PARTITION_KEYS if SPLIT_K_BY_DEFAULT else 0
    group = heads // kv
    dim_pad = triton.next_power_of_2(head_dim)
    use_dot = head_dim >= 16 and dim_pad == head_dim
    shape = dict(
        GROUP=group,
        GROUP_PAD=max(16 if use_dot else 2, triton.next_power_of_2(group)),  # (tl.dot takes 16 rows at least)
        HEAD_DIM=head_dim,
        DIM_PAD=dim_pad,
    )
    plan = PLAN or (NARROW_ROWS_PLAN if head_dim * keys.element_size() <= 256 else WIDE_ROWS_PLAN)
    blocks = dict(plan, USE_DOT=True) if use_dot else dict(BLOCK_N=32, USE_DOT=False, num_warps=4)
    # (the table's rows may be a prefix of wider rows: a short CUDA-graph step's; the kernels take its row stride)
    table = table if table.stride(-1) == 1 else table.contiguous()
    lengths, table_rows = lengths.contiguous(), table_rows.contiguous()
    window = NO_WINDOW if window is None else window
    kv_strides = (keys.stride(0), keys.stride(1), values.stride(0), values.stride(1))
    if partition <= 0 or table.shape[1] <= partition:
        _paged_attention_kernel[(n, kv)](
            q, keys, values, out, lengths, table, table_rows, scale, q.stride(0), q.stride(1), *kv_strides,
            out.stride(0), out.stride(1), table.stride(0), window, **shape, **blocks,
        )  # fmt: skip
        return out
    parts = triton.cdiv(table.shape[1], partition)
    per_row = heads * parts * (head_dim + 2) * 4
    chunk = max(1, min(n, SPLIT_BUFFER_BYTES // per_row))
    part_m = torch.empty(heads * chunk * parts, dtype=torch.float32, device=q.device)
    part_l = torch.empty_like(part_m)
    part_acc = torch.empty(heads * chunk * parts * head_dim, dtype=torch.float32, device=q.device)
    for first in range(0, n, chunk):  # (rows in launches of `chunk`: a row's partitions stay in one)
        rows = min(chunk, n - first)
        q_rows, out_rows, lengths_rows = q[:, first : first + rows], out[:, first : first + rows], lengths[first:]
        programs = min(parts, triton.cdiv(SPLIT_PROGRAMS, rows * kv))
        _split_partitions_kernel[(rows, kv, programs)](
            q_rows, keys, values, part_m, part_l, part_acc, lengths_rows, table, table_rows[first:], scale,
            rows, parts, programs, q.stride(0), q.stride(1), *kv_strides, table.stride(0), window,
            **shape, **blocks, PARTITION=partition,
        )  # fmt: skip
        _merge_partitions_kernel[(rows, kv)](
            part_m, part_l, part_acc, out_rows, lengths_rows, rows, parts, out.stride(0), out.stride(1), window,
            **shape, PARTITION=partition, num_warps=4,
        )  # fmt: skip
    return out
