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
