"""RMSNorm and the SwiGLU product for GPU tensors, in Triton (imported only for CUDA tensors, or by tests
under TRITON_INTERPRET=1). One launch each where torch takes several, and one program per row with a fixed
reduction order: a row's result never depends on how many rows share the call (torch's reductions pick
their split by shape), which batch-invariant decoding and CUDA-graph steps rely on."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(
    x_ptr,  # [rows, cols]
    w_ptr,  # [cols]
    out_ptr,  # [rows, cols] in the weight's dtype
    stride_x,
    stride_out,
    cols,
    eps,
    BLOCK: tl.constexpr,
    WEIGHT_FP32: tl.constexpr,
):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    ok = offs < cols
    x = tl.load(x_ptr + row * stride_x + offs, mask=ok, other=0.0).to(tl.float32)
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
    rows, cols = x.shape
    assert x.stride(-1) == 1 and weight.is_contiguous() and weight.shape == (cols,)
    out = torch.empty((rows, cols), dtype=weight.dtype, device=x.device)
    if rows:
        block = triton.next_power_of_2(cols)
        _rms_norm_kernel[(rows,)](
            x, weight, out, x.stride(0), out.stride(0), cols, eps,
            BLOCK=block, WEIGHT_FP32=weight.dtype == torch.float32, num_warps=min(16, max(1, block // 256)),
        )  # fmt: skip
    return out


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
