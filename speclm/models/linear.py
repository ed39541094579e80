"""The dense linear layer (fp32 or bf16 weights) whose rows are independent of each other, and any
linear layer's inference forward as a plain closure."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from speclm.kernels import cpu_kernels
from speclm.models.op_module import OpModule
from speclm.models.quantizers import COMPUTE_DTYPE


def dense_kernel(weight: torch.Tensor, bias: torch.Tensor | None) -> Callable[[torch.Tensor], torch.Tensor]:
    """x @ weight.T + bias for an fp32 or bf16 weight [out, in], x in the weight's dtype; the result
    in that dtype. On the CPU speclm's dense_matmul computes it (a row's result does not depend on the
    other rows, which torch's GEMM does not promise: see dense_matmul.cpp); elsewhere F.linear."""
    kernels = cpu_kernels() if weight.device.type == "cpu" and weight.dtype in (torch.float32, COMPUTE_DTYPE) else None
    if kernels is None:
        return functools.partial(F.linear, weight=weight, bias=bias)
    op, no_bias = kernels.dense_matmul, weight.new_empty(0, dtype=torch.float32)
    bias = no_bias if bias is None else bias.detach().float().contiguous()
    if weight.dtype == torch.float32:
        return lambda x: op(x, weight, bias)
    return lambda x: op(x, weight, bias).to(weight.dtype)


class Linear(nn.Linear):
    """nn.Linear whose inference forward is dense_kernel (rows independent of each other); with
    gradients wanted it is F.linear, so training and calibration are unchanged."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and (self.weight.requires_grad or x.requires_grad):
            return F.linear(x, self.weight, self.bias)
        return dense_kernel(self.weight, self.bias)(x)


def linear_op(module: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """`module`'s inference forward as a closure over its tensors where its type is known (nn.Linear,
    and the quantized, GGUF-native and w8a8 layers: OpModule), else the module itself: no nn.Module
    dispatch, and rows independent of each other (dense_kernel)."""
    if type(module) in (nn.Linear, Linear):
        return dense_kernel(module.weight, module.bias)
    if isinstance(module, OpModule):  # the quantized formats, GGUF-native and w8a8 layers
        return module.op()
    return module


# Rows of every GEMM call on a GPU when linears are batch-invariant (row_chunked): decode (1 row),
# verification (K + 1 rows) and decode at concurrency up to this many rows share one cuBLAS shape.
BATCH_INVARIANT_ROWS = 32


def row_chunked(linear: Callable[[torch.Tensor], torch.Tensor], rows: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """`linear` made batch-invariant: it is only ever called on exactly `rows` rows (the input padded with
    zero rows up to a multiple of `rows`, one call per chunk), so a row's result never depends on how many
    rows share the pass. cuBLAS picks its GEMM kernel (tiles, split-K) by shape, and in bf16 a 1-row decode
    and a K+1-row verification would otherwise round differently (a near-tie can flip a greedy token).
    One fixed shape per layer keeps one kernel; the cost is the padding and one weight read per chunk."""

    def op(x: torch.Tensor) -> torch.Tensor:
        lead, n = x.shape[:-1], x.numel() // x.shape[-1]
        flat = x.reshape(n, x.shape[-1])
        if n == 0:
            return linear(x)
        if n % rows:
            flat = F.pad(flat, (0, 0, 0, rows - n % rows))  # [multiple of rows, in]
        chunks = [linear(flat[i : i + rows]) for i in range(0, flat.shape[0], rows)]
        out = chunks[0] if len(chunks) == 1 else torch.cat(chunks)
        return out[:n].reshape(*lead, out.shape[-1])

    return op
