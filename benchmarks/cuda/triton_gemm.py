"""An experiment (bench_gemm.py times it against cuBLAS; not part of speclm): the GEMM of decoding on a GPU in
Triton, y = x @ w.T (+ bias) for a few rows x [rows, K] (decode, verification, a small batch) and a bf16 or
fp16 weight w [N, K], as nn.Linear stores it. On an H100 it was no faster than cuBLAS inside CUDA graphs and
its Python launches slowed eager steps (gemm_triton_h100.md), so speclm's linears stay on cuBLAS.

A decode step reads every weight once for a handful of rows, so its GEMMs are bound by memory bandwidth:
each program streams a [BLOCK_N, K / split] slice of the weight once for up to BLOCK_M rows, several tiles in
flight. A narrow output (few column blocks) is split along K so that enough programs stream at once; the
split's partial sums (fp32) are added in split order by a second launch. The plan (blocks, split) depends on
the weight's shape only, and each row's products are added in the same order whatever rows share the call:
a row's result never depends on the batch (the invariance that exact speculative greedy decoding in bf16
and CUDA-graph steps rely on), without padding every call to a fixed row count."""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

BLOCK_M = 32  # rows per program (more rows: a program per row block, each reading the weight)
PROGRAMS = 256  # enough programs streaming at once to keep a GPU's memory busy (a split aims for this many)
MIN_SPLIT_K = 512  # a split's least K (shorter ones spend more on partial sums than they gain)


class Plan(NamedTuple):
    block_n: int
    block_k: int
    split: int  # K is cut into `split` ranges of k_split (a multiple of block_k); the last may be shorter
    k_split: int
    warps: int
    stages: int


def plan(n: int, k: int) -> Plan:
    """The kernel's blocks and split for a weight [n, k] (its shape alone decides them)."""
    block_k = min(128, max(16, triton.next_power_of_2(k)))
    block_n = 64 if triton.cdiv(n, 64) >= PROGRAMS // 2 else 32
    blocks = triton.cdiv(n, block_n)
    most = 1 if blocks >= PROGRAMS // 2 else max(1, min(triton.cdiv(PROGRAMS, blocks), k // MIN_SPLIT_K))
    if k % block_k == 0:  # the most splits, up to `most`, that cut K into equal whole blocks (no masked loads)
        units = k // block_k
        split = max(s for s in range(1, most + 1) if units % s == 0)
    else:
        split = most
    k_split = triton.cdiv(triton.cdiv(k, split), block_k) * block_k
    return Plan(block_n, block_k, triton.cdiv(k, k_split), k_split, 4, 4)


@triton.jit
def _gemm_kernel(
    x_ptr,  # [M, K]
    w_ptr,  # [N, K]
    b_ptr,  # [N] (HAS_BIAS)
    y_ptr,  # [M, N] (SPLIT == 1)
    part_ptr,  # [SPLIT, M, N] fp32 (SPLIT > 1)
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr,
    K_SPLIT: tl.constexpr,
    EVEN: tl.constexpr,  # N % BLOCK_N == 0 and K % K_SPLIT == 0: the weight's loads need no mask
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_n, pid_s, pid_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    k0 = pid_s * K_SPLIT
    x_ptrs = x_ptr + rm[:, None] * stride_xm + (k0 + rk)[None, :]
    w_ptrs = w_ptr + rn[:, None] * stride_wn + (k0 + rk)[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K_SPLIT, BLOCK_K):  # (this split's range, in order)
        kk = k0 + k + rk
        x = tl.load(x_ptrs, mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        if EVEN:
            w = tl.load(w_ptrs)
        else:
            w = tl.load(w_ptrs, mask=(rn[:, None] < N) & (kk[None, :] < K), other=0.0)
        acc = tl.dot(x, tl.trans(w), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    ok = (rm[:, None] < M) & (rn[None, :] < N)
    if SPLIT == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty), mask=ok)
    else:
        tl.store(part_ptr + (pid_s * M + rm[:, None]) * N + rn[None, :], acc, mask=ok)


@triton.jit
def _split_sum_kernel(
    part_ptr, b_ptr, y_ptr, M, N, stride_ym, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, BLOCK: tl.constexpr
):
    m = tl.program_id(0)
    rn = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = rn < N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT):  # in split order: a fixed sum
        acc += tl.load(part_ptr + (s * M + m) * N + rn, mask=ok, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + m * stride_ym + rn, acc.to(y_ptr.dtype.element_ty), mask=ok)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, how: Plan | None = None) -> torch.Tensor:
    """x [rows, K] @ weight.T (+ bias) in the weight's dtype, rows in any number (it pays for a few: the
    weight is read once per BLOCK_M rows); `how` overrides the plan (the benchmark's sweep)."""
    rows, k = x.shape
    n = weight.shape[0]
    assert weight.shape[1] == k and weight.stride(1) == 1 and x.dtype == weight.dtype
    x = x if x.stride(1) == 1 else x.contiguous()
    y = torch.empty((rows, n), dtype=weight.dtype, device=x.device)
    if rows == 0:
        return y
    p = how or plan(n, k)
    has_bias = bias is not None
    b = bias if has_bias else weight  # (never read)
    part = torch.empty((p.split, rows, n), dtype=torch.float32, device=x.device) if p.split > 1 else y
    even = n % p.block_n == 0 and k % p.k_split == 0 and p.k_split % p.block_k == 0
    _gemm_kernel[(triton.cdiv(n, p.block_n), p.split, triton.cdiv(rows, BLOCK_M))](
        x, weight, b, y, part, rows, n, k, x.stride(0), weight.stride(0), y.stride(0),
        HAS_BIAS=has_bias and p.split == 1, SPLIT=p.split, K_SPLIT=p.k_split, EVEN=even,
        BLOCK_M=BLOCK_M, BLOCK_N=p.block_n, BLOCK_K=p.block_k, num_warps=p.warps, num_stages=p.stages,
    )  # fmt: skip
    if p.split > 1:
        block = 1024
        _split_sum_kernel[(rows, triton.cdiv(n, block))](
            part, b, y, rows, n, y.stride(0), HAS_BIAS=has_bias, SPLIT=p.split, BLOCK=block, num_warps=4
        )
    return y
