"""A decoder layer's small GPU ops in Triton: RMSNorm (alone, or after the residual add), the SwiGLU
product, the rotary embedding fused with the KV-cache write, and each row's argmax over the vocabulary (the
greedy choice a CUDA-graph step ends with) (imported only for CUDA tensors, or by
tests under TRITON_INTERPRET=1). One launch each where torch takes several (a decode step is
launch-bound), and one program per row with a fixed reduction order: a row's result never depends on how
many rows share the call (torch's reductions pick their split by shape), which batch-invariant decoding and
CUDA-graph steps rely on."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(
    x_ptr,  # [rows, cols]
    d_ptr,  # [rows, cols]: added to x first when ADD (the residual's new branch), else unused
    sum_ptr,  # [rows, cols]: x + d, rounded to its dtype, when ADD
    w_ptr,  # [cols]
    out_ptr,  # [rows, cols] in the weight's dtype
    stride_x,
    stride_d,
    stride_sum,
    stride_out,
    cols,
    eps,
    BLOCK: tl.constexpr,
    WEIGHT_FP32: tl.constexpr,
    ADD: tl.constexpr,
):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    ok = offs < cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=ok, other=0.0)
    if ADD:  # as torch adds: in fp32, rounded to the sum's dtype; the norm then reads the rounded sum
        d = tl.load(d_ptr + row * stride_d + offs, mask=ok, other=0.0)
        x = (x.to(tl.float32) + d.to(tl.float32)).to(sum_ptr.dtype.element_ty)
        tl.store(sum_ptr + row * stride_sum + offs, x, mask=ok)
    x = x.to(tl.float32)
    scale = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / cols + eps)
    w = tl.load(w_ptr + offs, mask=ok, other=0.0)
    if WEIGHT_FP32:
        out = w * (x * scale)
    else:  # as speclm's rms_norm: the normed row rounded to the weight's dtype, then the product rounded
        out = w.to(tl.float32) * (x * scale).to(w.dtype).to(tl.float32)
    tl.store(out_ptr + row * stride_out + offs, out.to(out_ptr.dtype.element_ty), mask=ok)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """speclm.models.layers.rms_norm for x [rows, cols] (any float dtype, unit stride in cols): fp32
    arithmetic, the result in the weight's dtype."""
    return _norm(x, None, weight, eps)[1]


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, rms_norm(x + delta)) in one launch, each bit for bit what the two ops give (the residual
    stream's add and the next norm). x, delta [rows, cols], unit stride in cols; the sum in their promoted dtype."""
    assert delta.shape == x.shape and delta.stride(-1) == 1
    return _norm(x, delta, weight, eps)


def _norm(
    x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor | None, torch.Tensor]:
    rows, cols = x.shape
    assert x.stride(-1) == 1 and weight.is_contiguous() and weight.shape == (cols,)
    out = torch.empty((rows, cols), dtype=weight.dtype, device=x.device)
    total = None
    if delta is not None:
        total = torch.empty((rows, cols), dtype=torch.result_type(x, delta), device=x.device)
    if rows:
        block = triton.next_power_of_2(cols)
        d, t = (x, x) if delta is None else (delta, total)  # (unused pointers without the add)
        _rms_norm_kernel[(rows,)](
            x, d, t, weight, out, x.stride(0), d.stride(0), t.stride(0), out.stride(0), cols, eps,
            BLOCK=block, WEIGHT_FP32=weight.dtype == torch.float32, ADD=delta is not None,
            num_warps=min(16, max(1, block // 256)),
        )  # fmt: skip
    return total, out


@triton.jit
def _silu_mul_kernel(gate_up_ptr, out_ptr, stride_in, stride_out, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < cols
    gate = tl.load(gate_up_ptr + row * stride_in + offs, mask=ok, other=0.0)
    up = tl.load(gate_up_ptr + row * stride_in + cols + offs, mask=ok, other=0.0)
    g32 = gate.to(tl.float32)
    silu = (g32 / (1.0 + tl.exp(-g32))).to(gate.dtype)  # F.silu: fp32 inside, rounded to the input's dtype
    out = (silu.to(tl.float32) * up.to(tl.float32)).to(gate.dtype)  # then the product, rounded
    tl.store(out_ptr + row * stride_out + offs, out, mask=ok)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up [rows, 2 * cols] = [gate | up] (unit stride), in its dtype: [rows, cols]."""
    rows, cols = gate_up.shape[0], gate_up.shape[1] // 2
    assert gate_up.stride(-1) == 1 and gate_up.shape[1] == 2 * cols
    out = torch.empty((rows, cols), dtype=gate_up.dtype, device=gate_up.device)
    if rows:
        block = 1024
        _silu_mul_kernel[(rows, triton.cdiv(cols, block))](
            gate_up, out, gate_up.stride(0), out.stride(0), cols, BLOCK=block, num_warps=4
        )
    return out


@triton.jit
def _rope_write_kernel(
    qkv_ptr,  # [rows, (heads + 2 kv) * head_dim]
    cos_ptr,  # [rows, head_dim]
    sin_ptr,  # [rows, head_dim] (signed: see speclm.models.rope.apply_rope)
    q_ptr,  # [heads, rows, head_dim]
    k_ptr,  # [kv, slots, head_dim]
    v_ptr,
    slots_ptr,  # [rows]
    stride_qkv,
    stride_cos,
    stride_sin,
    stride_qh,
    stride_qn,
    stride_kh,
    stride_ks,
    stride_vh,
    stride_vs,
    HEADS: tl.constexpr,
    KV: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    row = tl.program_id(0)
    head = tl.program_id(1)  # 0..HEADS-1: q, then KV keys, then KV values
    d = tl.arange(0, HEAD_DIM)
    base = qkv_ptr + row * stride_qkv + head * HEAD_DIM
    x = tl.load(base + d)
    if head < HEADS + KV:  # rotated as apply_rope computes it: each product rounded, then the sum
        rolled = tl.load(base + (d + HEAD_DIM // 2) % HEAD_DIM)
        c = tl.load(cos_ptr + row * stride_cos + d)
        s = tl.load(sin_ptr + row * stride_sin + d)
        a = (x.to(tl.float32) * c.to(tl.float32)).to(x.dtype)
        b = (rolled.to(tl.float32) * s.to(tl.float32)).to(x.dtype)
        x = (a.to(tl.float32) + b.to(tl.float32)).to(x.dtype)
    if head < HEADS:
        tl.store(q_ptr + head * stride_qh + row * stride_qn + d, x)
    else:
        slot = tl.load(slots_ptr + row)
        if head < HEADS + KV:
            tl.store(k_ptr + (head - HEADS) * stride_kh + slot * stride_ks + d, x)
        else:
            tl.store(v_ptr + (head - HEADS - KV) * stride_vh + slot * stride_vs + d, x)


def rope_write(
    qkv: torch.Tensor,  # [rows, (heads + 2 kv) * head_dim], in the cache's dtype
    cos: torch.Tensor,  # [rows, head_dim]
    sin: torch.Tensor,
    heads: int,
    kv: int,
    k_cache: torch.Tensor,  # [kv, slots, head_dim]
    v_cache: torch.Tensor,
    slots: torch.Tensor,  # [rows] int64
) -> torch.Tensor:
    """Rotate q and k (apply_rope), write k and v to their cache slots, return q [heads, rows, head_dim]: the
    unfused path's five launches in one. head_dim must be a power of two (the caller checks)."""
    rows, head_dim = qkv.shape[0], k_cache.shape[-1]
    assert qkv.stride(-1) == 1 and cos.stride(-1) == 1 and sin.stride(-1) == 1
    assert k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1 and qkv.dtype == k_cache.dtype == cos.dtype
    q = torch.empty((heads, rows, head_dim), dtype=qkv.dtype, device=qkv.device)
    if rows:
        _rope_write_kernel[(rows, heads + 2 * kv)](
            qkv, cos, sin, q, k_cache, v_cache, slots.contiguous(),
            qkv.stride(0), cos.stride(0), sin.stride(0), q.stride(0), q.stride(1),
            k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
            HEADS=heads, KV=kv, HEAD_DIM=head_dim, num_warps=1,
        )  # fmt: skip
    return q


ARGMAX_CHUNK = 4096  # vocabulary entries per first-stage program


@triton.jit
def _chunk_argmax_kernel(x_ptr, max_ptr, idx_ptr, stride_x, cols, chunks, CHUNK: tl.constexpr):
    """First stage: each (row, chunk) program's maximum and the first index holding it."""
    row, chunk = tl.program_id(0), tl.program_id(1)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(x_ptr + row * stride_x + offs, mask=offs < cols, other=float("-inf")).to(tl.float32)
    best, at = tl.max(x, axis=0, return_indices=True, return_indices_tie_break_left=True)
    tl.store(max_ptr + row * chunks + chunk, best)
    tl.store(idx_ptr + row * chunks + chunk, chunk * CHUNK + at)


@triton.jit
def _rows_argmax_kernel(max_ptr, idx_ptr, out_ptr, chunks, CHUNKS_PAD: tl.constexpr):
    """Second stage: a row's chunks in order, the first chunk with the row's maximum wins."""
    row = tl.program_id(0)
    c = tl.arange(0, CHUNKS_PAD)
    best = tl.load(max_ptr + row * chunks + c, mask=c < chunks, other=float("-inf"))
    _, at = tl.max(best, axis=0, return_indices=True, return_indices_tie_break_left=True)
    tl.store(out_ptr + row, tl.load(idx_ptr + row * chunks + at).to(tl.int64))


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """torch.argmax(x, -1) for x [rows, cols] (unit stride in cols, finite values): the first index of each
    row's maximum, in two launches that spread a row over the GPU (torch's reduction gives a row one block)."""
    rows, cols = x.shape
    assert x.stride(-1) == 1
    chunks = triton.cdiv(cols, ARGMAX_CHUNK)
    best = torch.empty(rows, chunks, dtype=torch.float32, device=x.device)
    idx = torch.empty(rows, chunks, dtype=torch.int32, device=x.device)
    out = torch.empty(rows, dtype=torch.long, device=x.device)
    _chunk_argmax_kernel[(rows, chunks)](x, best, idx, x.stride(0), cols, chunks, CHUNK=ARGMAX_CHUNK, num_warps=4)
    _rows_argmax_kernel[(rows,)](best, idx, out, chunks, CHUNKS_PAD=triton.next_power_of_2(chunks), num_warps=1)
    return out
