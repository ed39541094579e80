"""Paged attention for rows that attend like decoding, in Triton (GPU; imported only for CUDA tensors, or
by tests under TRITON_INTERPRET=1): one program per (query row, KV head) reads its keys and values where
the slot table says they lie (a sliding-window layer's row: its last `window` ones), with an online
softmax in fp32. The interface and the result are
speclm.models.gpu_attention.attend_rows_reference's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

NO_WINDOW = 2**30  # (a window no row reaches)


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
    row = tl.program_id(0)
    kv = tl.program_id(1)
    length = tl.load(lengths_ptr + row).to(tl.int32)
    table_row = tl.load(table_rows_ptr + row)
    g = tl.arange(0, GROUP_PAD)
    d = tl.arange(0, DIM_PAD)
    g_ok = g < GROUP
    d_ok = d < HEAD_DIM
    heads = kv * GROUP + g
    q = tl.load(
        q_ptr + heads[:, None] * stride_qh + row * stride_qn + d[None, :], mask=g_ok[:, None] & d_ok[None, :], other=0.0
    )  # [GROUP_PAD, DIM_PAD]
    q32 = q.to(tl.float32)
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    total = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, DIM_PAD], tl.float32)
    slots_of_row = table_ptr + table_row * stride_t
    for start in range(tl.maximum(length - window, 0), length, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        n_ok = offs < length
        slot = tl.load(slots_of_row + offs, mask=n_ok, other=0)
        kv_ok = n_ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + kv * stride_kh + slot[:, None] * stride_ks + d[None, :], mask=kv_ok, other=0.0)
        v = tl.load(v_ptr + kv * stride_vh + slot[:, None] * stride_vs + d[None, :], mask=kv_ok, other=0.0)
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
    out = acc / total[:, None]
    tl.store(
        out_ptr + heads[:, None] * stride_oh + row * stride_on + d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=g_ok[:, None] & d_ok[None, :],
    )


def paged_attention(
    q: torch.Tensor,  # [heads, n, head_dim]
    keys: torch.Tensor,  # [kv_heads, num_slots, head_dim]
    values: torch.Tensor,
    lengths: torch.Tensor,  # [n] int64
    table: torch.Tensor,  # [table rows, width] int64
    table_rows: torch.Tensor,  # [n] int64
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """Row i attends to the keys at slots table[table_rows[i], :lengths[i]] (with `window`, the last `window`
    of them only); returns [heads, n, head_dim] in q's dtype. No host synchronisation: the kernel reads
    each row's length itself."""
    heads, n, head_dim = q.shape
    kv = keys.shape[0]
    # [heads, n, head_dim] laid out as [n, heads, head_dim]: the caller's transpose to [n, heads * head_dim]
    # for o_proj is then a view, not a copy
    out = torch.empty((n, heads, head_dim), dtype=q.dtype, device=q.device).transpose(0, 1)
    if n == 0:
        return out
    assert heads % kv == 0 and q.stride(-1) == 1 and keys.stride(-1) == 1 and values.stride(-1) == 1
    group = heads // kv
    dim_pad = triton.next_power_of_2(head_dim)
    use_dot = head_dim >= 16 and dim_pad == head_dim
    group_pad = max(16 if use_dot else 2, triton.next_power_of_2(group))  # (tl.dot takes 16 rows at least)
    table = table.contiguous()
    _paged_attention_kernel[(n, kv)](
        q,
        keys,
        values,
        out,
        lengths.contiguous(),
        table,
        table_rows.contiguous(),
        scale,
        q.stride(0),
        q.stride(1),
        keys.stride(0),
        keys.stride(1),
        values.stride(0),
        values.stride(1),
        out.stride(0),
        out.stride(1),
        table.stride(0),
        NO_WINDOW if window is None else window,
        GROUP=group,
        GROUP_PAD=group_pad,
        HEAD_DIM=head_dim,
        DIM_PAD=dim_pad,
        BLOCK_N=64 if use_dot else 32,
        USE_DOT=use_dot,
        num_warps=4,
    )
    return out
