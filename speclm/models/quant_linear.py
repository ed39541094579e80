"""Linear layers in the quantized runtime weight formats: bf16, int8 per output channel, int4 group-wise
(speclm/models/weight_formats.py picks the layer per format)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType

import torch
import torch.nn.functional as F

from speclm.kernels import cpu_kernels
from speclm.models.linear import dense_kernel
from speclm.models.op_module import OpModule
from speclm.models.quantizers import COMPUTE_DTYPE, quantize_int4, quantize_int8


# -- runtime modules -------------------------------------------------------------------------------
def _quantized_forward(
    matmul: Callable[[torch.Tensor], torch.Tensor], bias: torch.Tensor | None, x: torch.Tensor
) -> torch.Tensor:
    y = matmul(x if x.dtype == COMPUTE_DTYPE else x.to(COMPUTE_DTYPE))
    if bias is not None:
        y = y + bias  # the fp32 bias added to the exact bf16 product
    return y if y.dtype == x.dtype else y.to(x.dtype)


class QuantizedLinear(OpModule):
    """Base of the non-fp32 linear layers: bf16 matmul, fp32 in and out, optional fp32 bias."""

    def __init__(self, in_features: int, out_features: int, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())

    def matmul_kernel(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """The matmul x [n, in] bf16 -> [n, out] bf16, as a closure over this layer's tensors."""
        raise NotImplementedError

    def dequantized_weight(self) -> torch.Tensor:
        """The fp32 [out, in] weight this layer computes with: the reference for its correctness."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x in its dtype -> y in the same dtype. The model feeds bf16 activations, so no cast runs."""
        return _quantized_forward(self.matmul_kernel(), self.bias, x)

    def op(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """forward as a closure over this layer's tensors (no nn.Module dispatch; LayerOps)."""
        return functools.partial(_quantized_forward, self.matmul_kernel(), self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class BF16Linear(QuantizedLinear):
    """Weights stored in bf16 (half the bytes of fp32), matmul in bf16."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__(weight.shape[1], weight.shape[0], bias)
        self.register_buffer("weight", weight.detach().to(COMPUTE_DTYPE).contiguous())

    def matmul_kernel(self) -> Callable[[torch.Tensor], torch.Tensor]:
        return dense_kernel(self.weight, None)

    def dequantized_weight(self) -> torch.Tensor:
        return self.weight.float()


class Int8Linear(QuantizedLinear):
    """int8 weight-only, one scale per output channel (torch's _weight_int8pack_mm)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__(weight.shape[1], weight.shape[0], bias)
        q, scales = quantize_int8(weight.detach().float())
        # torch's kernel crashes (segfault) when the input width is not a multiple of 8 (stories260K's
        # 172-wide down_proj): such weights get zero columns, and inputs zeros, which adds nothing.
        self.pad = -self.in_features % 8
        self.register_buffer("weight", F.pad(q, (0, self.pad)).contiguous())  # [out, in + pad] int8
        self.register_buffer("scales", scales.to(COMPUTE_DTYPE))  # [out]

    def matmul_kernel(self) -> Callable[[torch.Tensor], torch.Tensor]:
        op, weight, scales, pad = torch.ops.aten._weight_int8pack_mm, self.weight, self.scales, self.pad
        if pad:
            return lambda x: op(F.pad(x, (0, pad)), weight, scales)
        return lambda x: op(x, weight, scales)

    def dequantized_weight(self) -> torch.Tensor:
        return self.weight[:, : self.in_features].float() * self.scales.float()[:, None]


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """q uint8 [N, K] in 0..15 -> speclm's int4 kernel layout [N/16, K/8, 64] (int_matmul.cpp:
    per 16 outputs and 8 inputs, byte 32h + 2l + e holds q[l, 4h + e] low and q[l, 4h + 2 + e] high)."""
    n, k = q.shape
    v = q.view(n // 16, 16, k // 8, 2, 2, 2).permute(0, 2, 3, 1, 5, 4)  # [blocks, octets, h, l, e, nibble]
    return (v[..., 0] | (v[..., 1] << 4)).reshape(n // 16, k // 8, 64).contiguous()


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """pack_int4's inverse: [N/16, K/8, 64] -> q uint8 [N, K]."""
    blocks, octets, _ = packed.shape
    v = packed.view(blocks, octets, 2, 16, 2)  # [blocks, octets, h, l, e]
    q = torch.stack([v & 0x0F, v >> 4], dim=-1)  # [..., e, nibble]
    return q.permute(0, 3, 1, 2, 5, 4).reshape(blocks * 16, octets * 8)


def int4_kernels(device: torch.device) -> ModuleType | None:
    """speclm's compiled kernels when their int4 matmul runs here (CPU with AVX-512 BF16 or AVX2), else None."""
    if device.type != "cpu":
        return None
    kernels = cpu_kernels()
    return kernels if kernels is not None and kernels.int4_available() else None


class Int4Linear(QuantizedLinear):
    """int4 weight-only, asymmetric per group of inputs: W = (q - 8) * scale + zero per group.

    Runs speclm's kernel (exact products with the bf16 activations, summed in fp32, rows independent of
    each other; AVX-512 BF16 or AVX2) where it was compiled, else torch's _weight_int4pack_mm_for_cpu;
    `layout` says which packing `weight` holds. Both compute on the same grid (scales_and_zeros in torch's layout)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, group_size: int = 32) -> None:
        super().__init__(weight.shape[1], weight.shape[0], bias)
        if self.out_features % 16:
            raise ValueError(
                f"int4 needs a layer's output size to be a multiple of 16 (torch's int4 packing); "
                f"got {self.out_features}: use --weights int8 or bf16 for this model"
            )
        self.group_size = group_size
        q, scales, mins = quantize_int4(weight.detach().float(), group_size)
        zeros = mins + 8 * scales  # the kernels compute (q - 8) * scale + zero
        self.layout = "speclm" if int4_kernels(weight.device) is not None else "torch"
        pairs = torch.stack([scales, zeros], dim=-1).to(COMPUTE_DTYPE)  # [out, in/group, 2]
        if self.layout == "speclm":
            self.register_buffer("weight", pack_int4(q))
            # [out/16, in/group, 16, 2]: one output block's pairs in one stream (int_matmul.cpp)
            pairs = pairs.view(self.out_features // 16, 16, -1, 2).transpose(1, 2)
        else:
            self.register_buffer("weight", torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1))
            pairs = pairs.transpose(0, 1)  # [in/group, out, 2]: torch's kernel's layout
        self.register_buffer("scales_and_zeros", pairs.contiguous())

    def matmul_kernel(self) -> Callable[[torch.Tensor], torch.Tensor]:
        weight, group_size, scales_and_zeros = self.weight, self.group_size, self.scales_and_zeros
        if self.layout == "speclm":
            op = int4_kernels(self.weight.device).int4_matmul  # looked up, not stored: modules stay copyable
        else:
            op = torch.ops.aten._weight_int4pack_mm_for_cpu
        return lambda x: op(x, weight, group_size, scales_and_zeros)

    def group_scales_and_zeros(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(scale, zero) per output and group of inputs, fp32 [out, in/group] each, whatever the layout."""
        pairs = self.scales_and_zeros.float()
        if self.layout == "speclm":
            pairs = pairs.transpose(1, 2).reshape(self.out_features, -1, 2)
        else:
            pairs = pairs.transpose(0, 1)
        return pairs[..., 0], pairs[..., 1]

    def dequantized_weight(self) -> torch.Tensor:
        if self.layout == "speclm":
            q = unpack_int4(self.weight).float() - 8
            scale, zero = (t.repeat_interleave(self.group_size, dim=1) for t in self.group_scales_and_zeros())
            return q * scale + zero
        # The kernel's fp32 path on the identity: exactly the stored grid, without re-deriving the packing.
        eye = torch.eye(self.in_features)
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(
            eye, self.weight, self.group_size, self.scales_and_zeros.float()
        )
        return out.t().contiguous()
